"""Attention patterns: predicates against brute-force loops, counts, specs, tiles."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.patterns import (
    AttentionPattern,
    BlockStrided,
    Fixed,
    GlobalTokens,
    LocalWindow,
    Strided,
    Union,
    causal_pairs,
    parse_pattern,
    seed_cost_ratio,
)


def brute(pattern_kind: str, i: int, j: int, a: int = 0, b: int = 0) -> bool:
    """Independent scalar definitions, written straight from the papers."""
    if j > i:
        return False
    if pattern_kind == "window":
        return i - j < a
    if pattern_kind == "strided":
        return (i - j) % a == 0
    if pattern_kind == "fixed":  # block a, summary b
        return i // a == j // a or j % a >= a - b
    if pattern_kind == "global":
        return j < a
    if pattern_kind == "blockstride":  # block a, stride b
        return (i // a - j // a) % b == 0
    raise AssertionError(pattern_kind)


CASES = [
    (LocalWindow(3), "window", 3, 0),
    (Strided(4), "strided", 4, 0),
    (Fixed(5, 2), "fixed", 5, 2),
    (GlobalTokens(2), "global", 2, 0),
    (BlockStrided(4, 3), "blockstride", 4, 3),
]


@pytest.mark.parametrize("pattern,kind,a,b", CASES)
def test_mask_matches_scalar_definition(pattern: AttentionPattern, kind: str, a: int, b: int) -> None:
    n = 23
    m = pattern.mask(n)
    expected = torch.tensor([[brute(kind, i, j, a, b) for j in range(n)] for i in range(n)])
    assert torch.equal(m, expected)
    assert pattern.pairs(n) == int(expected.sum())
    assert pattern.pairs(n, chunk=5) == int(expected.sum())  # chunking does not change the count
    assert pattern.density(n) == pytest.approx(int(expected.sum()) / (n * (n + 1) / 2))
    assert parse_pattern(pattern.spec) == pattern


def test_union_is_or_of_parts_and_roundtrips() -> None:
    p = parse_pattern("window:4+strided:3")
    assert isinstance(p, Union)
    assert torch.equal(p.mask(30), LocalWindow(4).mask(30) | Strided(3).mask(30))
    assert parse_pattern(p.spec) == p
    assert (LocalWindow(4) + Strided(3)) == p
    assert parse_pattern("window:4+dense").is_dense
    assert not p.is_dense


def test_dense_and_degenerate_cases() -> None:
    n = 17
    causal = AttentionPattern().mask(n)
    assert torch.equal(causal, torch.ones(n, n, dtype=torch.bool).tril())
    assert AttentionPattern().pairs(n) == causal_pairs(n) == n * (n + 1) // 2
    for p in [Strided(1), LocalWindow(100), BlockStrided(4, 1), Fixed(4, 4)]:
        assert torch.equal(p.mask(n), causal), p.spec
    assert LocalWindow(1).pairs(n) == n  # the diagonal only
    assert LocalWindow(5).density(1) == 1.0


def test_predicted_cost_formula() -> None:
    n, w, s = 4096, 128, 32
    p = parse_pattern(f"window:{w}+strided:{s}")
    # the article's N * (w + N/s)
    assert p.predicted_cost(n) == n * (w + n // s)
    assert LocalWindow(w).predicted_cost(n) == n * w
    assert AttentionPattern().predicted_cost(n) == n * n
    # the exact count is below the bound (each query at i reaches ~ i/s strided keys, not N/s)
    assert p.pairs(n) < p.predicted_cost(n)
    r = seed_cost_ratio(n, w, s)
    assert r["sparse"] == n * (w + n / s) and r["dense"] == n * n
    # with s fixed the speed-up tends to s, never to sqrt(N)
    assert seed_cost_ratio(1 << 20, w, s)["speedup"] == pytest.approx(s, rel=0.01)


def test_tiles_of_token_stride_vs_block_stride() -> None:
    n, bs = 1024, 128
    # a token stride of 32 puts a key in every 128-token tile: nothing to skip
    assert torch.equal(Strided(32).tiles(n, bs), AttentionPattern().tiles(n, bs))
    t = BlockStrided(128, 4).tiles(n, bs)
    expected = torch.tensor([[j <= i and (i - j) % 4 == 0 for j in range(8)] for i in range(8)])
    assert torch.equal(t, expected)
    # a window of 128 touches the diagonal tile and the one before it
    w = LocalWindow(128).tiles(n, bs)
    assert torch.equal(w, torch.eye(8, dtype=torch.bool) | torch.eye(8, dtype=torch.bool).roll(-1, dims=1).tril())
    # length not a multiple of the block: the last partial tile still counts
    assert LocalWindow(1).tiles(130, 128).shape == (2, 2)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), w=st.integers(1, 50), s=st.integers(1, 9), bs=st.integers(1, 16))
def test_tiles_cover_every_allowed_pair(n: int, w: int, s: int, bs: int) -> None:
    p = parse_pattern(f"window:{w}+strided:{s}")
    m = p.mask(n)
    t = p.tiles(n, bs)
    nb = -(-n // bs)
    padded = torch.zeros(nb * bs, nb * bs, dtype=torch.bool)
    padded[:n, :n] = m
    assert torch.equal(t, padded.view(nb, bs, nb, bs).any(3).any(1))


def test_bad_specs_and_arguments_raise_clear_errors() -> None:
    for bad in ["windw:3", "window:", "window:x", "fixed:8", "blockstride:8:2:1", "strided:-1"]:
        with pytest.raises(ValueError, match="pattern spec"):
            parse_pattern(bad)
    with pytest.raises(ValueError, match="window must be"):
        LocalWindow(0)
    with pytest.raises(ValueError, match="summary"):
        Fixed(4, 5)
    with pytest.raises(ValueError, match="length"):
        LocalWindow(3).pairs(0)


def test_allowed_broadcasts_over_positions_for_caches() -> None:
    p = parse_pattern("window:3+global:1")
    q = torch.tensor([[10], [4]])  # (B, 1) decode positions
    k = torch.tensor([[0, 7, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5]])  # (B, S)
    got = p.allowed(q, k)
    assert got.tolist() == [[True, False, True, True, True, False], [True, False, True, True, True, False]]


def test_per_layer_schedule_fits_model_config() -> None:
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=4, n_head=2,
                      attn_patterns=["dense", "dense", "window:8+blockstride:8:2", "fixed:8:2"])
    pats = [parse_pattern(cfg.pattern_for(i)) for i in range(4)]
    assert [p.is_dense for p in pats] == [True, True, False, False]
    assert ModelConfig.from_dict(cfg.to_dict()).attn_patterns == cfg.attn_patterns
