"""The native CPU path of the learned MoBA pattern (``moba_attention(..., impl="fast")``).

The choice comes from :func:`codex_lab.nn.moba.moba_select` (the caller passes it), the
function the reference uses, so both paths attend to the same keys. Since every query token
picked its own blocks, there is no per-query-block tile table: the work is organised by
**key block**, as in MoBA's own implementation. ``csrc/sparse_attention.c`` (``moba_*``):

1. ``moba_table`` counting-sorts the choices into one list per (K/V head, key block j) of
   the query rows (the g query heads of the group together) that chose j;
2. ``moba_fwd``: one task per (K/V head, key block j) gathers those rows, computes their
   scores against block j with one BLAS product per chunk of rows, a softmax partial (row max,
   sum, output) into the row's slot for j, plus block j's own tokens causally into their
   last slot; then each row's K+1 slots are merged exactly through log-sum-exp;
3. ``moba_bwd``: the same tasks, FlashAttention-2 style from the merged log-sum-exp; a task
   owns its key block's gradients and writes its rows' query gradients into their slots
   (summed afterwards), so there are no races.

Both work one K/V head at a time (its per-slot partials stay in cache until merged); with
enough heads (a multiple of the thread count, or at least 4x) each thread takes whole heads,
else the threads share each head's tasks. Single-thread CPU time at N=8192 (4 heads, D=64,
measured under load): the kernel costs what the fixed pattern's native kernel costs per
kept pair; the gate adds about a sixth of the fixed pattern's forward time.

Work: the pairs the pattern keeps (``MoBA.pairs``), plus the gate (one (N x N/B) product per
head and a top-k) and the table. Only fp32, positions 0..N-1, on a CPU where the kernel
builds (:func:`codex_lab.nn.sparse_native.native_status`); elsewhere the reference runs.
"""

from __future__ import annotations

import ctypes
import math
import threading

import torch
from torch import Tensor

from codex_lab.nn.native_build import load_native
from codex_lab.nn.patterns import MoBA

__all__ = ["moba_fast_ok", "moba_fast", "moba_gate", "moba_native_status", "moba_topk"]

# query rows one task gathers at a time (its buffers are rows x max(D, block) floats)
MAX_ROWS = 256

_P = ctypes.c_void_p
_I = ctypes.c_int64


def _lib() -> tuple[ctypes.CDLL | None, str]:
    lib, why = load_native("sparse_attention")
    if lib is not None:
        for fn in (lib.moba_fwd, lib.moba_bwd, lib.moba_gate):
            fn.restype = ctypes.c_int
        lib.moba_table.restype = lib.moba_topk.restype = None
    return lib, why


def moba_native_status() -> str:
    """"" when the native kernel is built and loaded, else why not (then the reference runs)."""
    return _lib()[1]


def moba_topk(scores: Tensor, k: int) -> Tensor | None:
    """The gate's top-k on the native kernel: scores (..., nb) fp32 on a CPU (non-candidates
    -inf) -> (..., k) int64 block indices in descending score order, ties to the lower block,
    -1 past a row's candidates (what k rounds of argmax give); None where the kernel is
    unavailable or k > 64 (then the caller runs those rounds itself)."""
    lib = _lib()[0]
    if lib is None or k > 64 or scores.device.type != "cpu" or scores.dtype != torch.float32:
        return None
    if k < 0 or scores.dim() < 1:
        raise ValueError(f"moba_topk needs scores (..., blocks) and k >= 0; got {tuple(scores.shape)}, k={k}")
    if k == 0:  # the kernel's row loop assumes a slot to fill (k = 0 wrote before the buffer)
        return torch.empty(*scores.shape[:-1], 0, dtype=torch.int64)
    scores = scores.contiguous()
    nb = scores.shape[-1]
    sel = torch.empty(*scores.shape[:-1], k, dtype=torch.int64)
    lib.moba_topk(_ptr(scores), _I(scores.numel() // max(1, nb)), _I(nb), _I(k), _ptr(sel),
                  ctypes.c_int(torch.get_num_threads()))
    return sel


def moba_gate(q: Tensor, kbar: Tensor, block: int, k: int) -> Tensor | None:
    """The whole gate on the native kernel for positions 0..N-1: q (B, H, N, D), kbar
    (B, H_kv, nb, D) the block means, fp32 on a CPU -> (B, H, N, k) as :func:`moba_topk`
    gives it, each query scoring only the blocks before its own (one BLAS product per
    (head, query block)); None where the kernel is unavailable or k > 64."""
    lib = _lib()[0]
    if lib is None or k > 64 or q.device.type != "cpu" or q.dtype != torch.float32 or kbar.dtype != torch.float32:
        return None
    B, H, N, D = q.shape
    Hkv, nb = kbar.shape[1], kbar.shape[2]
    if (kbar.dim() != 4 or kbar.shape[0] != B or Hkv < 1 or H % Hkv or kbar.shape[3] != D or block < 1
            or nb != -(-N // block) or k < 0):
        raise ValueError(f"moba_gate needs q (B, H, N, D), kbar (B, H_kv, ceil(N / block), D) and k >= 0; got "
                         f"{tuple(q.shape)}, {tuple(kbar.shape)}, block={block}, k={k}")
    if k == 0:
        return torch.empty(B, H, N, 0, dtype=torch.int64)
    q3, kb = q.reshape(B * Hkv, H // Hkv * N, D).contiguous(), kbar.contiguous()
    sel = torch.empty(B, H, N, k, dtype=torch.int64)
    rc = lib.moba_gate(_ptr(q3), _ptr(kb), _ptr(sel), _I(B * Hkv), _I(H // Hkv), _I(N), _I(nb), _I(block), _I(D),
                       _I(k), ctypes.c_int(torch.get_num_threads()))
    if rc:
        raise MemoryError("the native MoBA gate could not allocate its per-thread buffers")
    return sel


def moba_fast_ok(q: Tensor, k: Tensor, q_pos: Tensor | None, k_pos: Tensor | None) -> bool:
    """True when the native path applies: fp32 on a CPU, queries and keys at positions 0..N-1,
    and the kernel available."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or k.dtype != torch.float32:
        return False
    n = q.shape[2]
    if k.shape[2] != n:
        return False
    ar = torch.arange(n)
    for pos in (q_pos, k_pos):
        if pos is not None and not bool((pos == ar).all()):
            return False
    return moba_native_status() == ""


_LOCAL = threading.local()


def _scratch(numel: int) -> Tensor:
    """A float32 buffer of ``numel`` for the kernel's per-slot partials (forward outputs,
    backward query gradients), kept per thread between calls: a fresh buffer of that size
    (K+1 times the output) costs more in first-touch page faults than the kernel's own work
    (measured: 48 ms to allocate and fill 32 MiB, 0.7 ms to refill a kept one). Each use
    lives inside one kernel call, so calls never share it at once."""
    buf = getattr(_LOCAL, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _LOCAL.buf = torch.empty(numel)
    return buf[:numel]


def _per_thread(heads: int, threads: int) -> int:
    """1 when each thread takes whole K/V heads (no barrier inside a call; balanced when the
    heads split evenly or there are many), 0 when the threads share each head's tasks."""
    return int(heads % threads == 0 or heads >= 4 * threads)


def _ptr(t: Tensor) -> ctypes.c_void_p:
    return _P(t.data_ptr())


class _Table:
    """Task table of one call: task_ptr (BK*nb + 1), row_idx and row_slot (choices), int64."""

    def __init__(self, sel: Tensor, nb: int) -> None:
        bk, n_rows, k_sel = sel.shape
        lib = _lib()[0]
        assert lib is not None
        sel = sel.contiguous()
        n_choices = int((sel >= 0).sum())
        self.task_ptr = torch.empty(bk * nb + 1, dtype=torch.int64)
        self.row_idx = torch.empty(max(1, n_choices), dtype=torch.int64)
        self.row_slot = torch.empty(max(1, n_choices), dtype=torch.int64)
        lib.moba_table(_ptr(sel), _I(bk), _I(n_rows), _I(k_sel), _I(nb), _ptr(self.task_ptr), _ptr(self.row_idx),
                       _ptr(self.row_slot))

    def args(self) -> list[object]:
        return [_ptr(self.task_ptr), _ptr(self.row_idx), _ptr(self.row_slot)]


class _MobaNative(torch.autograd.Function):
    """q (BK, g*N, D), k/v (BK, N, D) contiguous fp32 -> out (BK, g*N, D)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, table: _Table, shape: tuple[int, ...]) -> Tensor:  # type: ignore[override]
        bk, g, n, nb, bs, d, n_slots = shape
        lib = _lib()[0]
        assert lib is not None
        scale = 1.0 / math.sqrt(d)
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:2])  # (BK, g*N, D), (BK, g*N)
        threads = torch.get_num_threads()
        per_thread = _per_thread(bk, threads)
        # (parts, g*N, slots, D): one K/V head's rows' partial outputs, per thread with per_thread
        opart = _scratch((threads if per_thread else 1) * g * n * n_slots * d)
        lpart = q.new_empty(bk, g * n, n_slots)  # and their log-sum-exps (unused slots: -1e30)
        rc = lib.moba_fwd(_ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(lse), _ptr(opart), _ptr(lpart),
                          *(_I(x) for x in shape), ctypes.c_float(scale), *table.args(), _I(max(MAX_ROWS, bs)),
                          ctypes.c_int(threads), ctypes.c_int(per_thread))
        if rc:
            raise MemoryError("the native MoBA kernel could not allocate its per-thread buffers")
        ctx.table, ctx.shape, ctx.scale = table, shape, scale
        ctx.save_for_backward(q, k, v, out, lse, lpart)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, out, lse, lpart = ctx.saved_tensors
        bk, g, n, nb, bs, d, n_slots = ctx.shape
        lib = _lib()[0]
        assert lib is not None
        grad_out = grad_out.contiguous()
        # delta = rowsum(dO * out): (BK, g*N)
        delta = (grad_out * out).sum(-1)
        threads = torch.get_num_threads()
        per_thread = _per_thread(bk, threads)
        dq, dq_part = torch.empty_like(q), _scratch((threads if per_thread else 1) * g * n * n_slots * d)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        rc = lib.moba_bwd(_ptr(q), _ptr(k), _ptr(v), _ptr(grad_out), _ptr(lse), _ptr(delta), _ptr(lpart), _ptr(dq),
                          _ptr(dq_part), _ptr(dk), _ptr(dv), *(_I(x) for x in ctx.shape), ctypes.c_float(ctx.scale),
                          *ctx.table.args(), _I(max(MAX_ROWS, bs)), ctypes.c_int(threads), ctypes.c_int(per_thread))
        if rc:
            raise MemoryError("the native MoBA kernel could not allocate its per-thread buffers")
        return dq, dk, dv, None, None


def _check_fast_args(q: Tensor, k: Tensor, v: Tensor, pattern: MoBA, selected: Tensor) -> None:
    """ValueError unless the kernel's contract holds: the kernel indexes raw buffers with these
    shapes and block ids, so a wrong dtype or an id out of range would read or write past them."""
    ok = (q.dim() == 4 and k.dim() == 4 and k.shape == v.shape and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
          and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2] and q.shape[3] == k.shape[3]
          and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (q, k, v)))
    if not ok:
        raise ValueError(f"moba_fast needs fp32 CPU q (B, H, N, D) and k, v (B, H_kv, N, D), H_kv dividing H; got "
                         f"{tuple(q.shape)} {q.dtype}, {tuple(k.shape)} {k.dtype}, {tuple(v.shape)} {v.dtype}; "
                         "call moba_attention(..., impl='fast'), which falls back where this does not hold")
    B, H, N, _ = q.shape
    if selected.dtype != torch.int64 or selected.dim() != 4 or tuple(selected.shape[:3]) != (B, H, N):
        raise ValueError(f"selected must be int64 (B={B}, H={H}, N={N}, K) as moba_select gives it; got "
                         f"{tuple(selected.shape)} {selected.dtype}")
    # each choice is -1 or a block strictly before the query's own (causal), each block at most once
    own = (torch.arange(N, device=selected.device) // pattern.block)[None, None, :, None]
    valid = (selected == -1) | ((selected >= 0) & (selected < own))
    srt = selected.sort(-1).values  # a repeated block sits next to itself once sorted
    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
    if not bool(valid.all()) or bool(dup.any()):
        raise ValueError("selected holds a block id that is not -1 nor an earlier block of the query, or a block "
                         "twice; pass moba_select(q, k, pattern)")


def moba_fast(q: Tensor, k: Tensor, v: Tensor, pattern: MoBA, selected: Tensor) -> Tensor:
    """MoBA attention on the native kernel: q (B, H, N, D), k/v (B, H_kv, N, D) fp32 on a CPU
    at positions 0..N-1 (see :func:`moba_fast_ok`) -> (B, H, N, D). ``selected`` (B, H, N, K')
    is :func:`codex_lab.nn.moba.moba_select`'s choice (int64, -1 = no block)."""
    _check_fast_args(q, k, v, pattern, selected)
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    g, bs = H // Hkv, pattern.block
    nb = -(-N // bs)
    k_sel = selected.shape[-1]
    table = _Table(selected.reshape(B * Hkv, g * N, k_sel), nb)
    # the g query heads of a K/V head are consecutive in (B, H): (B*Hkv, g*N, D) is a view
    q3 = q.reshape(B * Hkv, g * N, D).contiguous()
    k3, v3 = k.reshape(B * Hkv, N, D).contiguous(), v.reshape(B * Hkv, N, D).contiguous()
    out = _MobaNative.apply(q3, k3, v3, table, (B * Hkv, g, N, nb, bs, D, k_sel + 1))
    return out.view(B, H, N, D)
