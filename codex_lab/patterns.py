"""Attention patterns: which keys each query may attend to.

A pattern answers ``allowed(q_pos, k_pos)`` for broadcastable integer position tensors;
causality is always part of the answer (``k_pos <= q_pos``). Working from positions (not
from a fixed N x N mask) lets the same pattern serve training, a KV cache whose keys sit
at arbitrary positions, and a rolling window buffer.

Lesson 02 extends this module with strided, fixed, global and block-granular patterns.
Specs are strings so they fit in a JSON config: ``"dense"``, ``"window:128"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AttentionPattern:
    """Base class: the dense causal pattern."""

    @property
    def spec(self) -> str:
        """The string that :func:`parse_pattern` turns back into this pattern."""
        return "dense"

    @property
    def is_dense(self) -> bool:
        """True when the pattern is plain causal attention."""
        return True

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Boolean tensor: may the query at ``q_pos`` attend to the key at ``k_pos``?"""
        return k_pos <= q_pos

    def mask(self, n: int, device: torch.device | str | None = None) -> Tensor:
        """The (n, n) boolean mask for a sequence of length n starting at position 0."""
        pos = torch.arange(n, device=device)
        return self.allowed(pos[:, None], pos[None, :])


Dense = AttentionPattern


@dataclass(frozen=True)
class LocalWindow(AttentionPattern):
    """Sliding window: each query sees itself and the ``window - 1`` keys before it."""

    window: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    @property
    def spec(self) -> str:
        return f"window:{self.window}"

    @property
    def is_dense(self) -> bool:
        return False

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # causal and within the window: 0 <= q - k < w
        return (k_pos <= q_pos) & (q_pos - k_pos < self.window)


def parse_pattern(spec: str | AttentionPattern) -> AttentionPattern:
    """Turn a spec string (``"dense"``, ``"window:128"``) into a pattern object."""
    if isinstance(spec, AttentionPattern):
        return spec
    s = spec.strip().lower()
    if s in ("dense", "causal", "full"):
        return AttentionPattern()
    kind, _, arg = s.partition(":")
    if kind == "window" and arg.isdigit():
        return LocalWindow(int(arg))
    raise ValueError(f"unknown attention pattern spec {spec!r}; try 'dense' or 'window:128'")
