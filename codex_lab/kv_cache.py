"""Key/value caches for autoregressive decoding.

The model talks to a cache through one method, ``update(k, v, positions)``: it stores the
new keys/values of this step and returns every key/value the step may attend to, plus the
position of each key (``-1`` marks an empty slot, which the mask then hides). Lesson 06
adds a preallocated static cache and a rolling window buffer with the same interface.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class LayerCache(Protocol):
    """What one attention layer needs from a cache."""

    def update(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store ``k``, ``v`` (B, H_kv, T, D) at ``positions`` (B, T); return all keys
        (B, H_kv, S, D), values (B, H_kv, S, D) and key positions (B, S)."""
        ...


class DynamicKVCache:
    """The simplest cache: concatenate each step's keys/values (grows by re-allocation).

    Plain and obviously correct; the reference that faster caches are tested against.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (B, H_kv, S, D)
        self.v: Tensor | None = None  # (B, H_kv, S, D)
        self.pos: Tensor | None = None  # (B, S)

    def update(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.k is None:
            self.k, self.v, self.pos = k, v, positions
        else:
            assert self.v is not None and self.pos is not None
            self.k = torch.cat([self.k, k], dim=2)  # (B, H_kv, S + T, D)
            self.v = torch.cat([self.v, v], dim=2)  # (B, H_kv, S + T, D)
            self.pos = torch.cat([self.pos, positions], dim=1)  # (B, S + T)
        return self.k, self.v, self.pos

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return 0 if self.k is None else self.k.shape[2]

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        if self.k is None or self.v is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def make_dynamic_caches(n_layer: int) -> list[DynamicKVCache]:
    """One :class:`DynamicKVCache` per layer."""
    return [DynamicKVCache() for _ in range(n_layer)]
