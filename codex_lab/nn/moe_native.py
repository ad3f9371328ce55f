"""The fused native CPU kernel of MoE inference (fp32 SwiGLU experts): load and call.

``csrc/moe_swiglu.c`` runs the sorted assignments in pieces of at most :data:`PIECE_ROWS`
rows of one expert, one piece per task on one thread (OpenMP, torch's threads): gather the
piece's tokens, ``x [W_gate | W_up]``, ``silu(gate) * up`` and the down projection with
single-threaded BLAS products, scaled by the routing weights into that piece's rows of a
(A, d) buffer, which one ``index_add_`` then adds onto the tokens. The torch path of
:func:`codex_lab.nn.moe_dispatch.dispatch_grouped` runs the same products as multi-threaded
matmuls over tiles, each a fork and join of the threads, with the elementwise work as
separate passes; on 2 cores the fused kernel took 4.9 against 6.2 ms (512 tokens, 8 experts,
top-2, d 256, h 512) and 71 against 90 ms at 8192 tokens.

:mod:`codex_lab.nn.native_build` compiles it on first use; where that is not possible or
``CODEX_LAB_NATIVE=0`` is set, :func:`moe_native_status` says why and the torch path runs.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from codex_lab.nn.native_build import load_native

__all__ = ["PIECE_ROWS", "group_pieces", "moe_native_status", "moe_swiglu_native"]

# rows per task: an expert's group is cut into near-equal pieces of at most this many rows.
# Measured on 2 cores (d 256, h 512): 128 ran 4.9 / 10.9 / 71 ms at 512x8 / 512x16 / 8192x8
# (tokens x experts), 64 ran 4.9 / 10.9 / 72, 32 ran 5.1 / 11.8 / 72 (smaller products)
PIECE_ROWS = 128

_P = ctypes.c_void_p
_I = ctypes.c_int64


# built assuming finite floats: the compiler then turns the exp's clamps into min/max (IEEE
# compare-and-select made the whole kernel ~15% slower, measured). NaN still propagates: a NaN
# in a token's row reaches its gate and up values, and silu(g) * u multiplies by both (a test
# holds this)
FLAGS = ("-ffinite-math-only",)


def _load() -> tuple[ctypes.CDLL | None, str]:
    lib, why = load_native("moe_swiglu", FLAGS)
    if lib is not None:
        lib.moe_swiglu.restype = ctypes.c_int
    return lib, why


def moe_native_status() -> str:
    """"" when the native MoE kernel is built and loaded (building it on first call), else why
    it is not (then the torch path runs)."""
    return _load()[1]


def group_pieces(counts: list[int], piece: int) -> list[tuple[int, int]]:
    """Each expert's group of sorted rows (``counts[e]`` of them, expert by expert) cut into
    near-equal pieces of at most ``piece`` rows: [(expert, rows), ...] in sorted order (2100
    rows, piece 512: five pieces of 420, not four of 512 and one of 52: a tiny matmul runs
    slowly). Shared with the torch path's tiles (``moe_dispatch.tile_segments``)."""
    out: list[tuple[int, int]] = []
    for e, c in enumerate(counts):
        n = -(-c // piece)  # ceil(c / piece) pieces, sizes c // n or c // n + 1
        out += [(e, c // n + (i < c % n)) for i in range(n)]
    return out


def moe_swiglu_native(x: Tensor, token: Tensor, weight: Tensor, counts: list[int], gate_up: Tensor,
                      down: Tensor, y: Tensor) -> Tensor:
    """``y[token[a]] += weight[a] * down_e(silu(x W_gate_e) * (x W_up_e))`` for the sorted
    assignments a (``counts`` per expert e, in order).

    x (N, d), y (N, d) fp32 contiguous on the CPU; token (A,) int64; weight (A,) fp32;
    gate_up (E, d, 2h) = [W_gate^T | W_up^T] and down (E, h, d) contiguous. Returns y."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"the native MoE kernel is unavailable: {why}")
    pieces = group_pieces(counts, PIECE_ROWS)
    # per piece: its expert, first sorted row and rows, int64
    expert = torch.tensor([e for e, _ in pieces], dtype=torch.int64)
    rows = torch.tensor([r for _, r in pieces], dtype=torch.int64)
    start = torch.cumsum(rows, 0) - rows
    d, h = x.shape[1], down.shape[1]
    ys = x.new_empty(token.numel(), d)  # (A, d): each assignment's weighted expert output
    token, weight = token.contiguous(), weight.to(torch.float32).contiguous()
    rc = lib.moe_swiglu(_P(x.data_ptr()), _P(token.data_ptr()), _P(weight.data_ptr()), _P(gate_up.data_ptr()),
                        _P(down.data_ptr()), _P(ys.data_ptr()), _I(d), _I(h), _P(expert.data_ptr()),
                        _P(start.data_ptr()), _P(rows.data_ptr()), _I(expert.numel()),
                        _I(int(rows.max()) if rows.numel() else 0), ctypes.c_int(torch.get_num_threads()))
    if rc:
        raise MemoryError("the native MoE kernel could not allocate its per-thread buffers")
    # a token's k weighted terms meet on its row
    return y.index_add_(0, token, ys)
