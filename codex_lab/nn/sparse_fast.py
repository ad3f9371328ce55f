"""The fast block-sparse kernel, ``impl="fast"`` of :func:`codex_lab.nn.sparse.sparse_attention`.

The same attention as the readable ``"blocks"`` kernel (lesson 02), held equal to it and to
the reference by the tests. :mod:`codex_lab.nn.sparse_fast_plan` turns (pattern, N) once
into a plan of touched tiles, and one of two paths computes them:

**The fused native kernel** (fp32 on a CPU, the default where it builds:
:mod:`codex_lab.nn.sparse_native`, ``csrc/sparse_attention.c``): one task per (batch-head,
query unit) computes the scores of every key the plan gives that unit (one BLAS product
per run of consecutive keys, masks added on the partial tiles), one exact softmax per row,
the output and its log-sum-exp; the backward recomputes the probabilities from that
log-sum-exp (FlashAttention-2). Measured at N=8192 on the bench's pattern (2 cores, three
runs): 0.65-0.74x the flash-call path's forward time and 0.60-0.72x its forward + backward
time, peak memory 8 against 37 MiB.

**The flash-call path** (other dtypes, or where the native kernel cannot be built:
:func:`codex_lab.nn.sparse_native.native_status` says why), on PyTorch's fused CPU flash
kernel:

- **Full** tiles (every pair allowed) run PyTorch's fused CPU flash kernel with no mask;
  **partial** tiles (the diagonal, a window's edge) run it under an additive mask, at half
  the tile size when that computes fewer pairs. The kernel returns each row's
  log-sum-exp, and the two parts are merged exactly the way FlashAttention merges its key
  blocks: ``lse = logaddexp(lse_p, lse_f)``, ``out = lerp(out_p, out_f, exp(lse_f - lse))``.
- Key tiles are read through strided views (a sliding window, a block-strided class
  layout) instead of being copied, wherever the pattern allows.
- **Backward** (training) recomputes the probabilities from the saved merged log-sum-exp
  (FlashAttention-style): each call's fused flash backward, given the merged output and
  ``lse``, yields exactly its share of the full softmax's gradients (``P = exp(s - lse)``
  with the global ``lse``; ``D = rowsum(dO * O)`` with the global ``O``), so the shares add
  up, and the backward may group the tiles differently from the forward (it stacks
  block-strided query blocks that share key tiles into larger calls). Only q, k, v, the
  output, the log-sum-exp and the class-permuted copy of k and v are kept, and each call's
  temporaries are capped (``CHUNK_FLOATS``): memory stays linear in N.

Why the flash-call path stops near 5.5x at N=8192 (the plan computes 11.5% of the causal
pairs, limit 8.7x at equal cost per pair): PyTorch's flash kernel is about 80% of its time,
and it splits queries into 32-row tiles below 192 query rows, so it runs the 64- and
128-row query blocks at roughly 60% of the per-pair speed it reaches on dense causal
attention's 256-row blocks; the merges are most of the rest. The native kernel has neither.

Where neither exists (a non-CPU device) ``sparse_attention`` uses ``"blocks"``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from codex_lab.nn.patterns import AttentionPattern
from codex_lab.nn.sparse_fast_plan import FastCall, FastPlan, fast_plan
from codex_lab.nn.sparse_native import NativeTable, native_backward, native_forward, native_status, native_table

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

__all__ = ["fast_available", "sparse_fast", "fast_pairs"]


# temporaries of one flash call (its gathered keys, its outputs and gradients) stay under
# about this many floats: the allocator then recycles them instead of mapping fresh pages
# (each first touch of a fresh page costs a fault, which dominated the backward before)
CHUNK_FLOATS = 1 << 21


def _class_layout(x: Tensor, block: int, step: int) -> Tensor:
    """x (B', N_pad, D) with its tiles permuted into ``step`` classes of T = ceil(nb / step)
    slots each (tile j -> class j mod step, slot j // step): (B', step*T, block, D). Slots
    past the last tile are left unset: no call reads them."""
    Bp, n_pad, D = x.shape
    nb = n_pad // block
    T, full = -(-nb // step), nb // step
    out = x.new_empty(Bp, step, T, block, D)  # (B', s, T, bs, D)
    xt = x.view(Bp, nb, block, D)
    # tile t*s + c -> (c, t): a transposed copy of the first full rows of s tiles ...
    out[:, :, :full] = xt[:, : full * step].view(Bp, full, step, block, D).transpose(1, 2)
    if nb > full * step:  # ... and the last, shorter row
        out[:, : nb - full * step, full] = xt[:, full * step :]
    return out.view(Bp, step * T, block, D)


def _keys(k: Tensor, k_cls: Tensor | None, call: FastCall, step: int) -> Tensor:
    """The key (or value) units of one call: (B', R, m*unit, D), a view where the layout allows."""
    Bp, n_pad, D = k.shape
    unit = call.unit
    R, m = call.cols.shape
    ku = k.view(Bp, n_pad // unit, unit, D)  # (B', N_pad/unit, unit, D)
    if call.layout == "sliding":
        # row r reads units c0 + r .. c0 + r + m - 1: windows one unit apart, overlapping
        return ku.as_strided((Bp, R, m * unit, D), (n_pad * D, unit * D, D, 1),
                             ku.storage_offset() + int(call.cols[0, 0]) * unit * D)
    if call.layout == "shared":
        return ku.index_select(1, call.cols[0]).view(Bp, 1, m * unit, D).expand(Bp, R, m * unit, D)
    if call.layout == "class" and k_cls is not None:
        T = k_cls.shape[1] // step
        c0 = int(call.cols[0, 0])
        # row r reads class (c0 mod s) + r, slots c0 // s .. c0 // s + m - 1: consecutive there
        start = ((c0 % step) * T + c0 // step) * unit * D
        return k_cls.as_strided((Bp, R, m * unit, D), (k_cls.shape[1] * unit * D, T * unit * D, D, 1),
                                k_cls.storage_offset() + start)
    return ku.index_select(1, call.cols.flatten()).view(Bp, R, m * unit, D)  # (B', R, m*unit, D)


def _rows(x: Tensor, call: FastCall) -> Tensor:
    """The call's query units of x (B', N_pad/unit, L [, D]) as (B', R, stack*L [, D]) (a view
    when they are consecutive and not stacked)."""
    R = call.rows.numel()
    if call.qrows is not None:  # k blocks per row, one after the other along the query axis
        return x.index_select(1, call.qrows).view(x.shape[0], R, call.stack * x.shape[2], *x.shape[3:])
    return x[:, call.first : call.first + R] if call.contiguous else x.index_select(1, call.rows)


def _units(x: Tensor, unit: int, g: int) -> Tensor:
    """x (B', N_pad*g, ...) viewed as (B', N_pad/unit, g*unit [, D])."""
    return x.view(x.shape[0], -1, g * unit, *x.shape[2:])


@lru_cache(maxsize=256)
def _chunked(calls: tuple[FastCall, ...], Bp: int, D: int, backward: bool) -> tuple[FastCall, ...]:
    """The calls split so that what one call materialises stays under CHUNK_FLOATS: forward,
    its output (B', R, L, D) and any copied keys; backward, also its key gradients
    (B', R, m*unit, D), twice."""
    out: list[FastCall] = []
    for c in calls:
        L, S = c.mask.shape[2] if c.mask is not None else 0, c.cols.shape[1] * c.unit
        copied = S if c.layout == "gather" else 0
        per_row = Bp * D * (max(L, c.unit * c.stack) + (2 * S if backward else copied))
        out.extend(c.chunks(max(1, CHUNK_FLOATS // per_row)))
    return tuple(out)


def _put(dst: Tensor, call: FastCall, src: Tensor, add: bool) -> None:
    """dst[:, call's rows] = src (or += src) for dst (B', N_pad/unit, L [, D]) and src as
    :func:`_rows` gives it."""
    if call.contiguous:
        sl = dst[:, call.first : call.first + call.rows.numel()]
        sl.add_(src) if add else sl.copy_(src)
        return
    rows = call.rows if call.qrows is None else call.qrows
    src = src.reshape(dst.shape[0], rows.numel(), *dst.shape[2:])  # unstack: one block per row
    dst.index_add_(1, rows, src) if add else dst.index_copy_(1, rows, src)


def _add_keys(d_u: Tensor, call: FastCall, d_: Tensor) -> None:
    """Add a call's key gradients d_ (B', R, m*unit, D) into d_u (B', N_pad/unit, unit, D)."""
    R, m = call.cols.shape
    unit = call.unit
    for j in range(m):  # the j-th key unit of every row: a slice (runs) or an index list
        part = d_[:, :, j * unit : (j + 1) * unit]  # (B', R, unit, D)
        if call.runs:
            c = int(call.cols[0, j])
            d_u[:, c : c + R].add_(part)
        else:
            d_u.index_add_(1, call.cols[:, j], part)


class _FastSparse(torch.autograd.Function):
    """All calls of a plan in one autograd node: q (B', N_pad*g, D) in unit layout (each unit
    of ``plan.unit`` tokens holds its g heads' rows), k/v (B', N_pad, D) -> out like q."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, plan: FastPlan, g: int, scale: float,  # type: ignore[override]
                table: NativeTable | None) -> Tensor:
        ctx.plan, ctx.g, ctx.scale, ctx.table = plan, g, scale, table
        if table is not None:  # the fused native kernel: out and lse in one pass, nothing to merge
            out, lse = native_forward(q, k, v, table, scale)
            ctx.save_for_backward(q, k, v, out, lse)
            return out
        Bp, D = q.shape[0], q.shape[-1]
        acc = torch.promote_types(q.dtype, torch.float32)  # the kernel's log-sum-exp type
        if plan.covered:  # every query unit is written by a partial call first
            out, lse = torch.empty_like(q), q.new_empty(q.shape[:2], dtype=acc)
        else:  # no key yet: out 0, lse -inf (a full call then merges in exactly)
            out, lse = torch.zeros_like(q), q.new_full(q.shape[:2], float("-inf"), dtype=acc)
        k_cls = v_cls = None
        if plan.step:
            k_cls, v_cls = _class_layout(k, plan.block, plan.step), _class_layout(v, plan.block, plan.step)
        out_u, lse_u, q_u = _units(out, plan.unit, g), _units(lse, plan.unit, g), _units(q, plan.unit, g)
        for call in _chunked(plan.partial, Bp, D, False):
            o, l = _FLASH(_rows(q_u, call), _keys(k, None, call, 0), _keys(v, None, call, 0), 0.0, False,
                          attn_mask=call.mask, scale=scale)[:2]  # (B', R, L, D), (B', R, L)
            if call.row_ok is not None:  # a row with no key in this call weighs nothing in the merge
                l = l.masked_fill(~call.row_ok, float("-inf"))
            _put(out_u, call, o, add=False)
            _put(lse_u, call, l, add=False)
        out_b, lse_b, q_b = _units(out, plan.block, g), _units(lse, plan.block, g), _units(q, plan.block, g)
        for call in _chunked(plan.full, Bp, D, False):
            o, l = _FLASH(_rows(q_b, call), _keys(k, k_cls, call, plan.step), _keys(v, v_cls, call, plan.step),
                          0.0, False, scale=scale)[:2]  # (B', R, L, D), (B', R, L)
            o_old, l_old = _rows(out_b, call), _rows(lse_b, call)  # views when the rows are consecutive
            # lse = log(e^l_old + e^l); out = out_old e^(l_old - lse) + o e^(l - lse) = lerp(out_old, o, w),
            # w = e^(l - lse) = sigmoid(l - l_old)
            w = torch.sigmoid(l - l_old)[..., None]  # (B', R, L, 1)
            o_old.lerp_(o, w.to(o.dtype))
            torch.logaddexp(l_old, l, out=l_old)
            if not call.contiguous:  # index_select made copies: write them back
                _put(out_b, call, o_old, add=False)
                _put(lse_b, call, l_old, add=False)
        if plan.dead is not None:
            # rows with no key at all: output 0 (the kernel's), and a finite lse (all their p are 0)
            lse_u.masked_fill_(plan.dead, 0.0)
        # the class layout (linear in N) is kept for the backward rather than copied again
        ctx.save_for_backward(q, k, v, out, lse, k_cls, v_cls)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        plan, g, scale = ctx.plan, ctx.g, ctx.scale
        if ctx.table is not None:
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = native_backward(q, k, v, out, lse, grad_out.reshape(out.shape), ctx.table, scale)
            return dq, dk, dv, None, None, None, None
        q, k, v, out, lse, k_cls, v_cls = ctx.saved_tensors
        Bp, n_pad, D = k.shape
        # the partial calls write every query unit first when they cover them all
        dq = torch.empty_like(q) if plan.covered else torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for first, calls, unit, step in ((True, plan.partial, plan.unit, 0), (False, plan.full_bwd, plan.block, plan.step)):
            q_u, o_u, l_u, dq_u = (_units(t, unit, g) for t in (q, out, lse, dq))
            go_u = grad_out.reshape(o_u.shape)  # (B', N_pad/unit, g*unit, D); may arrive expanded
            dk_u, dv_u = dk.view(Bp, n_pad // unit, unit, D), dv.view(Bp, n_pad // unit, unit, D)
            kc, vc = (k_cls, v_cls) if step else (None, None)
            for call in _chunked(calls, Bp, D, True):
                dq_, dk_, dv_ = _FLASH_BWD(_rows(go_u, call), _rows(q_u, call), _keys(k, kc, call, step),
                                           _keys(v, vc, call, step), _rows(o_u, call), _rows(l_u, call),
                                           0.0, False, attn_mask=call.mask, scale=scale)
                _put(dq_u, call, dq_, add=not (first and plan.covered))
                _add_keys(dk_u, call, dk_)
                _add_keys(dv_u, call, dv_)
        return dq, dk, dv, None, None, None, None


def fast_available(q: Tensor) -> bool:
    """True where the fused flash op with log-sum-exp exists for q's device (CPU)."""
    return q.device.type == "cpu"


def fast_pairs(pattern: AttentionPattern, n: int, block: int, heads_per_kv: int = 1) -> int:
    """(query, key) pairs the fast kernel computes per K/V head (all stacked query heads)."""
    return fast_plan(pattern, n, block, heads_per_kv, "cpu", torch.float32).pairs


def sparse_fast(q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern, block: int,
                native: bool | None = None) -> Tensor:
    """Block-sparse attention over the plan's tiles: (B, H, N, D).

    q (B, H, N, D), k/v (B, H_kv, N, D); shapes already checked by ``sparse_attention``.
    ``native``: True runs the fused native kernel (an error if it is unavailable), False
    the flash calls merged through log-sum-exp, None the native kernel for fp32 where it
    is available (:func:`native_status`) and the flash calls otherwise."""
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    g = H // Hkv
    nb = -(-N // block)
    pad = nb * block - N
    plan = fast_plan(pattern, N, block, g, str(q.device), q.dtype)
    unit = plan.unit
    if pad:
        q = F.pad(q, (0, 0, 0, pad))  # (B, H, nb*bs, D)
        k = F.pad(k, (0, 0, 0, pad))  # (B, Hkv, nb*bs, D)
        v = F.pad(v, (0, 0, 0, pad))  # (B, Hkv, nb*bs, D)
    n_pad = nb * block
    nu = n_pad // unit
    # the g query heads sharing a K/V head are stacked along the rows of each unit:
    # (B, Hkv, g, nu, unit, D) -> (B*Hkv, nu, g, unit, D) -> (B*Hkv, nu*g*unit, D)
    qu = q.reshape(B, Hkv, g, nu, unit, D).transpose(2, 3).reshape(B * Hkv, nu * g * unit, D).contiguous()
    # contiguous: the strided key views assume a dense (B*Hkv, N_pad, D) layout
    kf = k.reshape(B * Hkv, n_pad, D).contiguous()  # (B*Hkv, N_pad, D)
    vf = v.reshape(B * Hkv, n_pad, D).contiguous()  # (B*Hkv, N_pad, D)
    if native is None:
        native = q.dtype == torch.float32 and native_status() == ""
    if native and q.dtype != torch.float32:
        raise ValueError(f"the native sparse kernel is fp32 only, got {q.dtype}; pass native=False")
    if native and native_status():
        raise RuntimeError(f"the native sparse kernel is unavailable: {native_status()}; pass native=False")
    table = native_table(plan, g, nu) if native else None
    out = _FastSparse.apply(qu, kf, vf, plan, g, 1.0 / math.sqrt(D), table)  # (B*Hkv, nu*g*unit, D)
    out = out.view(B, Hkv, nu, g, unit, D).transpose(2, 3)  # (B, Hkv, g, nu, unit, D)
    return out.reshape(B, H, n_pad, D)[:, :, :N]  # (B, H, N, D)
