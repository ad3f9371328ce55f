"""MoE dispatch (codex_lab.nn.moe_dispatch): the grouped fast paths held to the reference loop.

Inference (no gradient) runs on stacked weights, through the fused native kernel (fp32 on a
CPU) or the tiled torch path: every test here runs once with each (the ``inference_path``
fixture); training runs each expert module on its group. Both must give the reference's output, and training its gradients,
including the edge cases: an expert that gets no tokens, top_k = n_experts, one token,
every assignment dropped, groups split over several tiles.
"""

from __future__ import annotations

import pytest
import torch

import codex_lab.nn.moe_dispatch as md
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.moe import MoEFeedForward, Routing, capacity_keep_mask, expert_capacity, route, routing_stats
from codex_lab.nn.moe_dispatch import dispatch_grouped, dispatch_reference, sort_by_expert, stacked_weights

# fp32, outputs O(0.1-1): the paths differ only in summation order (a token's k terms added
# in expert order by index_add_ vs in choice order by the loop; matmuls over many rows vs one
# row, which MKL blocks differently over the d or h reduction), i.e. a few ulps, ~1e-7 each;
# 1e-5 is ~50x that and still far below any real mistake (a wrong weight or expert is O(0.1)).
ATOL = 1e-5
# parameter gradients sum ~N*k O(1) terms in different orders: relative 1e-4 (as test_moe)
GRAD_TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True, params=["native", "torch"])
def inference_path(request, monkeypatch) -> str:
    """Every test once through the native kernel and once through the torch path."""
    from codex_lab.nn.moe_native import moe_native_status

    if request.param == "native":
        # the CI and course machines have a C compiler: a kernel that does not build fails here
        assert moe_native_status() == "", moe_native_status()
    else:
        monkeypatch.setattr(md, "moe_native_status", lambda: "disabled by the test")
    return request.param


def layer(n_experts: int = 4, top_k: int = 2, d: int = 24, hidden: int = 40, capacity: float | None = None,
          seed: int = 0) -> tuple[MoEFeedForward, MoEFeedForward]:
    """A grouped layer and a reference layer with the same random weights (std 0.15)."""
    cfg = ModelConfig(vocab_size=16, d_model=d, n_layer=1, n_head=1, moe_layers=[0], n_experts=n_experts,
                      moe_top_k=top_k, moe_ffn_hidden=hidden, moe_capacity_factor=capacity)
    fast = MoEFeedForward(cfg, impl="grouped")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fast.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    ref = MoEFeedForward(cfg, impl="reference")
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def check_forward_and_backward(fast: MoEFeedForward, ref: MoEFeedForward, x: torch.Tensor) -> None:
    """Inference outputs equal; training outputs, input and parameter gradients equal."""
    with torch.no_grad():
        torch.testing.assert_close(fast(x), ref(x), atol=ATOL, rtol=0)
    xf, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    yf, yr = fast(xf), ref(xr)
    torch.testing.assert_close(yf, yr, atol=ATOL, rtol=0)
    yf.square().sum().backward()
    yr.square().sum().backward()
    torch.testing.assert_close(xf.grad, xr.grad, atol=ATOL, rtol=0)
    for (name, pf), (_, pr) in zip(fast.named_parameters(), ref.named_parameters()):
        if pr.grad is None:  # an expert the reference never called: the fast path skipped it too
            assert pf.grad is None or not pf.grad.any(), name
        else:
            assert pf.grad is not None, name
            torch.testing.assert_close(pf.grad, pr.grad, **GRAD_TOL, msg=name)


@pytest.mark.parametrize("n_experts,top_k,tokens", [(4, 2, 37), (8, 1, 50), (6, 3, 29), (16, 4, 64)])
def test_fast_paths_equal_reference(n_experts: int, top_k: int, tokens: int) -> None:
    fast, ref = layer(n_experts, top_k, seed=n_experts + top_k)
    x = torch.randn(1, tokens, 24, generator=torch.Generator().manual_seed(tokens))
    check_forward_and_backward(fast, ref, x)


def test_expert_with_no_tokens() -> None:
    fast, ref = layer(n_experts=5, top_k=2, seed=1)
    with torch.no_grad():  # expert 3's router logit is hugely negative: nobody picks it
        for m in (fast, ref):
            m.router.weight[3] = -50.0
    x = torch.randn(2, 11, 24).abs()  # positive inputs: logit of expert 3 = -50 * sum(x) << others
    with torch.no_grad():
        fast(x)
    assert fast.last_stats is not None and fast.last_stats.tokens_per_expert[3] == 0
    check_forward_and_backward(fast, ref, x)


def test_top_k_equals_n_experts() -> None:
    fast, ref = layer(n_experts=3, top_k=3, seed=2)
    check_forward_and_backward(fast, ref, torch.randn(2, 9, 24))


def test_one_token() -> None:
    fast, ref = layer(n_experts=4, top_k=2, seed=3)
    check_forward_and_backward(fast, ref, torch.randn(1, 1, 24))


def test_capacity_drops_and_all_dropped() -> None:
    fast, ref = layer(n_experts=4, top_k=2, capacity=0.5, seed=4)
    x = torch.randn(2, 13, 24)
    with torch.no_grad():
        fast(x)
    assert fast.last_stats is not None and fast.last_stats.dropped > 0, "factor 0.5 must drop some"
    check_forward_and_backward(fast, ref, x)
    # every assignment dropped: both paths return exact zeros, with and without gradients
    experts = fast.experts
    r = route(torch.randn(5, 4), 2)
    none = torch.zeros(5, 2, dtype=torch.bool)
    xs = torch.randn(5, 24)
    with torch.no_grad():
        assert torch.equal(dispatch_grouped(xs, r, experts, none), torch.zeros(5, 24))
    assert torch.equal(dispatch_grouped(xs, r, experts, none), torch.zeros(5, 24))
    assert torch.equal(dispatch_reference(xs, r, experts, none), torch.zeros(5, 24))


def test_groups_split_over_many_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 rows per tile (torch path) or per piece (native): every group spans several tiles or
    # pieces and most end in a partial one
    import codex_lab.nn.moe_native as mn

    monkeypatch.setattr(md, "TILE_ROWS_PER_THREAD", 3)
    monkeypatch.setattr(mn, "PIECE_ROWS", 3)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    fast, ref = layer(n_experts=4, top_k=2, seed=5)
    x = torch.randn(1, 41, 24)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), ref(x), atol=ATOL, rtol=0)


def test_inference_uses_stacked_kernel_and_training_uses_modules(monkeypatch: pytest.MonkeyPatch,
                                                                 inference_path: str) -> None:
    """The fast path really runs (not a silent fallback), and only where no gradient is needed."""
    calls: list[int] = []
    name = "moe_swiglu_native" if inference_path == "native" else "_experts_tiled"
    real = getattr(md, name)

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(md, name, counting)
    fast, _ = layer(seed=6)
    x = torch.randn(1, 10, 24)
    with torch.no_grad():
        fast(x)
    assert calls == [1]
    fast(x).sum().backward()  # parameters require grad: the module loop, gradients flow
    assert calls == [1]
    assert any(p.grad is not None and p.grad.any() for p in fast.experts.parameters())
    for p in fast.parameters():  # nothing requires grad (a frozen model): the kernel again
        p.requires_grad_(False)
    fast(x)
    assert calls == [1, 1]


def test_stacked_weights_follow_every_change() -> None:
    fast, ref = layer(seed=7)
    x = torch.randn(1, 12, 24)
    with torch.no_grad():
        first = stacked_weights(fast.experts)
        assert stacked_weights(fast.experts)[0] is first[0]  # cached while nothing changes
        fast.experts[2].down_proj.weight.mul_(-1.5)  # in place: the version counter moves
        ref.experts[2].down_proj.weight.mul_(-1.5)
        torch.testing.assert_close(fast(x), ref(x), atol=ATOL, rtol=0)
        other, _ = layer(seed=8)  # load_state_dict copies in place too
        fast.load_state_dict(other.state_dict())
        ref.load_state_dict(other.state_dict())
        torch.testing.assert_close(fast(x), ref(x), atol=ATOL, rtol=0)
        w_gate, w_up, w_down = stacked_weights(fast.experts)
        assert torch.equal(w_gate[1], fast.experts[1].gate_proj.weight.t())
        assert torch.equal(w_up[3], fast.experts[3].up_proj.weight.t())
        assert torch.equal(w_down[0], fast.experts[0].down_proj.weight.t())


def test_sort_by_expert_groups_kept_assignments() -> None:
    idx = torch.tensor([[2, 0], [0, 1], [2, 1]])  # (N=3, k=2)
    w = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]])
    r = Routing(logits=torch.zeros(3, 3), probs=torch.zeros(3, 3), expert_idx=idx, weights=w)
    token, weight, counts = sort_by_expert(r, 4)
    # expert 0: tokens 0, 1; expert 1: tokens 1, 2; expert 2: tokens 0, 2; expert 3: none
    assert counts == [2, 2, 2, 0]
    assert token.tolist() == [0, 1, 1, 2, 0, 2]
    assert weight.tolist() == pytest.approx([0.4, 0.7, 0.3, 0.1, 0.6, 0.9])
    keep = torch.tensor([[True, False], [True, True], [False, True]])
    token, weight, counts = sort_by_expert(r, 4, keep)
    assert counts == [1, 2, 1, 0] and token.tolist() == [1, 1, 2, 0]


def test_last_stats_are_those_of_the_last_forward() -> None:
    fast, _ = layer(n_experts=4, top_k=2, capacity=0.75, seed=9)
    xa, xb = torch.randn(1, 16, 24), torch.randn(2, 5, 24) * 3
    fast(xa)
    fast(xb)  # stats computed lazily must still describe xb, not xa
    r = fast.last_routing
    assert r is not None and r.expert_idx.shape == (10, 2)
    cap = expert_capacity(10, 4, 2, 0.75)
    want = routing_stats(r, capacity_keep_mask(r.expert_idx, 4, cap), 4, cap)
    got = fast.last_stats
    assert got is not None
    assert torch.equal(got.tokens_per_expert, want.tokens_per_expert)
    assert torch.equal(got.kept_per_expert, want.kept_per_expert)
    assert (got.dropped, got.capacity) == (want.dropped, want.capacity)
    assert got.load_entropy == pytest.approx(want.load_entropy)
    assert got.router_entropy == pytest.approx(want.router_entropy)
    assert layer(seed=11)[0].last_stats is None  # before any forward


def test_non_swiglu_experts_use_the_module_loop() -> None:
    torch.manual_seed(10)
    experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(3))
    x = torch.randn(7, 8)
    r = route(torch.randn(7, 3), 2)
    with torch.no_grad():
        torch.testing.assert_close(dispatch_grouped(x, r, experts), dispatch_reference(x, r, experts), atol=ATOL, rtol=0)


def test_tile_segments_cover_every_group_in_order() -> None:
    from codex_lab.nn.moe_dispatch import tile_segments

    # hand-checked: groups of 3, 0, 5, 1 rows in tiles of 4; expert 2's 5 rows split 3 + 2
    assert tile_segments([3, 0, 5, 1], 4) == [(0, 3, [(0, 0, 3)]), (3, 3, [(2, 0, 3)]), (6, 3, [(2, 0, 2), (3, 2, 3)])]
    assert tile_segments([0, 0], 4) == []
    rng = torch.Generator().manual_seed(0)
    for _ in range(300):
        counts = torch.randint(0, 40, (int(torch.randint(1, 10, (1,), generator=rng)),), generator=rng).tolist()
        tile = int(torch.randint(1, 50, (1,), generator=rng))
        got = [0] * len(counts)
        pos, order = 0, []
        for start, rows, segs in tile_segments(counts, tile):
            assert start == pos and 0 < rows <= tile  # tiles are contiguous and never too big
            assert segs[0][1] == 0 and segs[-1][2] == rows  # segments fill the tile exactly
            for (e, lo, hi), nxt in zip(segs, segs[1:] + [None]):
                assert hi > lo and (nxt is None or nxt[1] == hi)
                got[e] += hi - lo
                order.append(e)
            pos += rows
        assert got == counts and order == sorted(order), (counts, tile)  # every row once, experts in order
        # a group split over tiles gets near-equal pieces (sizes differ by at most one row)
        for e, c in enumerate(counts):
            if c > tile:
                sizes = [hi - lo for _, _, segs in tile_segments([c], tile) for _, lo, hi in segs]
                assert max(sizes) - min(sizes) <= 1, (c, tile, sizes)

