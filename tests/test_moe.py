"""Mixture of experts (codex_lab.nn.moe): routing, dispatch equivalence, capacity, losses, bias."""

from __future__ import annotations

import math

import pytest
import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.layers import SwiGLU
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe_dispatch import dispatch_grouped, dispatch_reference
from codex_lab.nn.moe import (
    MoEFeedForward, bias_update, capacity_keep_mask, expert_capacity, ffn_param_counts, load_balancing_loss, moe_layers_of, route, router_z_loss, set_dispatch_impl,
)

# fp32 outputs are O(0.1-1); the two dispatch paths sum the k expert terms in a different
# order (index_add vs running sum), which moves the last few bits only.
ATOL = 1e-5


def small_cfg(**kw: object) -> ModelConfig:
    base = dict(vocab_size=128, d_model=32, n_layer=2, n_head=4, moe_layers=[0, 1], n_experts=4,
                moe_top_k=2, moe_ffn_hidden=48)
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def randomised(moe: MoEFeedForward, seed: int) -> MoEFeedForward:
    """Weights with std 0.15: routing far from uniform, outputs O(1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    return moe


def test_route_topk_renormalised() -> None:
    torch.manual_seed(0)
    logits = torch.randn(10, 6)
    r = route(logits, 3)
    probs = torch.softmax(logits, -1)
    top = probs.topk(3, -1)
    assert torch.equal(r.expert_idx, top.indices)
    torch.testing.assert_close(r.weights, top.values / top.values.sum(-1, keepdim=True))
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(10))


def test_bias_changes_selection_not_weights() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    plain = route(logits, 1)
    assert plain.expert_idx.item() == 0
    biased = route(logits, 2, bias=torch.tensor([-10.0, 0.0, 0.0, 0.0]))
    assert sorted(biased.expert_idx[0].tolist()) == [1, 2]  # expert 0 pushed out by its bias
    p = torch.softmax(logits, -1)[0]
    expected = p[biased.expert_idx[0]] / p[biased.expert_idx[0]].sum()  # probabilities, no bias
    torch.testing.assert_close(biased.weights[0], expected)


@pytest.mark.parametrize("top_k,factor,shared", [(1, None, 0), (2, None, 1), (3, None, 0), (2, 1.0, 0), (1, 0.5, 1)])
def test_grouped_equals_reference(top_k: int, factor: float | None, shared: int) -> None:
    cfg = small_cfg(moe_top_k=top_k, moe_capacity_factor=factor, n_shared_experts=shared, n_experts=5)
    ref = randomised(MoEFeedForward(cfg, impl="reference"), seed=top_k)
    grp = MoEFeedForward(cfg, impl="grouped")
    grp.load_state_dict(ref.state_dict())
    x = torch.randn(3, 7, cfg.d_model, generator=torch.Generator().manual_seed(1))
    xr, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yg = ref(xr), grp(xg)
    torch.testing.assert_close(yg, yr, atol=ATOL, rtol=0)
    assert ref.last_stats is not None and grp.last_stats is not None
    assert ref.last_stats.dropped == grp.last_stats.dropped
    if factor is not None:
        assert grp.last_stats.dropped > 0, "these sizes must overflow some expert"
    # gradients agree too (the grouped path is used for training)
    (yr.square().sum() + ref.aux_loss).backward()
    (yg.square().sum() + grp.aux_loss).backward()
    torch.testing.assert_close(xg.grad, xr.grad, atol=ATOL, rtol=0)
    for (name, pr), (_, pg) in zip(ref.named_parameters(), grp.named_parameters()):
        assert pg.grad is not None, name
        torch.testing.assert_close(pg.grad, pr.grad, atol=1e-4, rtol=1e-4, msg=name)  # sums of ~100 O(1) terms


def test_one_expert_top1_equals_dense_swiglu() -> None:
    cfg = small_cfg(n_experts=1, moe_top_k=1)
    moe = randomised(MoEFeedForward(cfg), seed=3)
    dense = SwiGLU(cfg.d_model, 48)
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 9, cfg.d_model)
    torch.testing.assert_close(moe(x), dense(x), atol=ATOL, rtol=0)
    # the whole model too: an MoE model with one expert is the dense model
    moe_model = CodexModel(small_cfg(n_experts=1, moe_top_k=1, moe_ffn_hidden=None))
    dense_model = CodexModel(small_cfg(moe_layers=[]))
    sd = {k.replace("ffn.experts.0.", "ffn."): v for k, v in moe_model.state_dict().items()
          if "router" not in k and "expert_bias" not in k}
    dense_model.load_state_dict(sd)
    ids = torch.randint(0, 128, (2, 12))
    torch.testing.assert_close(moe_model(ids).logits, dense_model(ids).logits, atol=ATOL, rtol=0)


def test_dropless_drops_nothing() -> None:
    cfg = small_cfg(moe_capacity_factor=None)
    moe = randomised(MoEFeedForward(cfg), seed=4)
    with torch.no_grad():
        moe.router.weight[0] += 5.0  # heavy skew: expert 0 would overflow any capacity
    moe(torch.randn(4, 8, cfg.d_model).abs())
    assert moe.last_stats is not None
    assert moe.last_stats.dropped == 0 and moe.last_stats.drop_rate == 0.0
    assert moe.last_stats.capacity is None


def test_capacity_skewed_drop_count_matches_hand_computation() -> None:
    # 8 tokens, 4 experts, top-1, factor 1.0: capacity = ceil(1.0 * 8 * 1 / 4) = 2.
    # Every token prefers expert 0, so expert 0 keeps 2 and drops 8 - 2 = 6.
    cfg = small_cfg(moe_top_k=1, moe_capacity_factor=1.0, n_experts=4)
    moe = MoEFeedForward(cfg)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 10.0
    x = torch.zeros(1, 8, cfg.d_model)
    x[..., 0] = 1.0
    y = moe(x)
    s = moe.last_stats
    assert s is not None
    assert s.capacity == 2
    assert s.tokens_per_expert.tolist() == [8, 0, 0, 0]
    assert s.kept_per_expert.tolist() == [2, 0, 0, 0]
    assert s.dropped == 6 and s.drop_rate == 6 / 8
    # the two earliest tokens are served, the other six get 0 from the layer
    assert (y[0, :2].abs().sum(-1) > 0).all() and (y[0, 2:] == 0).all()


def test_capacity_priority_first_choices_before_second() -> None:
    # 4 tokens, 3 experts, top-2, factor 0.75: capacity = ceil(0.75 * 4 * 2 / 3) = 2.
    idx = torch.tensor([[0, 1], [0, 2], [1, 0], [0, 1]])  # (N, k)
    cap = expert_capacity(4, 3, 2, 0.75)
    assert cap == 2
    keep = capacity_keep_mask(idx, 3, cap)
    # first choices in token order: t0->0, t1->0 (expert 0 now full), t2->1, t3->0 (dropped)
    # second choices: t0->1 (expert 1: 2nd slot), t1->2, t2->0 (full), t3->1 (full)
    expected = torch.tensor([[True, True], [True, True], [True, False], [False, False]])
    assert torch.equal(keep, expected)
    assert torch.equal(capacity_keep_mask(idx, 3, None), torch.ones(4, 2, dtype=torch.bool))


def test_dispatch_functions_agree_on_dropped_assignments() -> None:
    torch.manual_seed(5)
    experts = torch.nn.ModuleList(SwiGLU(16, 24) for _ in range(3))
    x = torch.randn(6, 16)
    r = route(torch.randn(6, 3), 2)
    keep = torch.rand(6, 2) > 0.4
    torch.testing.assert_close(dispatch_grouped(x, r, experts, keep), dispatch_reference(x, r, experts, keep), atol=ATOL, rtol=0)
    none = torch.zeros(6, 2, dtype=torch.bool)
    assert (dispatch_grouped(x, r, experts, none) == 0).all()


def test_load_balancing_loss_values() -> None:
    E = 4
    uniform = torch.full((8, E), 1 / E)
    balanced_idx = torch.arange(8)[:, None] % E  # each expert takes 2 of 8
    assert math.isclose(float(load_balancing_loss(uniform, balanced_idx)), 1.0, rel_tol=1e-6)
    # everything to expert 0 with probability 1: f_0 = 1, P_0 = 1 -> E * 1 = 4
    collapsed = torch.zeros(8, E)
    collapsed[:, 0] = 1.0
    assert math.isclose(float(load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long))), float(E))
    # the gradient flows through P only
    logits = torch.randn(8, E, requires_grad=True)
    r = route(logits, 2)
    load_balancing_loss(r.probs, r.expert_idx).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_z_loss_value() -> None:
    # logsumexp of E zeros = log E
    assert math.isclose(float(router_z_loss(torch.zeros(5, 8))), math.log(8) ** 2, rel_tol=1e-6)


def test_aux_loss_is_weighted_sum() -> None:
    cfg = small_cfg(moe_aux_loss_coef=0.02, moe_z_loss_coef=0.001)
    moe = randomised(MoEFeedForward(cfg), seed=6)
    moe(torch.randn(2, 5, cfg.d_model))
    r = moe.last_routing
    assert r is not None
    expected = 0.02 * load_balancing_loss(r.probs, r.expert_idx) + 0.001 * router_z_loss(r.logits)
    torch.testing.assert_close(moe.aux_loss, expected)
    off = MoEFeedForward(small_cfg(moe_aux_loss_coef=0.0, moe_z_loss_coef=0.0))
    off(torch.randn(2, 5, cfg.d_model))
    assert float(off.aux_loss) == 0.0
    # the model sums the layers' aux losses
    model = CodexModel(cfg)
    out = model(torch.randint(0, 128, (2, 6)))
    total = sum(float(m.aux_loss.detach()) for m in moe_layers_of(model))
    assert math.isclose(float(out.aux_loss.detach()), total, rel_tol=1e-6)


def test_bias_update_direction_and_training_balances() -> None:
    step = bias_update(torch.tensor([10, 2, 2, 2]), 0.01)
    assert step.tolist() == pytest.approx([-0.01, 0.01, 0.01, 0.01])
    cfg = small_cfg(moe_router_bias=True, moe_aux_loss_coef=0.0, moe_top_k=1)
    moe = randomised(MoEFeedForward(cfg, bias_update_rate=0.01), seed=7)
    x = torch.randn(64, cfg.d_model, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        moe.router.weight[0, 0] = 2.0  # expert 0 is nearly everyone's favourite
    x[:, 0] = x[:, 0].abs() + 0.5
    moe.train()
    moe(x[None])
    assert moe.last_stats is not None
    first = moe.last_stats.max_load_ratio
    for _ in range(60):
        moe(x[None])
    assert moe.expert_bias[0] < 0 < moe.expert_bias[1:].min()
    assert moe.last_stats.max_load_ratio < first / 2, (first, moe.last_stats.max_load_ratio)
    # no update in eval mode or without gradients
    before = moe.expert_bias.clone()
    moe.eval()
    moe(x[None])
    assert torch.equal(before, moe.expert_bias)


def test_set_dispatch_impl_and_bad_input() -> None:
    model = CodexModel(small_cfg())
    set_dispatch_impl(model, "reference")
    assert all(m.impl == "reference" for m in moe_layers_of(model))
    with pytest.raises(ValueError, match="choose one of"):
        set_dispatch_impl(model, "fast")
    with pytest.raises(ValueError, match="choose one of"):
        MoEFeedForward(small_cfg(), impl="loop")
    with pytest.raises(ValueError, match="top_k"):
        route(torch.randn(3, 4), 5)
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(8, 4, 2, 0.0)
    with pytest.raises(ValueError, match="batch dimension"):
        MoEFeedForward(small_cfg())(torch.randn(5, 32))
    with pytest.raises(ValueError, match="tokens, experts"):
        route(torch.randn(2, 3, 4), 2)


def test_param_counts() -> None:
    cfg = small_cfg(n_experts=8, moe_top_k=2, n_shared_experts=1, d_model=32, moe_ffn_hidden=48)
    c = ffn_param_counts(cfg)
    moe = MoEFeedForward(cfg)
    assert c["total"] == sum(p.numel() for p in moe.parameters())
    assert c["active"] == 32 * 8 + 3 * (3 * 32 * 48)


def test_bench_records_are_flat_and_equal() -> None:
    from codex_lab.lessons.l04_moe.bench import bench_case, parse_sizes

    rows = bench_case(64, 4, 2, d_model=32, hidden=48, repeats=1, device=torch.device("cpu"))
    assert [r["impl"] for r in rows] == ["reference", "grouped", "grouped_torch", "hf_eager", "hf_grouped_mm"]
    assert rows[1]["kernel"] == "native"  # the grouped row says which path ran (the CI machines build it)
    for r in rows:
        assert {"impl", "tokens", "experts", "top_k", "median_ms", "max_abs_diff"} <= set(r)
        assert all(isinstance(v, (int, float, str)) for v in r.values())
        assert r["max_abs_diff"] < ATOL, r
        assert r["active_params"] < r["total_params"]
        assert 0 < r["min_ms"] <= r["median_ms"] and isinstance(r["load_avg_1m"], float)
    grouped = rows[1]
    assert grouped["fastest_hf"] in ("hf_eager", "hf_grouped_mm")
    fastest = next(r for r in rows if r["impl"] == grouped["fastest_hf"])
    # speed-up = fastest HF ms / grouped ms, the goal; the _best variant on min times
    assert grouped["speedup_vs_fastest_hf"] == pytest.approx(fastest["median_ms"] / grouped["median_ms"], abs=2e-3)
    assert grouped["speedup_vs_fastest_hf_best"] > 0
    assert parse_sizes("128:8:2, 64:16:4") == [(128, 8, 2), (64, 16, 4)]
    with pytest.raises(ValueError, match="TOKENS:EXPERTS:TOP_K"):
        parse_sizes("128x8")
    with pytest.raises(ValueError, match="top_k"):
        parse_sizes("128:2:4")


def test_code_token_categories_and_mutual_information(small_tokenizer) -> None:
    from codex_lab.lessons.l04_moe.experiments import (char_categories, expert_by_category, mutual_information,
                                           shuffled_mutual_information, token_categories)

    src = 'def f(x):\n    return "hi" + 42  # note\n'
    cats = char_categories(src)
    assert cats[src.index("def")] == "keyword" and cats[src.index("f(")] == "name"
    assert cats[src.index('"hi"')] == "string" and cats[src.index("42")] == "number"
    assert cats[src.index("# note")] == "comment" and cats[src.index("+")] == "operator"
    assert cats[src.index("    return")] == "indent"
    ids, tcats = token_categories(small_tokenizer, src)
    assert len(ids) == len(tcats) and small_tokenizer.decode(ids) == src
    assert {"keyword", "name", "string", "number", "comment"} <= set(tcats)
    # MI: a perfectly specialised table has MI = log(#kinds); independence gives 0
    diag = torch.diag(torch.full((4,), 25))
    assert math.isclose(mutual_information(diag), math.log(4), rel_tol=1e-9)
    assert abs(mutual_information(torch.full((3, 5), 7))) < 1e-12
    assert shuffled_mutual_information(diag) < 0.2 * math.log(4)
    cfg = small_cfg(vocab_size=small_tokenizer.vocab_size, max_seq_len=16)
    counts = expert_by_category(CodexModel(cfg), 0, ids, tcats)
    assert counts.shape == (8, cfg.n_experts) and int(counts.sum()) == len(ids)


def test_train_run_logs_routing_stats() -> None:
    from codex_lab.data.batches import fixed_batches
    from codex_lab.lessons.l04_moe.experiments import train_run
    from codex_lab.nn.accounting import ffn_counts

    tokens = torch.randint(0, 128, (2000,), generator=torch.Generator().manual_seed(0))
    cfg = small_cfg(moe_router_bias=True, moe_aux_loss_coef=0.0)
    res = train_run("bias", cfg, tokens, fixed_batches(tokens, 2, 16, 1), steps=3, batch_size=2, seq_len=16,
                    bias_update_rate=0.01, eval_every=2)
    assert [c["step"] for c in res.curve] == [2, 3] and res.curve[-1]["val_loss"] == res.val_loss
    # 6 * active * tokens, active = all parameters minus the 2 unchosen experts of each of 2 layers
    assert res.active_params == res.model.num_params() - 2 * 2 * 3 * 32 * 48
    assert res.curve[0]["train_flops"] == 6.0 * res.active_params * 2 * 2 * 16
    assert [h["step"] for h in res.history] == [1, 2, 3]
    assert {"loss", "max_load", "load_entropy", "router_entropy", "drop_rate"} <= set(res.history[0])
    assert math.isfinite(res.val_loss)
    assert all(float(m.expert_bias.abs().sum()) > 0 for m in moe_layers_of(res.model))  # 3 sign steps taken
    dense_active, dense_total = ffn_counts(small_cfg(moe_layers=[], ffn_hidden=96))
    assert dense_active == dense_total == 2 * 3 * 32 * 96
    assert res.active_ffn_params == dense_active + 2 * 32 * 4  # routers only on top


def test_checkpoint_round_trip_keeps_experts_and_bias(small_tokenizer, tmp_path) -> None:
    from codex_lab.training.checkpoint import load_checkpoint, save_checkpoint

    cfg = small_cfg(vocab_size=small_tokenizer.vocab_size, moe_layers=[1], moe_router_bias=True, n_shared_experts=1)
    model = CodexModel(cfg).eval()
    model.layers[1].ffn.expert_bias[2] = 0.3  # the bias is state: it must survive saving
    save_checkpoint(tmp_path / "ck", model, small_tokenizer)
    loaded = load_checkpoint(tmp_path / "ck").model
    assert float(loaded.layers[1].ffn.expert_bias[2]) == pytest.approx(0.3)
    ids = torch.randint(0, cfg.vocab_size, (2, 10))
    assert torch.equal(loaded(ids).logits, model(ids).logits)
