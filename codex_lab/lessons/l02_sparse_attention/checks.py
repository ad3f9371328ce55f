"""Lesson 02 exercises: the window + strided predicate, pair counts and density, and the
tiles a block-sparse kernel must compute."""

from __future__ import annotations

from typing import Any, Callable

import torch

from codex_lab.nn.patterns import causal_pairs, parse_pattern
from codex_lab.course.checks import exercise

_CASES = [(16, 4, 3), (33, 8, 5), (40, 1, 7), (20, 30, 4), (12, 3, 1), (1, 4, 2)]  # (n, window, stride)


@exercise("02", "window_strided_allowed")
def check_window_strided_allowed(fn: Callable[..., Any]) -> None:
    """fn(q_pos, k_pos, window, stride) -> bool tensor, broadcasting like ``==``."""
    for n, w, s in _CASES:
        pos = torch.arange(n)
        want = parse_pattern(f"window:{w}+strided:{s}").mask(n)
        got = fn(pos[:, None], pos[None, :], w, s)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bool, "return a bool tensor"
        assert got.shape == want.shape, f"broadcast q_pos (n, 1) against k_pos (1, n): got shape {tuple(got.shape)}"
        if got[~torch.ones(n, n, dtype=torch.bool).tril()].any():
            raise AssertionError("a query attends to a future key: the pattern must be causal (k_pos <= q_pos)")
        bad = (got != want).nonzero()
        if len(bad):
            i, j = bad[0].tolist()
            raise AssertionError(
                f"window={w}, stride={s}: query {i}, key {j} should be {bool(want[i, j])}; the window keeps "
                "0 <= i - j < window (the query itself and window - 1 keys before it), the stride keeps "
                "(i - j) % stride == 0"
            )
    # positions need not start at 0 (a KV cache holds keys at any positions)
    q, k = torch.tensor([[100]]), torch.tensor([[0, 90, 96, 97, 100, 101]])
    want = parse_pattern("window:4+strided:10").allowed(q, k)
    assert torch.equal(fn(q, k, 4, 10), want), "work from the positions' differences, not from indices"


@exercise("02", "pairs_and_density")
def check_pairs_and_density(fn: Callable[..., Any]) -> None:
    """fn(n, window, stride) -> (attended pairs: int, density vs causal pairs: float)."""
    for n, w, s in _CASES:
        p = parse_pattern(f"window:{w}+strided:{s}")
        got = fn(n, w, s)
        assert isinstance(got, tuple) and len(got) == 2, "return a tuple (pairs, density)"
        pairs, density = got
        assert int(pairs) == p.pairs(n), (
            f"n={n}, window={w}, stride={s}: {int(pairs)} pairs, expected {p.pairs(n)}; count each allowed "
            "(query, key) once, even when the window and the stride both allow it"
        )
        want = p.pairs(n) / causal_pairs(n)
        assert abs(float(density) - want) < 1e-9, (
            f"density {float(density):.4f}, expected {want:.4f}: divide by the n(n+1)/2 causal pairs, not n*n"
        )


@exercise("02", "touched_tiles")
def check_touched_tiles(fn: Callable[..., Any]) -> None:
    """fn(mask (n, n) bool, block) -> sorted list of (query block, key block) tiles holding
    at least one True."""
    for spec, n, bs in [("window:4+blockstride:4:3", 24, 4), ("window:5", 21, 8), ("strided:8", 32, 8),
                        ("fixed:6:2", 30, 6), ("dense", 5, 8)]:
        p = parse_pattern(spec)
        want = [tuple(t) for t in p.tiles(n, bs).nonzero().tolist()]
        got = fn(p.mask(n), bs)
        assert isinstance(got, list), "return a list of (i, j) tuples"
        got = [tuple(int(x) for x in t) for t in got]
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        assert not missing, (
            f"{spec}, n={n}, block={bs}: tiles {missing[:4]} hold allowed pairs but are missing"
            + ("; the last block may be partial when n is not a multiple of block" if n % bs else "")
        )
        assert not extra, f"{spec}, n={n}, block={bs}: tiles {extra[:4]} hold no allowed pair"
        assert got == sorted(got) and len(got) == len(set(got)), "return each tile once, sorted"
