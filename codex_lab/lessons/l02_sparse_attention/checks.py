"""Lesson 02 exercises: the window + strided predicate, pair counts and density, and the
tiles a block-sparse kernel must compute.

The expected answers are computed here with plain code (the package's patterns are the
answer to these exercises, so a check does not lean on them; tests hold these references
equal to ``codex_lab.nn.patterns``). On a wrong answer the check recognises the usual
mistakes and names them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from codex_lab.course.check_tools import as_float, pure_call, pyrng, rng
from codex_lab.course.checks import case, exercise

# the package's patterns answer these exercises: blocked for the learner's code while a check runs
_PATTERNS = ("codex_lab.parse_pattern", "codex_lab.union", "codex_lab.LocalWindow.allowed", "codex_lab.Strided.allowed",
             "codex_lab.Union.allowed", "codex_lab.BlockStrided.allowed")  # block 1 = a token stride
_CASES = [(16, 4, 3), (33, 8, 5), (40, 1, 7), (20, 30, 4), (12, 3, 1), (1, 4, 2)]  # (n, window, stride)


def _drawn_cases(tag: str) -> list[tuple[int, int, int]]:
    """Three (n, window, stride) drawn for this grading run: hard-coded answers fail."""
    r = pyrng(tag)
    return [(r.randint(2, 48), r.randint(1, 12), r.randint(1, 9)) for _ in range(3)]


def _ws(q: Tensor, k: Tensor, window: int, stride: int, *, le: bool = False, both: bool = False,
        causal: bool = True, key_stride: bool = False) -> Tensor:
    """The window + strided rule; the keyword options build the usual wrong variants."""
    dist = q - k  # i - j
    near = (dist <= window) if le else (dist < window)
    on_stride = (k % stride == 0) if key_stride else (dist % stride == 0)
    hit = (near & on_stride) if both else (near | on_stride)
    # allowed = (0 <= i - j) and (i - j < w  or  (i - j) mod s == 0)
    return (dist >= 0) & hit if causal else hit


@exercise("02", "window_strided_allowed", points=2, forbid=_PATTERNS)
def check_window_strided_allowed(fn: Callable[..., Any]) -> None:
    """fn(q_pos, k_pos, window, stride) -> bool tensor, broadcasting like ``==``."""
    with case(1, "the (n, n) rule for positions 0..n-1"):
        for n, w, s in _CASES + _drawn_cases("02.window_strided_allowed"):
            pos = torch.arange(n)
            q, k = pos[:, None], pos[None, :]
            want = _ws(q, k, w, s)  # (n, n)
            got = pure_call(fn, ("q_pos", "k_pos", "window", "stride"), q, k, w, s)
            assert isinstance(got, Tensor) and got.dtype == torch.bool, "return a bool tensor (comparisons combined with & and |)"
            assert got.shape == want.shape, f"broadcast q_pos (n, 1) against k_pos (1, n): got shape {tuple(got.shape)}"
            if torch.equal(got, want):
                continue
            if bool(got[~torch.ones(n, n, dtype=torch.bool).tril()].any()):
                raise AssertionError("a query attends to a future key: the pattern must be causal (k_pos <= q_pos, i.e. i - j >= 0)")
            if torch.equal(got, _ws(q, k, w, s, le=True)):
                raise AssertionError(f"window={w} keeps {w + 1} keys; the window is the query and the {w - 1} keys "
                                     "before it: i - j < window, not <=")
            if torch.equal(got, _ws(q, k, w, s, both=True)):
                raise AssertionError("a key is kept when it is in the window OR on the stride (|), not only when both (&)")
            if torch.equal(got, _ws(q, k, w, s, key_stride=True)):
                raise AssertionError("the stride counts back from the query: (i - j) % stride == 0, not j % stride == 0")
            i, j = (got != want).nonzero()[0].tolist()
            raise AssertionError(
                f"window={w}, stride={s}: query {i}, key {j} should be {bool(want[i, j])}; the window keeps "
                "0 <= i - j < window (the query itself and window - 1 keys before it), the stride keeps "
                "(i - j) % stride == 0")
    with case(1, "positions that do not start at 0 (a KV cache)"):
        q, k = torch.tensor([[100]]), torch.tensor([[0, 90, 96, 97, 100, 101]])
        got = fn(q, k, 4, 10)
        assert isinstance(got, Tensor) and torch.equal(got, _ws(q, k, 4, 10)), (
            "query at position 100, keys at 0, 90, 96, 97, 100, 101: work from the positions' differences, not from indices")
        g = rng("02.window_strided_allowed.cache")
        q = torch.randint(50, 500, (5, 1), generator=g)
        k = torch.randint(0, 500, (1, 9), generator=g)
        got = fn(q.clone(), k.clone(), 6, 7)
        assert isinstance(got, Tensor) and torch.equal(got, _ws(q, k, 6, 7)), (
            "positions drawn for this run (a cache that starts past 0): work from q_pos - k_pos, not from indices")


def _count(n: int, w: int, s: int, **variant: bool) -> int:
    pos = torch.arange(n)
    return int(_ws(pos[:, None], pos[None, :], w, s, **variant).sum())


@exercise("02", "pairs_and_density", points=2, forbid=_PATTERNS)
def check_pairs_and_density(fn: Callable[..., Any]) -> None:
    """fn(n, window, stride) -> (attended pairs: int, density vs causal pairs: float)."""
    outs = [(n, w, s, fn(n, w, s)) for n, w, s in _CASES + _drawn_cases("02.pairs_and_density")]
    for n, w, s, got in outs:
        assert isinstance(got, tuple) and len(got) == 2, "return a tuple (pairs, density)"
    with case(1, "the number of allowed pairs"):
        for n, w, s, (pairs, _) in outs:
            want = _count(n, w, s)
            pairs = int(pairs)
            if pairs == want:
                continue
            pos = torch.arange(n)
            dist = pos[:, None] - pos[None, :]
            window_only = int(((dist >= 0) & (dist < w)).sum())
            stride_only = int(((dist >= 0) & (dist % s == 0)).sum())
            if pairs == window_only + stride_only:
                raise AssertionError(f"n={n}, window={w}, stride={s}: {pairs} = window pairs + stride pairs; a pair "
                                     f"that both allow (the diagonal, at least) is counted twice; expected {want}")
            if pairs == _count(n, w, s, causal=False):
                raise AssertionError(f"n={n}: {pairs} pairs counts keys after the query; only j <= i (causal)")
            if pairs == _count(n, w, s, le=True):
                raise AssertionError(f"n={n}, window={w}: the window holds {w} keys (i - j < window), you counted {w + 1}")
            raise AssertionError(f"n={n}, window={w}, stride={s}: {pairs} pairs, expected {want}; count each allowed "
                                 "(query, key) once, even when the window and the stride both allow it")
    with case(1, "the density: pairs / causal pairs"):
        for n, w, s, (_, density) in outs:
            want = _count(n, w, s)
            causal = n * (n + 1) // 2  # sum_{i<n} (i + 1) causal pairs
            # density = pairs / (n (n + 1) / 2)
            dens = want / causal
            density = as_float(density)
            if isinstance(density, float) and abs(density - dens) < 1e-9:
                continue
            if abs(float(density) - want / (n * n)) < 1e-9:
                raise AssertionError(f"density {float(density):.4f}: divide by the n(n+1)/2 causal pairs, not n*n")
            if n > 1 and abs(float(density) - want / (n * (n - 1) / 2)) < 1e-9:
                raise AssertionError(f"density {float(density):.4f}: the n(n+1)/2 causal pairs include each query with "
                                     "itself; n(n-1)/2 leaves the diagonal out")
            raise AssertionError(f"n={n}, window={w}, stride={s}: density {float(density):.4f}, expected {dens:.4f} = "
                                 "pairs / (n(n+1)/2)")


def _mask(kind: str, n: int, a: int, b: int = 0) -> Tensor:
    """(n, n) masks of a few patterns, written out here: window a; strided a; fixed block a
    with b summary positions; window a + every b-th key block of size a."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    causal = j <= i
    if kind == "window":
        return causal & (i - j < a)
    if kind == "strided":
        return causal & ((i - j) % a == 0)
    if kind == "fixed":
        return causal & ((i // a == j // a) | (j % a >= a - b))
    if kind == "window+blockstride":
        return causal & ((i - j < a) | ((i // a - j // a) % b == 0))
    return causal


def _tiles(mask: Tensor, block: int, short: int = 0) -> list[tuple[int, int]]:
    """Tiles holding an allowed pair; ``short=1`` builds the wrong slices that stop a row and a column early."""
    n = mask.shape[0]
    nb = -(-n // block)  # ceil(n / block): the last block may be partial
    return [(a, b) for a in range(nb) for b in range(nb)
            if bool(mask[a * block : (a + 1) * block - short, b * block : (b + 1) * block - short].any())]


@exercise("02", "touched_tiles", forbid=_PATTERNS + ("codex_lab.AttentionPattern.tiles", "codex_lab.tiles_computed"))
def check_touched_tiles(fn: Callable[..., Any]) -> None:
    """fn(mask (n, n) bool, block) -> sorted list of (query block, key block) tiles holding
    at least one True."""
    cases = [("window:4+blockstride:4:3", _mask("window+blockstride", 24, 4, 3), 4), ("window:5", _mask("window", 21, 5), 8),
             ("strided:8", _mask("strided", 32, 8), 8), ("fixed:6:2", _mask("fixed", 30, 6, 2), 6),
             ("dense", _mask("dense", 5, 0), 8), ("window:3", _mask("window", 13, 3), 4),
             # window 2 touches tile (a, a - 1) only at its first row and last column
             ("window:2", _mask("window", 16, 2), 4), ("window:2", _mask("window", 13, 2), 4)]
    g = pyrng("02.touched_tiles")
    n, a = g.randint(9, 40), g.randint(2, 6)
    cases.append((f"window:{a} (drawn)", _mask("window", n, a), g.randint(2, 8)))
    for spec, mask, bs in cases:
        n = mask.shape[0]
        want = _tiles(mask, bs)
        got = pure_call(fn, ("mask", "block"), mask, bs)
        assert isinstance(got, list), "return a list of (i, j) tuples"
        got = [tuple(int(x) for x in t) for t in got]
        if sorted(set(got)) == want:
            assert got == want, "return each tile once, sorted"
            continue
        if set(got) == {(b, a) for a, b in want} and set(got) != set(want):
            raise AssertionError(f"{spec}, n={n}: the tiles are transposed; return (query block, key block), "
                                 "query block first (causal tiles have key block <= query block)")
        full = [(a, b) for a, b in want if bool(mask[a * bs : (a + 1) * bs, b * bs : (b + 1) * bs].all())]
        if set(got) == set(full) and len(full) < len(want):
            raise AssertionError(f"{spec}, n={n}: you kept only tiles where *every* pair is allowed; a kernel must "
                                 "compute a tile if *any* pair in it is allowed (.any(), not .all())")
        if set(got) == set(_tiles(mask, bs, short=1)):
            raise AssertionError(f"{spec}, n={n}, block={bs}: tiles touched only at their last row or column are missing: "
                                 "the slice mask[a * block : (a + 1) * block] already stops before (a + 1) * block (the end "
                                 "is exclusive), so no - 1")
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        if missing:
            partial = n % bs and any(a == n // bs or b == n // bs for a, b in missing)
            raise AssertionError(
                f"{spec}, n={n}, block={bs}: tiles {missing[:4]} hold allowed pairs but are missing"
                + (f"; the last block is partial: there are ceil(n / block) = {-(-n // bs)} blocks, not n // block"
                   if partial else ""))
        raise AssertionError(f"{spec}, n={n}, block={bs}: tiles {extra[:4]} hold no allowed pair; keep a tile only "
                             "if its slice of the mask has a True")
