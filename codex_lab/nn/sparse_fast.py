"""The fast block-sparse kernel, ``impl="fast"`` of :func:`codex_lab.nn.sparse.sparse_attention`.

Same tiles as the readable ``"blocks"`` kernel (lesson 02), and held equal to it and to the
reference by the tests; what changes is how the touched tiles are computed:

- Each query block's key tiles are split once per (pattern, N) into **full** tiles (every
  pair allowed: no mask at all) and **partial** tiles (the diagonal, the window's edge:
  the only ones that need the in-tile mask). ``"blocks"`` adds a float mask to every tile.
- Each part runs PyTorch's fused CPU flash kernel, which also returns the row
  log-sum-exp; the two parts are merged exactly the way FlashAttention merges its key
  blocks (``out = sum_p out_p * exp(lse_p - lse)``, ``lse = logaddexp(lse_full, lse_part)``).
- Backward (training) reuses the fused flash backward for each part with the **merged**
  output and log-sum-exp: the probabilities of part p are ``exp(s - lse)`` with the global
  ``lse``, and ``D = rowsum(dO * O)`` uses the global ``O``, so each part's gradients are
  exactly its share of the full softmax's gradients.

Query blocks with the same (full, partial) tile counts are batched into one call; the tile
plan (indices, masks) is built once and cached. Memory is linear in N (only touched tiles
are gathered). Where the fused op is missing (a non-CPU device), it falls back to ``"blocks"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from codex_lab.nn.patterns import AttentionPattern

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@dataclass(frozen=True)
class _FastGroup:
    """Query blocks ``rows`` (R,) that touch ``full`` (R, mf) unmasked key tiles and ``part``
    (R, mp) masked ones; ``bias`` (1, R, g*bs, mp*bs) is the partial tiles' additive mask
    (0 = attend, -inf = not), ``part_ok`` (R, g*bs) the rows with at least one key there,
    ``any_ok`` (R, g*bs) the rows with at least one key at all (None: all rows have one).
    A part's layout says how its key tiles are read without copying: ``"shared"`` (every row
    has the same tiles: gathered once, broadcast over rows), ``"sliding"`` (row r's tiles are
    the consecutive run starting at ``cols[0, 0] + r``: an overlapping strided view), or
    ``"gather"`` (a copy per row)."""

    rows: Tensor
    first: int
    contiguous: bool
    full: Tensor
    part: Tensor
    full_layout: str
    part_layout: str
    bias: Tensor | None
    part_ok: Tensor | None
    any_ok: Tensor | None


def _layout(rows: list[int], cols: list[list[int]]) -> str:
    """How one part's key tiles can be read (see :class:`_FastGroup`)."""
    if not cols or not cols[0]:
        return "gather"
    if all(c == cols[0] for c in cols):
        return "shared"
    run = all(c == list(range(c[0], c[0] + len(c))) for c in cols)
    step = all(cols[r][0] - cols[0][0] == r and rows[r] - rows[0] == r for r in range(len(rows)))
    return "sliding" if run and step else "gather"


@lru_cache(maxsize=64)
def fast_plan(pattern: AttentionPattern, n: int, block: int, g: int, device: str, dtype: torch.dtype) -> tuple[_FastGroup, ...]:
    """The fast kernel's tile plan, cached per (pattern, n, block, g, device, dtype)."""
    tiles = pattern.tiles(n, block)  # (nb, nb)
    nb = tiles.shape[0]
    pos = torch.arange(nb * block).view(nb, block)  # (nb, bs)
    real_q = pos < n  # (nb, bs): padded query rows are discarded, so they never make a tile partial
    groups: dict[tuple[int, int], tuple[list[int], list[list[int]], list[list[int]]]] = {}
    for i in range(nb):
        full, part = [], []
        for j in torch.nonzero(tiles[i]).flatten().tolist():
            # allowed[a, b] = pattern(q_a, k_b) and k_b < n
            ok = pattern.allowed(pos[i][:, None], pos[j][None, :]) & (pos[j] < n)[None, :]  # (bs, bs)
            (full if bool(ok[real_q[i]].all()) else part).append(j)
        if full or part:
            rows, fl, pl = groups.setdefault((len(full), len(part)), ([], [], []))
            rows.append(i)
            fl.append(full)
            pl.append(part)
    plan = []
    for (mf, mp), (rows, fl, pl) in groups.items():
        rows_t = torch.tensor(rows)  # (R,)
        R = len(rows)
        full_t = torch.tensor(fl, dtype=torch.long).view(R, mf)  # (R, mf)
        part_t = torch.tensor(pl, dtype=torch.long).view(R, mp)  # (R, mp)
        bias = part_ok = None
        any_ok = torch.ones(R, g * block, dtype=torch.bool) if mf else None
        if mp:
            q_pos = pos[rows_t]  # (R, bs)
            k_pos = pos[part_t].reshape(R, mp * block)  # (R, mp*bs)
            allowed = pattern.allowed(q_pos[:, :, None], k_pos[:, None, :]) & (k_pos < n)[:, None, :]  # (R, bs, mp*bs)
            allowed = allowed.repeat(1, g, 1)  # (R, g*bs, mp*bs): same mask for each stacked head
            # bias = 0 where allowed, -inf elsewhere
            bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))[None].to(device)
            part_ok = allowed.any(-1)  # (R, g*bs)
            any_ok = part_ok if any_ok is None else any_ok | part_ok
            part_ok = None if bool(part_ok.all()) else part_ok.to(device)
        plan.append(_FastGroup(rows=rows_t.to(device), first=rows[0], contiguous=rows == list(range(rows[0], rows[0] + R)), full=full_t.to(device), part=part_t.to(device),
                               full_layout=_layout(rows, fl), part_layout=_layout(rows, pl),
                               bias=bias, part_ok=part_ok, any_ok=None if bool(any_ok.all()) else any_ok.to(device)))
    return tuple(plan)


def _two_part_forward(q: Tensor, kf: Tensor, vf: Tensor, kp: Tensor, vp: Tensor,
                      grp: _FastGroup, scale: float) -> tuple[Tensor, Tensor]:
    """softmax attention of q over the union of two key sets, merged through log-sum-exp.

    q (B', R, L, D); kf/vf (B', R, Sf, D) unmasked (Sf may be 0); kp/vp (B', R, Sp, D) under
    ``grp.bias`` (1, R, L, Sp) (Sp may be 0) -> out (B', R, L, D), lse (B', R, L)."""
    lse_f = lse_p = None
    if kf.shape[2]:
        out_f, lse_f = _FLASH(q, kf, vf, 0.0, False, scale=scale)  # (B', R, L, D), (B', R, L)
    if kp.shape[2]:
        out_p, lse_p = _FLASH(q, kp, vp, 0.0, False, attn_mask=grp.bias, scale=scale)
        if grp.part_ok is not None:  # a row with no key here weighs 0
            lse_p = lse_p.masked_fill(~grp.part_ok, float("-inf"))
    if lse_f is None:
        out, lse = out_p, lse_p
    elif lse_p is None:
        out, lse = out_f, lse_f
    else:
        # lse = log(exp(lse_f) + exp(lse_p)); out = out_f exp(lse_f - lse) + out_p exp(lse_p - lse)
        # = lerp(out_f, out_p, w) with w = exp(lse_p - lse) = sigmoid(lse_p - lse_f): one pass
        lse = torch.logaddexp(lse_f, lse_p)  # (B', R, L)
        w = torch.sigmoid(lse_p - lse_f)[..., None].to(q.dtype)  # (B', R, L, 1)
        out = torch.lerp(out_f, out_p, w)  # (B', R, L, D)
    if grp.any_ok is not None:
        # rows with no key at all: output 0, any finite lse (every probability there is 0)
        out = out.masked_fill(~grp.any_ok[..., None], 0.0)
        lse = lse.masked_fill(~grp.any_ok, 0.0)
    return out, lse


def _tiles(kb: Tensor, cols: Tensor, layout: str) -> Tensor:
    """Key (or value) tiles ``cols`` (R, m) of kb (B', nb, bs, D) as (B', R, m*bs, D),
    without a copy for the "shared" and "sliding" layouts."""
    Bp, nb, bs, D = kb.shape
    R, m = cols.shape
    if layout == "shared":
        one = kb.index_select(1, cols[0]).view(Bp, 1, m * bs, D)  # (B', 1, m*bs, D) gathered once
        return one.expand(Bp, R, m * bs, D)  # stride 0 over the rows
    if layout == "sliding":
        kb = kb.contiguous()
        # row r starts at tile cols[0, 0] + r: windows of m*bs keys, overlapping, one tile apart
        return kb.as_strided((Bp, R, m * bs, D), (nb * bs * D, bs * D, D, 1), kb.storage_offset() + int(cols[0, 0]) * bs * D)
    return kb.index_select(1, cols.flatten()).view(Bp, R, m * bs, D)  # (B', R, m*bs, D)


def _gather(qb: Tensor, kb: Tensor, vb: Tensor, grp: _FastGroup) -> tuple[Tensor, ...]:
    """The group's query tiles (B', R, L, D) and its full / partial key and value tiles."""
    R = grp.rows.numel()
    qs = qb[:, grp.first : grp.first + R] if grp.contiguous else qb.index_select(1, grp.rows)  # (B', R, L, D)
    kf, vf = _tiles(kb, grp.full, grp.full_layout), _tiles(vb, grp.full, grp.full_layout)  # (B', R, mf*bs, D)
    kp, vp = _tiles(kb, grp.part, grp.part_layout), _tiles(vb, grp.part, grp.part_layout)  # (B', R, mp*bs, D)
    return qs, kf, vf, kp, vp


class _FastSparse(torch.autograd.Function):
    """All groups of the plan in one autograd node: qb (B', nb, L, D), kb/vb (B', nb, bs, D)
    -> (B', nb, L, D). Gathers and gradient scatters are done here, once per tile, instead
    of autograd's one full-size zero buffer per gather."""

    @staticmethod
    def forward(ctx, qb: Tensor, kb: Tensor, vb: Tensor, plan: tuple[_FastGroup, ...], scale: float) -> Tensor:  # type: ignore[override]
        covered = sum(grp.rows.numel() for grp in plan) == qb.shape[1]  # every query block is written below
        alloc = torch.empty if covered else torch.zeros  # else query blocks with no key stay 0
        out = alloc(qb.shape, dtype=qb.dtype, device=qb.device)  # (B', nb, L, D)
        lse = alloc(qb.shape[:3], dtype=torch.float32, device=qb.device)  # (B', nb, L)
        for grp in plan:
            o, l = _two_part_forward(*_gather(qb, kb, vb, grp), grp, scale)
            R = grp.rows.numel()
            if grp.contiguous:
                out[:, grp.first : grp.first + R] = o
                lse[:, grp.first : grp.first + R] = l
            else:
                out.index_copy_(1, grp.rows, o)
                lse.index_copy_(1, grp.rows, l.to(lse.dtype))
        ctx.save_for_backward(qb, kb, vb, out, lse)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        qb, kb, vb, out, lse = ctx.saved_tensors
        Bp, _, bs, D = kb.shape
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
        for grp in ctx.plan:
            qs, kf, vf, kp, vp = _gather(qb, kb, vb, grp)
            R, mf = grp.full.shape
            mp = grp.part.shape[1]
            if grp.contiguous:
                sl = slice(grp.first, grp.first + R)
                g_o, o, l = grad_out[:, sl], out[:, sl], lse[:, sl]
            else:
                g_o, o, l = (t.index_select(1, grp.rows) for t in (grad_out, out, lse))
            g_o, o, l, qs = g_o.contiguous(), o.contiguous(), l.contiguous(), qs.contiguous()
            dqs = None
            # each part's probabilities under the merged lse are its share of the full softmax,
            # and the kernel's D = rowsum(dO * O) uses the merged O: the parts' gradients add up
            for cols, m, kk, vv, bias in ((grp.full, mf, kf, vf, None), (grp.part, mp, kp, vp, grp.bias)):
                if not m:
                    continue
                dq_, dk_, dv_ = _FLASH_BWD(g_o, qs, kk, vv, o, l, 0.0, False, attn_mask=bias, scale=ctx.scale)
                dqs = dq_ if dqs is None else dqs + dq_
                dk.index_add_(1, cols.flatten(), dk_.reshape(Bp, R * m, bs, D))
                dv.index_add_(1, cols.flatten(), dv_.reshape(Bp, R * m, bs, D))
            if grp.contiguous:
                dq[:, grp.first : grp.first + R] = dqs
            else:
                dq.index_copy_(1, grp.rows, dqs)
        return dq, dk, dv, None, None


def fast_available(q: Tensor) -> bool:
    """True where the fused flash op with log-sum-exp exists for q's device (CPU)."""
    return q.device.type == "cpu"


def sparse_fast(q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern, block: int) -> Tensor:
    """Block-sparse attention, full/partial tiles merged through log-sum-exp: (B, H, N, D).

    q (B, H, N, D), k/v (B, H_kv, N, D); shapes already checked by ``sparse_attention``."""
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    g = H // Hkv
    nb = -(-N // block)
    pad = nb * block - N
    scale = 1.0 / math.sqrt(D)
    if pad:
        q = F.pad(q, (0, 0, 0, pad))  # (B, H, nb*bs, D)
        k = F.pad(k, (0, 0, 0, pad))  # (B, Hkv, nb*bs, D)
        v = F.pad(v, (0, 0, 0, pad))  # (B, Hkv, nb*bs, D)
    # the g query heads sharing a K/V head are stacked along the rows of each tile
    qb = q.reshape(B, Hkv, g, nb, block, D).transpose(2, 3).reshape(B * Hkv, nb, g * block, D)  # (B*Hkv, nb, g*bs, D)
    kb = k.reshape(B * Hkv, nb, block, D)  # (B*Hkv, nb, bs, D)
    vb = v.reshape(B * Hkv, nb, block, D)  # (B*Hkv, nb, bs, D)
    plan = fast_plan(pattern, N, block, g, str(q.device), q.dtype)
    out = _FastSparse.apply(qb, kb, vb, plan, scale)  # (B*Hkv, nb, g*bs, D)
    out = out.view(B, Hkv, nb, g, block, D).transpose(2, 3)  # (B, Hkv, g, nb, bs, D)
    return out.reshape(B, H, nb * block, D)[:, :, :N]  # (B, H, N, D)
