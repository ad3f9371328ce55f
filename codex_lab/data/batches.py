"""Token streams for language-model training: documents joined by end-of-text, cut into
random windows for training and fixed, evenly spaced windows for validation."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import Tensor

from codex_lab.data.tokenizer import CodeTokenizer

DEFAULT_CHUNK_CHARS = 4_000_000  # characters encoded per group (~1M tokens of Python lists at a time)


def iter_token_chunks(
    tokenizer: CodeTokenizer, texts: Iterable[str], chunk_chars: int = DEFAULT_CHUNK_CHARS
) -> Iterator[Tensor]:
    """Token ids of ``texts`` in chunks: 1-D int64 tensors, each document followed by ``<|endoftext|>``.

    Texts are encoded in groups of about ``chunk_chars`` characters, so the Python lists the
    tokenizer returns (~36 bytes per token) exist for one group at a time; each group is turned
    into a compact tensor (8 bytes per token) before the next is encoded. Peak memory is the
    output plus O(chunk_chars), whatever the total size.
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be positive, got {chunk_chars}")
    eot = tokenizer.eot_id
    group: list[str] = []
    size = 0

    def flush() -> Tensor:
        encoded = tokenizer.encode_batch(group)
        n = sum(len(ids) + 1 for ids in encoded)  # +1: the end-of-text after each document
        out = torch.empty(n, dtype=torch.long)  # (n,)
        pos = 0
        for ids in encoded:
            out[pos : pos + len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            out[pos + len(ids)] = eot
            pos += len(ids) + 1
        return out

    for text in texts:
        group.append(text)
        size += len(text)
        if size >= chunk_chars:
            yield flush()
            group, size = [], 0
    if group:
        yield flush()


def tokenize_texts(tokenizer: CodeTokenizer, texts: Iterable[str], chunk_chars: int = DEFAULT_CHUNK_CHARS) -> Tensor:
    """All texts as one 1-D int64 tensor, each document followed by ``<|endoftext|>``.

    Streams: texts are encoded ``chunk_chars`` characters at a time (:func:`iter_token_chunks`),
    so memory stays near the size of the result instead of ~5x it.
    """
    chunks = list(iter_token_chunks(tokenizer, texts, chunk_chars))
    if not chunks:
        return torch.empty(0, dtype=torch.long)
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)  # (N,)


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
