"""The fused native CPU kernel behind ``impl="fast"`` (fp32): load, segment table, calls.

``csrc/sparse_attention.c`` computes one (batch-head, query unit) per task: every score of
the unit's segments with one BLAS product per segment, one exact softmax per row, and the
output, with the row log-sum-exp; its backward recomputes the probabilities from that
log-sum-exp (FlashAttention-2), one task per batch-head where there are at least as many as
threads (no race on the key gradients), else per query unit into per-thread copies of them.
Unlike the flash-call path of :mod:`codex_lab.nn.sparse_fast` there is nothing to merge
afterwards and no 32-row query tiles: that path runs PyTorch's fused kernel once per group of
tiles and merges full and partial results through log-sum-exp.

:mod:`codex_lab.nn.native_build` compiles it on first use (about a second, once per
machine); where that is not possible (no compiler, a BLAS without ``sgemm_``, a read-only
disk) or ``CODEX_LAB_NATIVE=0`` is set, :func:`native_status` says why and the flash-call
path runs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from codex_lab.nn.native_build import load_native
from codex_lab.nn.sparse_fast_plan import FastPlan

__all__ = ["NativeTable", "native_status", "native_table", "native_forward", "native_backward"]

# a segment's columns (keys) per call: its score buffer is rows x MAX_KEYS floats per thread
MAX_KEYS = 2048
# the kernel's finite stand-in for -inf in masks: a row that sees no key then computes no
# inf - inf (exp(NEG - max) is exactly 0 in the kernel)
NEG = -1e30

_P = ctypes.c_void_p
_I = ctypes.c_int64


@dataclass(frozen=True, eq=False)
class NativeTable:
    """Unit u (``rows`` = g*unit query rows) sees keys ``start[x] .. start[x] + length[x] - 1``
    for x in ``ptr[u] .. ptr[u+1] - 1``, under ``masks[mask[x]:]`` viewed (rows, length[x])
    when ``mask[x] >= 0``. All int64 except ``masks`` (float32)."""

    rows: int
    ptr: Tensor
    start: Tensor
    length: Tensor
    mask: Tensor
    masks: Tensor


def _load() -> tuple[ctypes.CDLL | None, str]:
    lib, why = load_native("sparse_attention")
    if lib is not None:
        for fn in (lib.sparse_fwd, lib.sparse_bwd):
            fn.restype = ctypes.c_int
    return lib, why


def native_status() -> str:
    """"" when the native kernel is built and loaded (building it on first call), else why
    it is not (then ``impl="fast"`` runs its flash-call path)."""
    return _load()[1]


def _runs(cols: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs in a sorted list of unit indices: [(first index in cols, run length)]."""
    out: list[tuple[int, int]] = []
    for i, c in enumerate(cols):
        if out and c == cols[i - 1] + 1:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


@lru_cache(maxsize=64)
def native_table(plan: FastPlan, g: int, n_units: int) -> NativeTable:
    """The plan's tiles as the native kernel's segment table (``n_units`` = N_pad / unit query
    units), cached per plan."""
    unit, r = plan.unit, plan.block // plan.unit
    segs: dict[int, list[tuple[int, int, Tensor | None]]] = {}  # unit -> [(first key, keys, mask)]
    for call in plan.partial:  # masked tiles at ``unit`` granularity
        for i, u in enumerate(call.rows.tolist()):
            cols = call.cols[i].tolist()
            mk = None if call.mask is None else call.mask[0, i if call.mask.shape[1] > 1 else 0]  # (g*unit, m*unit)
            for a, n in _runs(cols):
                segs.setdefault(u, []).append((cols[a] * unit, n * unit, None if mk is None else
                                               mk[:, a * unit : (a + n) * unit]))
    for call in plan.full:  # unmasked tiles at ``block`` granularity: both units of a block read them
        for i, blk in enumerate(call.rows.tolist()):
            cols = call.cols[i].tolist()
            for a, n in _runs(cols):
                for t in range(r):
                    segs.setdefault(blk * r + t, []).append((cols[a] * plan.block, n * plan.block, None))
    ptr, start, length, mask_at, bank = [0], [], [], [], []
    seen: dict[tuple[int, int, int], int] = {}  # one copy of a mask that many units share
    size = 0
    for u in range(n_units):
        for s, n, mk in sorted(segs.get(u, []), key=lambda x: x[0]):
            for a in range(0, n, MAX_KEYS):  # no segment longer than the kernel's buffer
                b = min(n, a + MAX_KEYS)
                start.append(s + a)
                length.append(b - a)
                if mk is None:
                    mask_at.append(-1)
                    continue
                part = mk[:, a:b]
                key = (part.data_ptr(), part.shape[1], part.stride(0))
                if key not in seen:
                    seen[key] = size
                    bank.append(part.to(torch.float32).clamp(min=NEG).flatten())
                    size += part.numel()
                mask_at.append(seen[key])
        ptr.append(len(start))
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    return NativeTable(rows=g * unit, ptr=as_long(ptr), start=as_long(start), length=as_long(length),
                       mask=as_long(mask_at), masks=torch.cat(bank) if bank else torch.zeros(1))


def _ptr(t: Tensor) -> ctypes.c_void_p:
    return _P(t.data_ptr())


def _shape_args(q: Tensor, k: Tensor, table: NativeTable) -> list[object]:
    bh, rows_total, d = q.shape
    return [_I(bh), _I(rows_total // table.rows), _I(table.rows), _I(k.shape[1]), _I(d)]


def _table_args(table: NativeTable) -> list[object]:
    return [_ptr(table.ptr), _ptr(table.start), _ptr(table.length), _ptr(table.mask), _ptr(table.masks),
            _I(MAX_KEYS), ctypes.c_int(torch.get_num_threads())]


def native_forward(q: Tensor, k: Tensor, v: Tensor, table: NativeTable, scale: float) -> tuple[Tensor, Tensor]:
    """(out (B', nu*rows, D), lse (B', nu*rows)) for q (B', nu*rows, D) in unit layout and
    k, v (B', N_pad, D), all contiguous fp32 on the CPU. Rows that see no key: out 0, lse 0."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"the native sparse kernel is unavailable: {why}")
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:2])  # (B', nu*rows, D), (B', nu*rows)
    rc = lib.sparse_fwd(_ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(lse), *_shape_args(q, k, table),
                        ctypes.c_float(scale), *_table_args(table))
    if rc:
        raise MemoryError("the native sparse kernel could not allocate its per-thread buffers")
    return out, lse


def native_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor,
                    table: NativeTable, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) like q, k, v, from the forward's out and lse (shapes as
    :func:`native_forward`); grad_out like out."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"the native sparse kernel is unavailable: {why}")
    grad_out = grad_out.contiguous()
    # delta = rowsum(dO * out): (B', nu*rows)
    delta = (grad_out * out).sum(-1)
    threads = torch.get_num_threads()
    dq = torch.empty_like(q)
    # with at least as many batch-heads as threads, one task per batch-head writes its key
    # gradients directly; otherwise one key-gradient copy per thread (tasks of two threads may
    # share keys), summed after: (parts, B', N_pad, D)
    parts = 1 if q.shape[0] >= threads else threads
    dk_part = k.new_zeros(parts, *k.shape)
    dv_part = v.new_zeros(parts, *v.shape)
    rc = lib.sparse_bwd(_ptr(q), _ptr(k), _ptr(v), _ptr(grad_out), _ptr(lse), _ptr(delta), _ptr(dq),
                        _ptr(dk_part), _ptr(dv_part), *_shape_args(q, k, table), ctypes.c_float(scale),
                        *_table_args(table), ctypes.c_int(parts))
    if rc:
        raise MemoryError("the native sparse kernel could not allocate its per-thread buffers")
    return dq, dk_part.sum(0), dv_part.sum(0)
