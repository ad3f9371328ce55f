"""Sparse attention kernels behind one function, :func:`sparse_attention`.

Three implementations that tests hold equal:

- ``"reference"``: dense scores + the pattern's (N, N) mask. Obviously correct, O(N^2)
  time and memory whatever the pattern.
- ``"blocks"``: plain PyTorch block-sparse attention. The sequence is cut into tiles of
  ``block`` tokens; only the tiles the pattern touches (``pattern.tiles``) are computed,
  with the pattern's mask inside each tile. Query blocks that touch the same number of
  key tiles are batched together, so the work is the touched tiles and nothing else.
  Ordinary autograd ops: sparse layers train on CPU through it.
- ``"flex"``: torch FlexAttention with a BlockMask, compiled (it skips empty blocks).
  Inference only on CPU (torch has no CPU backward for it): with gradients required it
  falls back to ``"blocks"`` with a warning that says so.
- ``"fast"``: the same tiles, split into unmasked and masked ones and merged through
  log-sum-exp, forward and backward on the fused CPU flash kernel
  (:mod:`codex_lab.nn.sparse_fast`); ``"blocks"`` on other devices.

A fully masked query row returns zeros, never NaN, in every implementation.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from codex_lab.nn.attention import attention_reference, register_attention_impl
from codex_lab.nn.moba import moba_attention
from codex_lab.nn.patterns import AttentionPattern, MoBA, parse_pattern

IMPLS = ("reference", "blocks", "flex", "fast")
DEFAULT_BLOCK = 128


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, N, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    B, H, N, D = q.shape
    if k.shape[0] != B or k.shape[2] != N or k.shape[3] != D:
        raise ValueError(f"k/v {tuple(k.shape)} must be (B={B}, H_kv, N={N}, D={D}) for q {tuple(q.shape)}")
    if H % k.shape[1]:
        raise ValueError(f"H_kv={k.shape[1]} must divide H={H} (grouped-query attention)")


def _reference(q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern) -> Tensor:
    """Dense scores, pattern mask, softmax: (B, H, N, D)."""
    mask = pattern.mask(q.shape[2], device=q.device)[None, None]  # (1, 1, N, N)
    return attention_reference(q, k, v, mask)


def _tiles_explicit(qs: Tensor, ks: Tensor, vs: Tensor, grp: "_TileGroup") -> Tensor:
    """Explicit softmax over gathered tiles (used when some query row has no key at all).

    qs (B, Hkv, R, g*bs, D) already scaled, ks/vs (B, Hkv, R, m*bs, D) -> (B, Hkv, R, g*bs, D).
    """
    scores = qs @ ks.transpose(-2, -1)  # (B, Hkv, R, g*bs, m*bs)
    # masked entries get the most negative finite float: exp underflows to exactly 0, and
    # a fully masked row stays finite (no NaN forward or backward); it is zeroed below
    scores = scores.masked_fill(~grp.allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)  # (B, Hkv, R, g*bs, m*bs)
    probs = probs * grp.row_ok  # (R, g*bs, 1): rows with no allowed key -> 0
    return probs @ vs  # (B, Hkv, R, g*bs, D)


def _blocks(q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern, block: int) -> Tensor:
    """Block-sparse attention over the touched tiles only: (B, H, N, D)."""
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    g = H // Hkv
    nb = -(-N // block)
    pad = nb * block - N
    scale = 1.0 / math.sqrt(D)
    if pad:
        q = torch.nn.functional.pad(q, (0, 0, 0, pad))  # (B, H, nb*bs, D)
        k = torch.nn.functional.pad(k, (0, 0, 0, pad))  # (B, Hkv, nb*bs, D)
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))  # (B, Hkv, nb*bs, D)
    # query heads that share a K/V head are stacked along the rows of each tile, so one
    # (g*bs, m*bs) matmul serves the whole group: (B, Hkv, nb, g*bs, D)
    qb = q.reshape(B, Hkv, g, nb, block, D).transpose(2, 3).reshape(B, Hkv, nb, g * block, D)
    kb = k.reshape(B, Hkv, nb, block, D)  # (B, Hkv, nb, bs, D)
    vb = v.reshape(B, Hkv, nb, block, D)  # (B, Hkv, nb, bs, D)
    outs, order = [], []
    for grp in _tile_plan(pattern, N, block, g, str(q.device), q.dtype):
        R, m = grp.cols.shape
        if grp.contiguous:
            qs = qb[:, :, grp.first : grp.first + R]  # (B, Hkv, R, g*bs, D)
        else:
            qs = qb.index_select(2, grp.rows)  # (B, Hkv, R, g*bs, D)
        flat = grp.cols.flatten()  # (R*m,)
        ks = kb.index_select(2, flat).view(B, Hkv, R, m * block, D)  # (B, Hkv, R, m*bs, D)
        vs = vb.index_select(2, flat).view(B, Hkv, R, m * block, D)  # (B, Hkv, R, m*bs, D)
        if grp.row_ok is None:
            # every row has a key: PyTorch's fused attention on the gathered tiles, with the
            # in-tile mask as an additive bias (0 = attend, -inf = not)
            # 4-D q/k/v (B*Hkv, R, rows, D) and a 4-D additive mask (1, R, g*bs, m*bs): only then
            # does torch pick its fused kernel over the slow math path; scores = q k^T / sqrt(D)
            o = F.scaled_dot_product_attention(
                qs.reshape(B * Hkv, R, g * block, D), ks.reshape(B * Hkv, R, m * block, D),
                vs.reshape(B * Hkv, R, m * block, D), attn_mask=grp.bias, scale=scale,
            )  # (B*Hkv, R, g*bs, D)
            outs.append(o.view(B, Hkv, R, g * block, D))
        else:
            outs.append(_tiles_explicit(qs * scale, ks, vs, grp))  # (B, Hkv, R, g*bs, D)
        order.append(grp.rows)
    if not outs:
        return q.new_zeros(B, H, N, D)
    out = torch.cat(outs, dim=2)  # (B, Hkv, nb', g*bs, D) in plan order
    rows = torch.cat(order)  # (nb',) query block of each slot
    if rows.numel() < nb or not bool((rows == torch.arange(nb, device=rows.device)).all()):
        full = out.new_zeros(B, Hkv, nb, g * block, D)
        out = full.index_copy(2, rows, out)  # (B, Hkv, nb, g*bs, D)
    out = out.view(B, Hkv, nb, g, block, D).transpose(2, 3)  # (B, Hkv, g, nb, bs, D)
    return out.reshape(B, H, nb * block, D)[:, :, :N]  # (B, H, N, D)


@dataclass(frozen=True)
class _TileGroup:
    """Query blocks that each touch ``m`` key tiles: rows (R,), cols (R, m), the in-tile
    mask ``allowed`` (R, g*bs, m*bs) (rows repeated for the g stacked query heads) or None
    when every pair is allowed, and ``row_ok`` (R, g*bs, 1), the rows that have at least
    one key, or None when all do. ``bias`` is ``allowed`` as the additive float mask
    (1, R, g*bs, m*bs) (0 = attend, -inf = not) that the fused kernel takes, built once."""

    rows: Tensor
    cols: Tensor
    first: int
    contiguous: bool
    allowed: Tensor | None
    row_ok: Tensor | None
    bias: Tensor | None


@lru_cache(maxsize=64)
def _tile_plan(pattern: AttentionPattern, n: int, block: int, g: int, device: str, dtype: torch.dtype) -> tuple[_TileGroup, ...]:
    """Query blocks grouped by how many key tiles they touch, with their in-tile masks.
    Cached per (pattern, n, block, g, device, dtype): the kernel's per-call work is the tiles only."""
    tiles = pattern.tiles(n, block)  # (nb, nb)
    nb = tiles.shape[0]
    pos = torch.arange(nb * block).view(nb, block)  # (nb, bs)
    groups: dict[int, tuple[list[int], list[list[int]]]] = {}
    for i in range(nb):
        cols = torch.nonzero(tiles[i]).flatten().tolist()
        if not cols:
            continue  # a query block with no key at all: its output stays zero
        rows, cl = groups.setdefault(len(cols), ([], []))
        rows.append(i)
        cl.append(cols)
    plan = []
    for rows, cl in groups.values():
        rows_t, cols_t = torch.tensor(rows), torch.tensor(cl)  # (R,), (R, m)
        R, m = cols_t.shape
        q_pos = pos[rows_t]  # (R, bs)
        k_pos = pos[cols_t].reshape(R, m * block)  # (R, m*bs)
        # allowed[r, i, j] = pattern(q_i, k_j) and k_j < N
        allowed = pattern.allowed(q_pos[:, :, None], k_pos[:, None, :]) & (k_pos < n)[:, None, :]  # (R, bs, m*bs)
        allowed = allowed.repeat(1, g, 1)  # (R, g*bs, m*bs): same mask for each stacked head
        row_ok = allowed.any(-1, keepdim=True)  # (R, g*bs, 1)
        plan.append(_TileGroup(
            rows=rows_t.to(device), cols=cols_t.to(device), first=rows[0],
            contiguous=rows == list(range(rows[0], rows[0] + R)),
            allowed=None if bool(allowed.all()) else allowed.to(device),
            row_ok=None if bool(row_ok.all()) else row_ok.to(device),
            # bias = 0 where allowed, -inf elsewhere (only used when every row has a key)
            bias=None if bool(allowed.all()) else torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))[None].to(device),
        ))
    return tuple(plan)


def tiles_computed(pattern: AttentionPattern | str, n: int, block: int = DEFAULT_BLOCK) -> int:
    """Number of (query block, key block) tiles the ``"blocks"`` kernel computes."""
    return int(parse_pattern(pattern).tiles(n, block).sum())


# ---------------------------------------------------------------------------------------
# FlexAttention
# ---------------------------------------------------------------------------------------


def flex_available() -> tuple[bool, str]:
    """(True, "") when this torch has FlexAttention, else (False, the reason)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError as exc:  # pragma: no cover - torch < 2.5
        return False, f"torch {torch.__version__} has no FlexAttention ({exc}); upgrade to torch >= 2.5"
    return True, ""


@lru_cache(maxsize=1)
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=32)
def flex_block_mask(pattern: AttentionPattern, n: int, device: str, block: int = DEFAULT_BLOCK) -> Any:
    """The FlexAttention BlockMask of ``pattern`` for length n (cached; built compiled so
    its memory stays small at large n)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return pattern.allowed(q_idx, kv_idx)

    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=n, device=device, BLOCK_SIZE=block, _compile=True)


def _flex(q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern, block: int) -> Tensor:
    ok, why = flex_available()
    if not ok:
        warnings.warn(f"flex unavailable, using 'blocks': {why}", stacklevel=3)
        return _blocks(q, k, v, pattern, block)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if needs_grad and q.device.type == "cpu":
        warnings.warn(
            "FlexAttention has no backward on CPU in this torch; using impl='blocks' for this "
            "call (same result, trains on CPU). Use impl='blocks' directly to silence this.",
            stacklevel=3,
        )
        return _blocks(q, k, v, pattern, block)
    N = q.shape[2]
    try:
        bm = flex_block_mask(pattern, N, str(q.device), block)
        fn = _compiled_flex()
        out = fn(q, k, v, block_mask=bm, scale=1.0 / math.sqrt(q.shape[-1]), enable_gqa=q.shape[1] != k.shape[1])
    except Exception as exc:  # e.g. no C++ compiler for Inductor, unsupported device
        warnings.warn(
            f"compiled FlexAttention failed on {q.device} ({type(exc).__name__}: {str(exc)[:200]}); using "
            "impl='blocks' (same result). Install a C++ compiler or use impl='blocks' directly.",
            stacklevel=3,
        )
        return _blocks(q, k, v, pattern, block)
    # a fully masked row: flex already returns 0 there; nan_to_num is belt and braces
    return torch.nan_to_num(out, nan=0.0)


# ---------------------------------------------------------------------------------------
# Public entry point and the model hook
# ---------------------------------------------------------------------------------------


def sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: AttentionPattern | str,
    impl: str = "reference",
    *,
    block: int = DEFAULT_BLOCK,
) -> Tensor:
    """Causal attention restricted to ``pattern``, for positions 0..N-1.

    Args:
        q: queries (B, H, N, D).
        k, v: keys and values (B, H_kv, N, D); H_kv must divide H (grouped heads).
        pattern: an :class:`AttentionPattern` or a spec string (``"window:128+strided:32"``);
            a learned ``"moba:B:K"`` runs :func:`codex_lab.nn.moba.moba_attention` (its
            reference for ``impl="reference"``, its native path otherwise).
        impl: ``"reference"``, ``"blocks"``, ``"flex"`` or ``"fast"`` (see the module docstring).
        block: tile size in tokens for ``"blocks"`` and ``"flex"``.

    Returns:
        (B, H, N, D); rows with no allowed key are zeros.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; choose one of {IMPLS}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    _check_shapes(q, k, v)
    pat = parse_pattern(pattern)
    if isinstance(pat, MoBA):  # content-based: its own reference and native paths
        return moba_attention(q, k, v, pat, "reference" if impl == "reference" else "fast")
    if impl == "reference":
        return _reference(q, k, v, pat)
    if impl == "blocks":
        return _blocks(q, k, v, pat, block)
    if impl == "fast":
        from codex_lab.nn.sparse_fast import fast_available, sparse_fast

        return sparse_fast(q, k, v, pat, block) if fast_available(q) else _blocks(q, k, v, pat, block)
    return _flex(q, k, v, pat, block)


def _plain_layout(q_pos: Tensor | None, k_pos: Tensor | None, n: int) -> bool:
    """True when queries and keys are both positions 0..n-1 in every batch row."""
    if q_pos is None or k_pos is None:
        return False
    if q_pos.shape[-1] != n or k_pos.shape[-1] != n:
        return False
    ar = torch.arange(n, device=q_pos.device)
    return bool((q_pos == ar).all()) and bool((k_pos == ar).all())


def _model_kernel(impl: str) -> Callable[..., Tensor]:
    def kernel(
        q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False, *,
        pattern: AttentionPattern | None = None, q_pos: Tensor | None = None, k_pos: Tensor | None = None,
        **_: object,
    ) -> Tensor:
        """Model hook: block-sparse for a plain 0..N-1 batch, masked reference otherwise
        (KV-cache decode, padded or shifted positions)."""
        pat = AttentionPattern() if pattern is None else pattern
        if isinstance(pat, MoBA) and mask is None:  # content-based: positions, not a mask
            return moba_attention(q, k, v, pat, "fast", q_pos=q_pos, k_pos=k_pos)
        n = q.shape[2]
        no_positions = q_pos is None and k_pos is None  # called directly: positions 0..N-1
        if mask is None and k.shape[2] == n and (no_positions or _plain_layout(q_pos, k_pos, n)):
            return sparse_attention(q, k, v, pat, impl=impl)
        if mask is None:
            if q_pos is None or k_pos is None:
                raise ValueError("sparse kernel needs q_pos and k_pos (or a mask) when a KV cache is used")
            # allowed[b, t, s] = pattern(q_pos, k_pos) and the key slot is filled
            mask = (pat.allowed(q_pos[:, :, None], k_pos[:, None, :]) & (k_pos >= 0)[:, None, :])[:, None]  # (B, 1, T, S)
        return attention_reference(q, k, v, mask)

    kernel.__name__ = f"attention_{impl}"
    return kernel


attention_blocks = _model_kernel("blocks")
attention_flex = _model_kernel("flex")
attention_fast = _model_kernel("fast")
register_attention_impl("blocks", attention_blocks)
register_attention_impl("flex", attention_flex)
register_attention_impl("fast", attention_fast)
