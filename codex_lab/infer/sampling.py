"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus).

:class:`SamplingParams` is the one description of how a request is decoded, shared by
:func:`codex_lab.generate`, the engine and the server protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

# temperatures below this are greedy: logits / 1e-38 overflow float32 to inf and softmax gives NaN
GREEDY_BELOW = 1e-6


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
    drop[..., 0] = False  # the most likely token stays even when p rounds to 0 in float32 (p = 5e-324)
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

    temperature below ``GREEDY_BELOW`` (1e-6, 0 included) means greedy (argmax); otherwise
    softmax(logits / temperature) after the top-k and top-p filters, sampled with
    ``generator`` (same seed, same tokens).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature < GREEDY_BELOW:
        return logits.argmax(dim=-1)
    logits = top_p_filter(top_k_filter(logits.float() / temperature, top_k), top_p)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if generator is not None and generator.device != probs.device:
        probs = probs.cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


@dataclass
class SamplingParams:
    """How one request is decoded.

    Args:
        max_tokens: most tokens to generate (>= 1).
        temperature: 0 = greedy; otherwise softmax(logits / temperature) is sampled.
        top_k: keep the k most likely tokens (0 = all).
        top_p: keep the smallest set with probability mass >= top_p (1 = all).
        stop: strings that end the generation; the text is cut before the first one.
        seed: per-request random seed (same seed, same output); None = global RNG.
        ignore_eos: keep generating past end-of-text (benchmarks: exactly max_tokens tokens).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no limit), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


def params_from(
    params: SamplingParams | None,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> SamplingParams:
    """``params`` itself, or the :class:`SamplingParams` the keyword arguments describe.

    Lets a generator take one ``SamplingParams`` while the older keyword form keeps working
    (``max_new_tokens`` is the keyword name of ``max_tokens``). Given both, ``params`` wins.
    """
    if params is not None:
        return params
    return SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                          stop=list(stop), seed=seed)
