"""Key/value caches for autoregressive decoding.

The model talks to a cache through one method, ``update(k, v, positions)``: it stores the
new keys/values of this step and returns every key/value the step may attend to, plus the
position of each key (``-1`` marks an empty slot, which the mask then hides).

- :class:`DynamicKVCache`: concatenates (the plain reference);
- :class:`StaticKVCache`: preallocated, slot = position, ``truncate`` rolls back (lesson 06);
- :class:`RollingWindowCache`: a sliding-window layer keeps only its window (Mistral);
- :class:`PagedKVPool`: fixed-size blocks + per-request block tables, used by
  :class:`~codex_lab.infer.engine.loop.Engine` (PagedAttention-style).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:  # no runtime import: model.py imports this module
    from codex_lab.nn.config import ModelConfig


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


# ---------------------------------------------------------------------------------------
# Lesson 06: preallocated caches (no re-allocation while decoding).
# ---------------------------------------------------------------------------------------


class StaticKVCache:
    """A preallocated cache for one layer: slot ``p`` holds the key/value of position ``p``.

    Buffers are (B, H_kv, max_len, D), allocated once (gpt-fast style), so decoding never
    re-allocates. ``update`` returns views of the first ``length`` slots (no copy); slots
    not written yet carry position -1 and are masked by the model.

    Args:
        batch_size: rows B.
        n_kv_head: key/value heads H_kv (GQA keeps fewer heads, so a smaller cache).
        head_dim: width D of one head.
        max_len: slots per row (the longest sequence this cache can hold), in tokens.
        device, dtype: where and how the buffers live.
    """

    def __init__(
        self, batch_size: int, n_kv_head: int, head_dim: int, max_len: int, *,
        device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, H_kv, L, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # (B, H_kv, L, D)
        self.pos = torch.full((batch_size, max_len), -1, dtype=torch.long, device=device)  # (B, L)
        self.max_len = max_len
        self.length = 0  # slots 0 .. length-1 may hold keys

    def update(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k``, ``v`` (B, H_kv, T, D) into the slots ``positions`` (B, T); return the
        filled prefix: keys/values (B, H_kv, S, D) and key positions (B, S), S = ``length``."""
        B, _, T, _ = k.shape
        if B != self.k.shape[0]:
            raise ValueError(f"cache holds {self.k.shape[0]} rows but the step has {B}; build it with batch_size={B}")
        top = int(positions.max()) + 1
        if top > self.max_len or int(positions.min()) < 0:
            raise ValueError(f"positions must lie in 0..{self.max_len - 1}; build the cache with a larger max_len")
        rows = torch.arange(B, device=k.device)[:, None].expand(B, T)  # (B, T)
        # slot index = absolute position; advanced indices first: value is (B, T, H_kv, D)
        self.k[rows, :, positions] = k.transpose(1, 2).to(self.k.dtype)
        self.v[rows, :, positions] = v.transpose(1, 2).to(self.v.dtype)
        self.pos[rows, positions] = positions
        self.length = max(self.length, top)
        S = self.length
        return self.k[:, :, :S], self.v[:, :, :S], self.pos[:, :S]

    def truncate(self, length: int) -> None:
        """Forget every slot at position >= ``length`` (speculative decoding's rollback)."""
        if not 0 <= length <= self.max_len:
            raise ValueError(f"length must be in 0..{self.max_len}, got {length}")
        self.pos[:, length:] = -1
        self.length = min(self.length, length)

    def reset(self) -> None:
        """Empty the cache (buffers stay allocated)."""
        self.truncate(0)

    def nbytes(self) -> int:
        """Bytes allocated for keys and values (the whole preallocated buffer)."""
        return 2 * self.k.numel() * self.k.element_size()


class RollingWindowCache:
    """A rolling buffer for a sliding-window layer (Mistral): only the last ``window`` keys.

    Position ``p`` lives in slot ``p % window``, so memory stays (B, H_kv, window, D) however
    long the sequence grows. A multi-token step (prefill) attends to the buffer *before*
    the write concatenated with its own new keys, so no key that a query of the step needs
    is overwritten first; then the last ``window`` new keys are written.

    Args: as :class:`StaticKVCache`, with ``window`` (the layer's window, in tokens) in
    place of ``max_len``.
    """

    def __init__(
        self, batch_size: int, n_kv_head: int, head_dim: int, window: int, *,
        device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        shape = (batch_size, n_kv_head, window, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, H_kv, W, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # (B, H_kv, W, D)
        self.pos = torch.full((batch_size, window), -1, dtype=torch.long, device=device)  # (B, W)
        self.window = window
        self.length = 0  # positions seen so far (next position to write), not slots in use

    def update(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store ``k``, ``v`` (B, H_kv, T, D) at ``positions`` (B, T); return keys/values
        (B, H_kv, S, D) and positions (B, S), S = window (T = 1) or window + T (T > 1)."""
        B, _, T, _ = k.shape
        if T > 1:
            # attend to the old buffer + this step's keys; write afterwards
            k_all = torch.cat([self.k, k.to(self.k.dtype)], dim=2)  # (B, H_kv, W + T, D)
            v_all = torch.cat([self.v, v.to(self.v.dtype)], dim=2)  # (B, H_kv, W + T, D)
            pos_all = torch.cat([self.pos, positions], dim=1)  # (B, W + T)
        keep = positions[:, -self.window :]  # (B, min(T, W)) the newest keys survive
        n = keep.shape[1]
        rows = torch.arange(B, device=k.device)[:, None].expand(B, n)  # (B, n)
        # slot = position mod window
        slots = keep % self.window  # (B, n)
        self.k[rows, :, slots] = k[:, :, -n:].transpose(1, 2).to(self.k.dtype)
        self.v[rows, :, slots] = v[:, :, -n:].transpose(1, 2).to(self.v.dtype)
        self.pos[rows, slots] = keep
        self.length = max(self.length, int(positions.max()) + 1)
        if T > 1:
            return k_all, v_all, pos_all
        return self.k, self.v, self.pos

    def reset(self) -> None:
        """Empty the buffer."""
        self.pos.fill_(-1)
        self.length = 0

    def nbytes(self) -> int:
        """Bytes allocated for keys and values."""
        return 2 * self.k.numel() * self.k.element_size()


def make_static_caches(
    cfg: "ModelConfig", batch_size: int, max_len: int | None = None, *, rolling: bool = True,
    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
) -> list[StaticKVCache | RollingWindowCache]:
    """One preallocated cache per layer of a model with config ``cfg``.

    Sliding-window layers (pattern :class:`~codex_lab.nn.patterns.LocalWindow`) get a
    :class:`RollingWindowCache` of their window when ``rolling`` (and the window is shorter
    than ``max_len``); every other layer a :class:`StaticKVCache` of ``max_len`` slots
    (default ``cfg.max_seq_len``). Caches that must roll back (speculative decoding) need
    ``rolling=False``.
    """
    from codex_lab.nn.patterns import LocalWindow, parse_pattern

    assert cfg.n_kv_head is not None
    L = cfg.max_seq_len if max_len is None else max_len
    caches: list[StaticKVCache | RollingWindowCache] = []
    for i in range(cfg.n_layer):
        pat = parse_pattern(cfg.pattern_for(i))
        if rolling and isinstance(pat, LocalWindow) and pat.window < L:
            caches.append(RollingWindowCache(batch_size, cfg.n_kv_head, cfg.head_dim, pat.window, device=device, dtype=dtype))
        else:
            caches.append(StaticKVCache(batch_size, cfg.n_kv_head, cfg.head_dim, L, device=device, dtype=dtype))
    return caches


# ---------------------------------------------------------------------------------------
# Paged KV memory (PagedAttention-style): fixed-size blocks shared by many requests.
# ---------------------------------------------------------------------------------------


class PagedKVPool:
    """KV memory for every layer cut into fixed-size blocks, handed out to requests.

    Storage is one (n_blocks, block_size, H_kv, D) tensor per layer for keys (``k[layer]``)
    and the same for values: separate tensors, so a compiled step writes a layer's blocks in
    place (a write into a slice of one (n_layer, ...) tensor makes torch.compile copy the
    whole layer, every step).
    A request owns a *block table*: the list of its block ids, block ``j`` holding its
    positions ``j * block_size .. (j + 1) * block_size - 1``. Memory in use grows by one
    block at a time and returns to the pool the moment a request ends.

    Args:
        n_layer, n_kv_head, head_dim: the model's shape (``codex_lab.nn.accounting.kv_bytes_per_token`` per token).
        n_blocks: blocks in the pool; capacity = n_blocks * block_size tokens.
        block_size: tokens per block.
        device, dtype: where and how the storage lives.
    """

    def __init__(
        self, n_layer: int, n_kv_head: int, head_dim: int, n_blocks: int, block_size: int = 16, *,
        device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
    ) -> None:
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"need n_blocks >= 1 and block_size >= 1, got {n_blocks}, {block_size}")
        # token-major blocks: a gathered block table reshapes to (B, S, H_kv, D) without a copy
        shape = (n_blocks, block_size, n_kv_head, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]  # L x (N, bs, H_kv, D)
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]  # L x (N, bs, H_kv, D)
        self.n_blocks, self.block_size, self.n_layer = n_blocks, block_size, n_layer
        self._free: list[int] = list(range(n_blocks - 1, -1, -1))  # a stack: pop() gives 0, 1, ...

    @property
    def n_free(self) -> int:
        """Blocks not owned by any request."""
        return len(self._free)

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks needed to hold ``n_tokens`` tokens: ceil(n_tokens / block_size)."""
        return -(-n_tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks; MemoryError (nothing taken) when fewer are free."""
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV blocks but only {len(self._free)} are free")
        return [self._free.pop() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        """Give blocks back to the pool."""
        self._free.extend(reversed(blocks))

    def bytes_per_token(self) -> int:
        """Bytes of K and V that one token takes across all layers."""
        return 2 * self.n_layer * self.k[0].shape[2] * self.k[0].shape[3] * self.k[0].element_size()

    def views(self, block_tables: Tensor, *, one_query: bool = False) -> list["PagedLayerView"]:
        """One cache object per layer for a batched step whose rows own ``block_tables`` (B, NB).
        ``one_query``: a step of one token per row asks the attention for
        :func:`~codex_lab.nn.attention.one_query_attention` (the compiled CPU steps)."""
        return [PagedLayerView(self, i, block_tables, one_query=one_query) for i in range(self.n_layer)]


class PagedLayerView:
    """The ``update`` interface over one layer of a :class:`PagedKVPool` for one step.

    Writes the step's keys/values into each row's blocks, then gathers each row's blocks
    into a contiguous (B, H_kv, NB * block_size, D) tensor; slots past a row's last written
    position get position -1 (masked). ``block_tables`` (B, NB) must cover every position
    of the step; rows with fewer blocks are padded with any block id. ``one_query``: the
    attention of a one-token-per-row step over this view may use
    :func:`~codex_lab.nn.attention.one_query_attention` instead of SDPA (equal outputs; the
    model's attention reads this flag).
    """

    def __init__(self, pool: PagedKVPool, layer: int, block_tables: Tensor, *, one_query: bool = False) -> None:
        self.pool, self.layer, self.tables = pool, layer, block_tables
        self.one_query = one_query

    def update(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store ``k``, ``v`` (B, H_kv, T, D) at ``positions`` (B, T); return all of each row's
        keys/values (B, H_kv, S, D) and positions (B, S), S = NB * block_size."""
        bs = self.pool.block_size
        B, H, T, D = k.shape
        pk, pv = self.pool.k[self.layer], self.pool.v[self.layer]  # (N, bs, H_kv, D)
        # block of position p = table[p // bs]; offset inside it = p % bs
        blocks = self.tables.gather(1, positions // bs)  # (B, T)
        offs = positions % bs  # (B, T)
        pk[blocks, offs] = k.transpose(1, 2).to(pk.dtype)  # value (B, T, H_kv, D)
        pv[blocks, offs] = v.transpose(1, 2).to(pv.dtype)
        NB = self.tables.shape[1]
        # one gather copy: (B, NB, bs, H, D) -> (B, S, H, D) is a free reshape -> (B, H, S, D) view
        k_all = pk[self.tables].view(B, NB * bs, H, D).transpose(1, 2)  # (B, H_kv, S, D)
        v_all = pv[self.tables].view(B, NB * bs, H, D).transpose(1, 2)  # (B, H_kv, S, D)
        slot = torch.arange(NB * bs, device=k.device)[None, :]  # (1, S)
        # a slot is filled when it is at or before the row's newest position
        filled = slot <= positions.max(dim=1, keepdim=True).values  # (B, S)
        k_pos = torch.where(filled, slot, torch.full_like(slot, -1))  # (B, S)
        return k_all, v_all, k_pos
