"""MoE dispatch (lesson 04, step 5): run each token's k chosen experts and sum their outputs.

``y_n = sum_j w_nj * expert_{e_nj}(x_n)`` over the kept assignments (n, j). Two
implementations compute it and the tests hold them equal:

- :func:`dispatch_reference`: the definition as a loop over tokens and their k choices
  (N * k one-row matmuls; slow on purpose, easy to read);
- :func:`dispatch_grouped`: the assignments sorted by expert once, so every expert runs
  one matmul chain over its contiguous group of rows, and the results are added back
  to their tokens with their weights.

``dispatch_grouped`` has three paths. With autograd (training) it calls each expert module
on its group, so gradients flow through the ordinary ``nn.Linear`` layers. Without
gradients (inference) it works on the experts' weights directly, stacked and transposed
once (cached until a weight changes): in fp32 on a CPU through the fused native kernel of
:mod:`codex_lab.nn.moe_native` where it builds, and otherwise over tiles of the sorted
assignments (at most :data:`TILE_ROWS_PER_THREAD` rows per CPU thread): it gathers a tile's
tokens, runs ``x [W_gate | W_up]`` (one matmul per expert on its slice of the tile),
``silu(gate) * up`` in place and the down projection into buffers reused by every tile,
scales by the routing weights and adds into the output. Nothing of size (N * k, hidden) is ever allocated (the old
whole-batch version wrote and re-read 64 MiB of gate|up output at 8192 tokens), and small
groups share a tile, so its gather, elementwise work and scatter run once for them all.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codex_lab.nn.layers import SwiGLU
from codex_lab.nn.moe_native import group_pieces, moe_native_status, moe_swiglu_native

DISPATCH_IMPLS = ("reference", "grouped")

# Rows per tile of the inference path on CPU, per thread. Measured on a 2-core machine
# (d 256, h 512): on one thread, tiles of 256..2048 rows ran within noise of each other;
# on two threads, 256 rows per thread lost ~10% (a matmul split over threads needs rows
# enough for both), 1024 did not. A tile's intermediates are then 1024 x 512 x 4 bytes =
# 2 MiB per thread, however many tokens come in.
TILE_ROWS_PER_THREAD = 1024


class RoutingLike(Protocol):
    """What dispatch reads of a router decision (``codex_lab.nn.moe.Routing`` has it):
    expert_idx (N, k) int64 chosen experts; weights (N, k) float32 mixing weights."""

    expert_idx: Tensor
    weights: Tensor


def dispatch_reference(x: Tensor, routing: RoutingLike, experts: nn.ModuleList, keep: Tensor | None = None) -> Tensor:
    """Readable dispatch: for every token and each of its k choices, run that expert.

    x (N, d); keep (N, k) bool, None = keep all -> (N, d). Slow on purpose (N * k tiny matmuls).
    """
    y = torch.zeros_like(x)  # (N, d)
    N, k = routing.expert_idx.shape
    for n in range(N):
        for j in range(k):
            if keep is not None and not keep[n, j]:
                continue  # dropped: over capacity
            e = int(routing.expert_idx[n, j])
            # y_n += w_nj * expert_e(x_n)
            y[n] = y[n] + routing.weights[n, j].to(x.dtype) * experts[e](x[n : n + 1])[0]
    return y


def sort_by_expert(routing: RoutingLike, n_experts: int, keep: Tensor | None = None) -> tuple[Tensor, Tensor, list[int]]:
    """The kept assignments grouped by expert: (token (A,), weight (A,), counts per expert).

    Assignment (n, j) is flat slot ``n * k + j``; a stable sort by expert keeps token order
    inside each group. ``counts`` is a Python list (one host sync) summing to A.
    """
    N, k = routing.expert_idx.shape
    flat_expert = routing.expert_idx.reshape(-1)  # (N*k,)
    flat_weight = routing.weights.reshape(-1)  # (N*k,)
    slot = None
    if keep is not None and not bool(keep.all()):
        slot = torch.nonzero(keep.reshape(-1)).flatten()  # (A,) kept slots
        flat_expert, flat_weight = flat_expert[slot], flat_weight[slot]
    order = torch.argsort(flat_expert, stable=True)  # (A,) assignments grouped by expert
    sorted_slot = order if slot is None else slot[order]  # (A,) flat slot n*k + j
    # token of slot s = floor(s / k)
    token = torch.div(sorted_slot, k, rounding_mode="floor")  # (A,)
    counts = torch.bincount(flat_expert, minlength=n_experts).tolist()  # E group sizes
    return token, flat_weight[order], counts


def dispatch_grouped(x: Tensor, routing: RoutingLike, experts: nn.ModuleList, keep: Tensor | None = None,
                     native: bool | None = None) -> Tensor:
    """Grouped dispatch: sort kept assignments by expert, one matmul chain per expert.

    x (N, d); keep (N, k) bool, None = keep all -> (N, d). Equal to :func:`dispatch_reference`
    up to fp32 rounding. Without gradients (and with SwiGLU experts) the inference path runs
    on cached stacked weights: the fused native kernel (:mod:`codex_lab.nn.moe_native`) for
    fp32 on a CPU where it is available, else the tiled torch path; ``native`` True or False
    forces one (True: an error where it cannot run). With gradients each expert module runs
    on its group.
    """
    token, weight, counts = sort_by_expert(routing, len(experts), keep)
    y = torch.zeros_like(x)  # (N, d)
    if not token.numel():
        return y
    w = weight.to(x.dtype)[:, None]  # (A, 1)
    params = expert_weights(experts) if all(isinstance(e, SwiGLU) for e in experts) else None
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or params is None or any(p.requires_grad for p in params))
    if params is not None and not needs_grad:
        can = x.device.type == "cpu" and x.dtype == torch.float32
        if native is None:
            native = can and moe_native_status() == ""
        if native:
            if not can:
                raise ValueError(f"the native MoE kernel runs fp32 on a CPU, got {x.dtype} on {x.device}; pass native=False")
            (_, _, down), _, gate_up = _stacked(experts, params)  # (E, h, d), (E, d, 2h)
            return moe_swiglu_native(x.contiguous(), token, weight, counts, gate_up, down, y)
        # tiles are for CPU caches; an accelerator takes each group whole
        tile = TILE_ROWS_PER_THREAD * torch.get_num_threads() if x.device.type == "cpu" else max(counts)
        return _experts_tiled(x, token, w, counts, _stacked(experts, params)[1], y, tile)
    x_sorted = x[token]  # (A, d) gathered once
    outs = []
    start = 0
    for e, count in enumerate(counts):
        if count:
            outs.append(experts[e](x_sorted[start : start + count]))  # (count, d)
        start += count
    y_sorted = torch.cat(outs)  # (A, d)
    # y_n = sum over the assignments of token n of w * expert(x_n)
    return y.index_add_(0, token, y_sorted * w)  # (N, d)


def tile_segments(counts: list[int], tile: int) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Cut the sorted assignment list (groups of ``counts`` rows, expert by expert) into
    tiles of at most ``tile`` rows: [(start, rows, [(expert, lo, hi), ...]), ...], where
    (expert, lo, hi) is that expert's slice of the tile (offsets within the tile).

    A group larger than ``tile`` is split into near-equal pieces (:func:`group_pieces`);
    consecutive pieces are packed into one tile while they fit, so small groups share a tile
    and its gather, elementwise work and scatter.
    """
    tiles: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    start = rows = 0
    segs: list[tuple[int, int, int]] = []
    for e, r in group_pieces(counts, tile):
        if rows + r > tile:  # close the tile
            tiles.append((start, rows, segs))
            start, rows, segs = start + rows, 0, []
        segs.append((e, rows, rows + r))
        rows += r
    if rows:
        tiles.append((start, rows, segs))
    return tiles


def _experts_tiled(x: Tensor, token: Tensor, w: Tensor, counts: list[int], mats: list[tuple[Tensor, Tensor]],
                   y: Tensor, tile: int) -> Tensor:
    """Inference: ``y[token] += w * down(silu(x W_gate) * (x W_up))`` over the sorted
    assignments, ``tile`` rows at a time into buffers reused by every tile; within a tile
    each expert's rows are one contiguous slice (one matmul each for gate|up together and
    one for down), the elementwise work, the gather and the scatter run once over the whole
    tile. ``mats[e]`` = expert e's ([W_gate^T | W_up^T] (d, 2h), W_down^T (h, d)). Returns y (N, d)."""
    d, h2 = mats[0][0].shape
    h = h2 // 2
    rows = min(tile, token.numel())
    x_buf, out_buf = x.new_empty(rows, d), x.new_empty(rows, d)  # (rows, d)
    gu_buf = x.new_empty(rows, h2)  # (rows, 2h): gate | up side by side
    for s, r, segs in tile_segments(counts, tile):
        tok = token[s : s + r]  # (r,) token of each row
        xt = torch.index_select(x, 0, tok, out=x_buf[:r])  # (r, d)
        gu, out = gu_buf[:r], out_buf[:r]  # (r, 2h), (r, d)
        # each expert's rows of the tile (views made in one call per tensor: slicing from
        # Python costs ~2 us a view, as much as a small matmul's own overhead)
        sizes = [hi - lo for _, lo, hi in segs]
        parts = list(zip([e for e, _, _ in segs], xt.split(sizes), gu.split(sizes), out.split(sizes)))
        for e, xe, gue, _ in parts:
            # [x W_gate^T | x W_up^T] in one matmul: one call instead of two (timed within
            # +-3% of two calls on 2 cores: the matmuls themselves dominate)
            torch.mm(xe, mats[e][0], out=gue)  # (rows_e, 2h)
        # SwiGLU hidden: silu(x W_gate^T) * (x W_up^T), in place in the gate half (rows 2h apart)
        hid = F.silu(gu[:, :h], inplace=True).mul_(gu[:, h:])  # (r, h), a strided view
        for (e, _, _, oe), he in zip(parts, hid.split(sizes)):
            torch.mm(he, mats[e][1], out=oe)  # expert_e(x); BLAS reads the strided rows in place
        # w_nj * expert_e(x_n), added on its token's row (a token's k terms meet there)
        y.index_add_(0, tok, out.mul_(w[s : s + r]))
    return y


Stacked = tuple[Tensor, Tensor, Tensor]
_STACKED: "weakref.WeakKeyDictionary[nn.ModuleList, tuple[list, Stacked, list[tuple[Tensor, Tensor]], Tensor]]" = weakref.WeakKeyDictionary()


def expert_weights(experts: nn.ModuleList) -> list[Tensor]:
    """[gate_0, up_0, down_0, gate_1, ...] weight parameters of SwiGLU experts, read from the
    modules' parameter dicts (``experts.parameters()`` or attribute access costs ~100 us
    per call for 16 experts, a few % of a small forward)."""
    return [e._modules[n]._parameters["weight"] for e in experts for n in ("gate_proj", "up_proj", "down_proj")]  # type: ignore[index, union-attr, misc]


def stacked_weights(experts: nn.ModuleList, params: list[Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The SwiGLU experts' weights transposed for ``x @ W``: gate (E, d, h), up (E, d, h),
    down (E, h, d). Gate and up are the two halves of one contiguous (E, d, 2h) tensor (the
    inference path multiplies by both at once); down is contiguous. Rebuilt only when a
    parameter changed (its storage or version counter: in-place updates, load_state_dict,
    .to()), so inference pays the copy once; it costs one more copy of the experts' weights
    in memory while the layer lives. ``params``: :func:`expert_weights` of ``experts`` when
    the caller has them."""
    return _stacked(experts, expert_weights(experts) if params is None else params)[0]


# never traced: dynamo would guard on the whole cache (every model's entry in the weak dictionary),
# so a compiled step recompiled when another model's entry was collected (a test order flake, 2026-12-06)
@torch.compiler.disable
def _stacked(experts: nn.ModuleList, params: list[Tensor]) -> tuple[Stacked, list[tuple[Tensor, Tensor]], Tensor]:
    """(stacked gate, up, down), per expert e the views (gate|up[e] (d, 2h), down[e] (h, d)),
    and the whole gate|up tensor (E, d, 2h), cached."""
    key = [(p._version, p.data_ptr()) for p in params]
    hit = _STACKED.get(experts)
    if hit is not None and hit[0] == key:
        return hit[1], hit[2], hit[3]
    with torch.no_grad():
        # gate_up[e] = [W_gate_e^T | W_up_e^T] (d, 2h); down[e] = W_down_e^T (h, d)
        gate_up = torch.stack([torch.cat([g.t(), u.t()], dim=1) for g, u in zip(params[0::3], params[1::3])])  # (E, d, 2h)
        down = torch.stack([p.t() for p in params[2::3]]).contiguous()  # (E, h, d)
    h = gate_up.shape[2] // 2
    stacked: Stacked = (gate_up[:, :, :h], gate_up[:, :, h:], down)
    views = list(zip(gate_up.unbind(0), down.unbind(0)))  # E x ((d, 2h), (h, d))
    _STACKED[experts] = (key, stacked, views, gate_up)
    return stacked, views, gate_up
