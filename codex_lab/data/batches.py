"""Token streams for language-model training: documents joined by end-of-text, cut into
random windows for training and fixed, evenly spaced windows for validation."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from codex_lab.data.tokenizer import CodeTokenizer


def tokenize_texts(tokenizer: CodeTokenizer, texts: Sequence[str]) -> Tensor:
    """All texts as one 1-D int64 tensor, each document followed by ``<|endoftext|>``."""
    ids: list[int] = []
    for doc in tokenizer.encode_batch(list(texts)):
        ids.extend(doc)
        ids.append(tokenizer.eot_id)
    return torch.tensor(ids, dtype=torch.long)


def random_batch(tokens: Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows: x (B, T) and next-token targets y (B, T)."""
    if tokens.numel() < seq_len + 2:
        raise ValueError(f"only {tokens.numel()} tokens, need more than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch_size,), generator=generator)
    x = torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])  # (B, T)
    y = torch.stack([tokens[s + 1 : s + 1 + seq_len] for s in starts.tolist()])  # (B, T)
    return x, y


def fixed_batches(tokens: Tensor, batch_size: int, seq_len: int, n_batches: int) -> list[tuple[Tensor, Tensor]]:
    """``n_batches`` deterministic batches of evenly spaced windows (validation)."""
    n_windows = batch_size * n_batches
    span = tokens.numel() - seq_len - 1
    if span < 1:
        raise ValueError(f"only {tokens.numel()} validation tokens, need more than {seq_len + 1}")
    starts = torch.linspace(0, span - 1, n_windows).long().tolist()
    out = []
    for b in range(n_batches):
        s = starts[b * batch_size : (b + 1) * batch_size]
        x = torch.stack([tokens[i : i + seq_len] for i in s])  # (B, T)
        y = torch.stack([tokens[i + 1 : i + 1 + seq_len] for i in s])  # (B, T)
        out.append((x, y))
    return out
