"""The tile plan of the fast block-sparse kernel (:mod:`codex_lab.nn.sparse_fast`).

A (pattern, N) pair is turned once into a list of **calls** of PyTorch's fused CPU flash
kernel; the kernel then only gathers, calls and merges. Each touched ``block``-sized tile
(query block i, key block j) is one of two kinds:

- **full**: every (real) pair in it is allowed. Full tiles are computed with no mask at
  all, at the ``block`` granularity.
- **partial**: the diagonal, a window's edge, a token stride. Partial tiles are computed
  under an additive mask (0 = attend, -inf = not), at a finer granularity ``unit``
  (``block`` or ``block // 2``, whichever computes fewer pairs): a 128-token window costs
  two 128x128 tiles per query block at ``block`` granularity but three 64x64 tiles per
  64-query half-block at ``unit = 64``, a quarter less work.

Query units that touch the same number of key units form one call (their rows are
batched along the kernel's head axis). A call's key units are read without a copy when
the layout allows it:

- ``"sliding"``: query unit r reads the consecutive run of key units starting one unit
  further than r - 1's (a window): an overlapping strided view of K;
- ``"shared"``: every query unit reads the same key units: gathered once, broadcast;
- ``"class"``: every query unit reads key units ``c, c + s, c + 2s, ...`` (a block-strided
  pattern): K is permuted once into s classes (tiles with the same index mod s side by
  side), where each such run is consecutive, and the call reads a strided view of that;
- ``"gather"``: anything else: one copy per call.

A query row's full and partial results are merged exactly (through log-sum-exp) by the
kernel. Rows with no key at all are listed (``dead``) so that they come out as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch import Tensor

from codex_lab.nn.patterns import AttentionPattern


# candidate granularities of the partial calls, as divisors of the block: the plan keeps the
# one that computes the fewest pairs (a 32-row unit computes fewer still, but the kernel
# runs it slower than the pairs it saves, forward and backward)
UNIT_DIVISORS = (1, 2)
# stack query blocks into rectangles where block-strided full tiles form staircases
STACK = True


@dataclass(frozen=True, eq=False)
class FastCall:
    """One batched flash call. ``rows`` (R,) query units (``unit`` tokens each, times the g
    stacked heads), ``cols`` (R, m) key units each reads, ``layout`` how they are read (see
    the module docstring; ``step`` is the class stride s for ``"class"``), ``mask`` the
    additive bias (1, Rm, g*unit, m*unit) with Rm in {1, R} (None: no mask), ``row_ok``
    (R, g*unit) the rows with at least one key here (None: all of them); ``runs`` is True
    when each column of ``cols`` counts up by one row to row (then a key unit's gradient
    shares are added through slices, not index lists). A **stacked** call (``stack`` k > 1)
    is a rectangle of k query blocks sharing the same key tiles: row r stacks the blocks
    ``qrows[r*k : (r+1)*k]`` along the kernel's query axis, which the kernel runs faster
    than k separate 128-row blocks (its query tiles grow from 32 to 64 or 256 rows)."""

    unit: int
    rows: Tensor
    first: int
    contiguous: bool
    cols: Tensor
    layout: str
    step: int
    mask: Tensor | None
    row_ok: Tensor | None
    runs: bool
    stack: int = 1
    qrows: Tensor | None = None

    def chunks(self, max_rows: int) -> list["FastCall"]:
        """This call split into calls of at most ``max_rows`` query units (the same layout):
        smaller temporaries, which the allocator then reuses instead of mapping fresh pages."""
        R = self.rows.numel()
        if R <= max_rows:
            return [self]
        out = []
        for a in range(0, R, max_rows):
            b = min(R, a + max_rows)
            out.append(replace(self, rows=self.rows[a:b], first=self.first + a if self.contiguous else int(self.rows[a]),
                               cols=self.cols[a:b], mask=None if self.mask is None else
                               (self.mask if self.mask.shape[1] == 1 else self.mask[:, a:b]),
                               row_ok=None if self.row_ok is None else self.row_ok[a:b],
                               qrows=None if self.qrows is None else self.qrows[a * self.stack : b * self.stack]))
        return out


@dataclass(frozen=True, eq=False)
class FastPlan:
    """``partial`` calls (masked, written first) and ``full`` calls (merged in) for one
    (pattern, N, block, g), and ``full_bwd``, the same full tiles as the backward runs them
    (stacked rectangles where possible); ``unit`` is the partial calls' granularity, ``dead``
    (N_pad / unit, g*unit) the rows with no key at all (None: none), ``covered`` whether
    the partial calls write every query unit, ``step`` the class stride of the class
    layout (0: unused) and ``pairs`` the number of (query, key) pairs the calls compute."""

    block: int
    unit: int
    partial: tuple[FastCall, ...]
    full: tuple[FastCall, ...]
    full_bwd: tuple[FastCall, ...]
    dead: Tensor | None
    covered: bool
    step: int
    pairs: int


def _allowed(pattern: AttentionPattern, q_pos: Tensor, k_pos: Tensor, n: int) -> Tensor:
    # allowed[a, b] = pattern(q_a, k_b) and k_b < n (padded keys never attend)
    return pattern.allowed(q_pos[:, None], k_pos[None, :]) & (k_pos < n)[None, :]


def _class_step(cols: list[list[int]], rows: list[int]) -> int:
    """s > 1 when every row reads ``c, c+s, ...`` with c = row's first col and the rows'
    first cols are consecutive classes (so one strided view serves them all), else 0."""
    if len(cols[0]) < 2:
        return 0
    s = cols[0][1] - cols[0][0]
    if s < 2:
        return 0
    for r, c in enumerate(cols):
        if c != list(range(c[0], c[0] + s * len(c), s)) or c[0] != cols[0][0] + r or c[0] // s != cols[0][0] // s:
            return 0
    return s


def _layout(rows: list[int], cols: list[list[int]]) -> tuple[str, int]:
    """How one call's key units are read (see the module docstring)."""
    if all(c == cols[0] for c in cols):
        return "shared", 0
    m = len(cols[0])
    consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
    if consecutive and all(c == list(range(cols[0][0] + r, cols[0][0] + r + m)) for r, c in enumerate(cols)):
        return "sliding", 0
    s = _class_step(cols, rows)
    return ("class", s) if s else ("gather", 0)


def _calls(units: dict[int, tuple[list[int], list[Tensor]]], unit: int, g: int, dtype: torch.dtype,
           device: str, masked: bool, step: int = 0) -> tuple[tuple[FastCall, ...], int]:
    """Group query units by their number of key units (and, with a class ``step``, by the
    class slot they start at) into calls; also the pairs computed."""
    groups: dict[tuple[int, int], list[int]] = {}
    for u, (cols, _) in units.items():
        groups.setdefault((len(cols), cols[0] // step if step else 0), []).append(u)
    calls, pairs = [], 0
    for (m, _), rows in sorted(groups.items()):
        cols = [units[u][0] for u in rows]
        layout, step = _layout(rows, cols)
        mask = row_ok = None
        if masked:
            allowed = torch.stack([torch.cat(units[u][1], 1) for u in rows])  # (R, unit, m*unit)
            same = bool((allowed == allowed[:1]).all())
            row_ok_t = allowed.any(-1).repeat(1, g)  # (R, g*unit): rows with a key in this call
            allowed = (allowed[:1] if same else allowed).repeat(1, g, 1)  # (Rm, g*unit, m*unit)
            # bias = 0 where allowed, -inf elsewhere
            mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))[None].to(device)
            row_ok = None if bool(row_ok_t.all()) else row_ok_t.to(device)
        pairs += len(rows) * g * unit * m * unit
        calls.append(FastCall(unit=unit, rows=torch.tensor(rows, device=device), first=rows[0],
                              contiguous=rows == list(range(rows[0], rows[0] + len(rows))),
                              cols=torch.tensor(cols, dtype=torch.long, device=device).view(len(rows), m),
                              layout=layout, step=step, mask=mask, row_ok=row_ok,
                              runs=all(c[j] == cols[0][j] + r for r, c in enumerate(cols) for j in range(m))))
    return tuple(calls), pairs


def _partial_units(pattern: AttentionPattern, n: int, block: int, unit: int, partial: Tensor,
                   ) -> dict[int, tuple[list[int], list[Tensor]]]:
    """For each query unit: the key units (inside partial tiles) holding an allowed pair, and
    the (unit, unit) allowed masks of those key units."""
    r = block // unit
    out: dict[int, tuple[list[int], list[Tensor]]] = {}
    for i, j_list in enumerate(partial.tolist()):
        js = [j for j, p in enumerate(j_list) if p]
        if not js:
            continue
        k_units = torch.tensor([j * r + t for j in js for t in range(r)])  # (nk,)
        k_pos = (k_units[:, None] * unit + torch.arange(unit)).flatten()  # (nk*unit,)
        for a in range(r):
            u = i * r + a
            ok = _allowed(pattern, torch.arange(u * unit, (u + 1) * unit), k_pos, n)  # (unit, nk*unit)
            ok = ok.view(unit, len(k_units), unit).transpose(0, 1)  # (nk, unit, unit)
            hit = ok.flatten(1).any(1).tolist()  # key units holding an allowed pair
            if any(hit):
                out[u] = ([int(v) for v, h in zip(k_units, hit) if h], [ok[t] for t, h in enumerate(hit) if h])
    return out


def _staircases(full_units: dict[int, tuple[list[int], list[Tensor]]], s: int, nb: int, block: int,
                g: int, device: str) -> tuple[list[FastCall], int]:
    """Rectangles out of block-strided full tiles. Class c's blocks c, c+s, c+2s, ... (slots
    t = 0, 1, ...) often each see every earlier block of their class: a staircase, rows t
    with slots [0, t). Split at h, the rows [h, b) all share slots [base, h): one stacked
    call; the two smaller staircases left recurse. The rectangles' tiles are removed from
    ``full_units`` (rows left with tiles keep them, starting at a later slot)."""
    found: dict[tuple[int, ...], list[int]] = {}  # (T, h, b, base) -> classes

    def split(c: int, T: int, a: int, b: int, base: int) -> None:
        if b - a < 3:  # too small to stack: rows keep slots [base, t)
            for t in range(a, b):
                full_units[c + t * s] = ([c + j * s for j in range(base, t)], [])
            return
        h = (a + b) // 2
        found.setdefault((T, h, b, base), []).append(c)
        split(c, T, a, h, base)
        split(c, T, h + 1, b, h)
        full_units[c + h * s] = ([], [])  # row h: all its tiles are in the rectangle

    for c in range(min(s, nb)):
        T = len(range(c, nb, s))
        stair = c not in full_units and all(full_units.get(c + t * s, ([], []))[0] == [c + j * s for j in range(t)]
                                            for t in range(1, T))
        if stair and T >= 4:
            split(c, T, 1, T, 0)
    for i in [i for i, (cols, _) in full_units.items() if not cols]:
        del full_units[i]
    calls, pairs = [], 0
    for (T, h, b, base), classes in sorted(found.items()):
        runs = [[classes[0]]]
        for c in classes[1:]:  # one strided view per run of consecutive classes
            (runs[-1].append(c) if c == runs[-1][-1] + 1 else runs.append([c]))
        for run in runs:
            qrows = [c + t * s for c in run for t in range(h, b)]
            pairs += len(qrows) * g * block * (h - base) * block
            calls.append(FastCall(unit=block, rows=torch.tensor([c + h * s for c in run], device=device), first=run[0] + h * s,
                                  contiguous=False, cols=torch.tensor([[c + j * s for j in range(base, h)] for c in run],
                                                                      device=device),
                                  layout="class", step=s, mask=None, row_ok=None, runs=True,
                                  stack=b - h, qrows=torch.tensor(qrows, device=device)))
    return calls, pairs


@lru_cache(maxsize=64)
def fast_plan(pattern: AttentionPattern, n: int, block: int, g: int, device: str, dtype: torch.dtype) -> FastPlan:
    """The fast kernel's calls for ``pattern`` at length n, cached per (pattern, n, block, g,
    device, dtype)."""
    tiles = pattern.tiles(n, block)  # (nb, nb)
    nb = tiles.shape[0]
    pos = torch.arange(nb * block).view(nb, block)  # (nb, bs)
    full = torch.zeros_like(tiles)
    full_units: dict[int, tuple[list[int], list[Tensor]]] = {}
    for i in range(nb):
        real = pos[i] < n  # padded query rows are discarded: they never make a tile partial
        for j in torch.nonzero(tiles[i]).flatten().tolist():
            if bool(_allowed(pattern, pos[i], pos[j], n)[real].all()):
                full[i, j] = True
                full_units.setdefault(i, ([], []))[0].append(j)
    partial = tiles & ~full
    # the partial tiles' granularity: block or block // 2, whichever computes fewer pairs
    best = None
    for unit in [block // d for d in UNIT_DIVISORS if block % d == 0 and block // d >= 8] or [block]:
        units = _partial_units(pattern, n, block, unit, partial)
        area = sum(len(c) for c, _ in units.values()) * unit * unit
        if best is None or area < best[0]:
            best = (area, unit, units)
    assert best is not None
    _, unit, units = best
    part_calls, part_pairs = _calls(units, unit, g, dtype, device, masked=True)
    full_calls, full_pairs = _calls(full_units, block, g, dtype, device, masked=False)
    # rows with no key at all: no allowed key among the partial units and no full tile
    r = block // unit
    dead = torch.ones(nb * r, g * unit, dtype=torch.bool)  # (N_pad / unit, g*unit)
    for u, (_, masks) in units.items():
        dead[u] &= ~torch.cat(masks, 1).any(-1).repeat(g)
    for i in full_units:
        dead[i * r : (i + 1) * r] = False
    steps = {c.step for c in full_calls if c.layout == "class"}
    if len(steps) > 1:  # one class permutation per call: keep the most common stride, gather the rest
        keep = max(steps, key=lambda s: sum(c.rows.numel() for c in full_calls if c.step == s))
        full_calls = tuple(c if c.layout != "class" or c.step == keep else replace(c, layout="gather", step=0)
                           for c in full_calls)
        steps = {keep}
    full_bwd = full_calls
    if len(steps) == 1 and STACK:  # backward: rectangles of stacked query blocks where the strides form staircases
        step = next(iter(steps))
        rects, _ = _staircases(full_units, step, nb, block, g, device)
        if rects:  # the same pairs, in fewer, larger calls: a backward gain (the forward pays for the merges)
            full_bwd = tuple(rects) + _calls(full_units, block, g, dtype, device, masked=False, step=step)[0]
    return FastPlan(block=block, unit=unit, partial=part_calls, full=full_calls, full_bwd=full_bwd,
                    dead=dead.to(device) if bool(dead.any()) else None,
                    covered=len(units) == nb * r, step=steps.pop() if steps else 0,
                    pairs=part_pairs + full_pairs)
