"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import torch
from torch import Tensor


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits per row, set the rest to -inf. logits: (B, V)."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of tokens whose probability mass reaches p (nucleus sampling).

    The most likely token is always kept. logits: (B, V).
    """
    if p >= 1.0:
        return logits
    if p <= 0.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    # drop token i when the mass strictly before it already reaches p: cumsum_i - p_i >= p
    drop = probs.cumsum(dim=-1) - probs >= p  # (B, V)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row. logits (B, V) -> ids (B,).

    temperature 0 means greedy (argmax); otherwise softmax(logits / temperature) after the
    top-k and top-p filters, sampled with ``generator`` (same seed, same tokens).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = top_p_filter(top_k_filter(logits.float() / temperature, top_k), top_p)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if generator is not None and generator.device != probs.device:
        probs = probs.cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)
