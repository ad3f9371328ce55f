"""Grouped-query attention: fast == reference kernels, GQA == expanded MHA, KV bytes ==
formula on real cache tensors, mean-pool conversion, uptraining, the experiment."""

from __future__ import annotations

from codex_lab.runtime.mode import Mode
import pytest
import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.lessons.l03_gqa.bench import decode_tokens_per_s
from codex_lab.lessons.l03_gqa.experiments import group_size_experiment
from codex_lab.nn.accounting import kv_bytes_per_token, kv_cache_bytes, kv_saving, measured_cache_bytes
from codex_lab.nn.surgery import mean_pool_heads, mha_to_gqa
from codex_lab.training.evaluate import val_loss
from codex_lab.training.pretrain import uptrain
from codex_lab.nn.kv_cache import make_dynamic_caches
from codex_lab.nn.attention import attention_reference, attention_sdpa
from codex_lab.nn.model import CodexModel

# fp32 attention outputs are O(1); fused and explicit kernels sum in different orders,
# which moves results by ~1e-7 relative: 1e-5 (CONTRIBUTING.md) is the repo's fp32 bound.
ATOL = 1e-5


def tiny(n_kv_head: int | None = None, n_head: int = 4, **kw: object) -> CodexModel:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=128, d_model=64, n_layer=2, n_head=n_head, n_kv_head=n_kv_head, max_seq_len=128, **kw)
    return CodexModel(cfg).eval()


@pytest.mark.parametrize("h_kv", [8, 4, 2, 1])
@pytest.mark.parametrize("T,S", [(7, 7), (1, 13), (5, 16)])
def test_sdpa_equals_reference_for_every_group_size(h_kv: int, T: int, S: int) -> None:
    g = torch.Generator().manual_seed(h_kv * 100 + T)
    q = torch.randn(2, 8, T, 16, generator=g)  # (B, H, T, D)
    k = torch.randn(2, h_kv, S, 16, generator=g)  # (B, Hkv, S, D)
    v = torch.randn(2, h_kv, S, 16, generator=g)
    mask = torch.rand(2, 1, T, S, generator=g) > 0.3
    mask[..., 0] = True  # every query row sees at least one key (SDPA returns NaN otherwise)
    torch.testing.assert_close(attention_sdpa(q, k, v, mask), attention_reference(q, k, v, mask), atol=ATOL, rtol=0)
    if T == S:  # the model uses is_causal only for uncached T == S (SDPA aligns it top-left)
        torch.testing.assert_close(attention_sdpa(q, k, v, None, is_causal=True),
                                   attention_reference(q, k, v, None, is_causal=True), atol=ATOL, rtol=0)
    # the reference is GQA by definition: query head h reads K/V head h // g
    rep = attention_reference(q, k.repeat_interleave(8 // h_kv, 1), v.repeat_interleave(8 // h_kv, 1), mask)
    torch.testing.assert_close(attention_reference(q, k, v, mask), rep, atol=0, rtol=0)


def test_fast_path_does_not_repeat_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("the SDPA path materialised repeated K/V")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", boom)
    monkeypatch.setattr(torch.Tensor, "expand", boom)
    q, k, v = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    assert attention_sdpa(q, k, v, None, is_causal=True).shape == (1, 8, 5, 16)
    with pytest.raises(AssertionError, match="materialised"):
        attention_reference(q, k, v, None, is_causal=True)


def expand_to_mha(model: CodexModel) -> CodexModel:
    """The MHA model that repeats each K/V head g times: the same function as the GQA one."""
    cfg = model.cfg
    big = CodexModel(ModelConfig.from_dict({**cfg.to_dict(), "n_kv_head": cfg.n_head})).eval()
    sd = {}
    for name, t in model.state_dict().items():
        if ".k_proj." in name or ".v_proj." in name:
            t = t.reshape(cfg.n_kv_head, cfg.head_dim, *t.shape[1:]).repeat_interleave(cfg.group_size, 0)
            t = t.reshape(cfg.n_head * cfg.head_dim, *t.shape[2:])
        sd[name] = t
    big.load_state_dict(sd)
    return big


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_gqa_model_equals_its_expanded_mha(n_kv: int, impl: str) -> None:
    gqa = tiny(n_kv, attn_impl=impl, qkv_bias=True)
    with torch.no_grad():
        for n, p in gqa.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.3)
    mha = expand_to_mha(gqa)
    x = torch.randint(0, 128, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(gqa(x).logits, mha(x).logits, atol=ATOL, rtol=0)
        # pooling g identical heads gives them back: conversion of the expansion is exact
        back = mha_to_gqa(mha, n_kv)
        torch.testing.assert_close(back(x).logits, gqa(x).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("n_kv", [1, 2])
def test_cached_decode_equals_uncached_with_gqa(n_kv: int) -> None:
    m = tiny(n_kv)
    x = torch.randint(0, 128, (3, 20))
    with torch.no_grad():
        full = m(x).logits  # (B, T, V)
        caches = make_dynamic_caches(2)
        parts = [m(x[:, :9], caches=caches).logits]  # multi-token prefill
        parts += [m(x[:, t : t + 1], caches=caches).logits for t in range(9, 20)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("n_head,n_kv", [(4, 4), (4, 2), (4, 1), (8, 2), (8, 1)])
@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 17)])
def test_kv_bytes_formula_equals_real_cache_tensors(n_head: int, n_kv: int, batch: int, seq: int) -> None:
    m = tiny(n_kv, n_head=n_head)
    # 2 (K,V) * 2 layers * n_kv heads * head_dim * seq * batch * 4 bytes, written out
    assert kv_cache_bytes(m.cfg, batch, seq) == 2 * 2 * n_kv * (64 // n_head) * seq * batch * 4
    assert measured_cache_bytes(m, batch, seq) == kv_cache_bytes(m.cfg, batch, seq, torch.float32)
    m16 = m.to(torch.bfloat16)
    assert measured_cache_bytes(m16, batch, seq) == kv_cache_bytes(m.cfg, batch, seq, torch.bfloat16)


def test_kv_saving_is_one_minus_one_over_g() -> None:
    mha = tiny(8, n_head=8)
    for g, expected in [(1, 0.0), (2, 0.5), (4, 0.75), (8, 0.875)]:
        gqa = tiny(8 // g, n_head=8)
        measured = 1 - measured_cache_bytes(gqa, 2, 10) / measured_cache_bytes(mha, 2, 10)
        assert measured == expected == kv_saving(g)
    assert kv_bytes_per_token(mha.cfg, torch.bfloat16) == 2 * 2 * 8 * 8 * 2
    with pytest.raises(ValueError, match="group size"):
        kv_saving(0)
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_bytes(mha.cfg, 1, -1)


def test_mean_pool_by_hand() -> None:
    w = torch.arange(4 * 3 * 5, dtype=torch.float32).reshape(4 * 3, 5)  # 4 heads of width 3
    pooled = mean_pool_heads(w, 4, 2)
    assert pooled.shape == (2 * 3, 5)
    torch.testing.assert_close(pooled[:3], (w[0:3] + w[3:6]) / 2, atol=0, rtol=0)
    torch.testing.assert_close(pooled[3:], (w[6:9] + w[9:12]) / 2, atol=0, rtol=0)
    b = torch.arange(12, dtype=torch.float32)
    assert mean_pool_heads(b, 4, 1).tolist() == [4.5, 5.5, 6.5]
    with pytest.raises(ValueError, match="divide"):
        mean_pool_heads(w, 4, 3)


def test_mha_to_gqa_pools_kv_and_copies_the_rest() -> None:
    m = tiny(4)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    new = mha_to_gqa(m, 2)
    assert new is not m and new.cfg.n_kv_head == 2 and m.cfg.n_kv_head == 4
    for name, t in m.state_dict().items():
        assert torch.equal(t, before[name]), f"input model changed: {name}"
        if ".k_proj." in name or ".v_proj." in name:
            assert torch.equal(new.state_dict()[name], mean_pool_heads(t, 4, 2))
        else:
            assert torch.equal(new.state_dict()[name], t)
    assert torch.equal(mha_to_gqa(m, 4).state_dict()["layers.0.attn.k_proj.weight"], m.layers[0].attn.k_proj.weight)
    # GQA -> fewer groups works too and equals going there directly
    torch.testing.assert_close(mha_to_gqa(new, 1).layers[1].attn.v_proj.weight, mha_to_gqa(m, 1).layers[1].attn.v_proj.weight)
    with pytest.raises(ValueError, match="must divide"):
        mha_to_gqa(new, 4)


def test_uptrain_lowers_loss_and_experiment_reports_every_g() -> None:
    torch.manual_seed(1)
    # a learnable stream: a repeated random sequence of 50 tokens
    tokens = torch.randint(0, 128, (50,)).repeat(20)
    val = [(tokens[:32].view(2, 16), tokens[1:33].view(2, 16))]
    m = tiny(4)
    before = val_loss(m, val)
    losses = uptrain(m, tokens, steps=20, batch_size=4, seq_len=16, lr=3e-3)
    assert len(losses) == 20 and val_loss(m, val) < before - 0.5
    rows = group_size_experiment(m, tokens, val, group_sizes=(1, 2, 4), steps=3, batch_size=4, seq_len=16,
                                 decode_batch=2, decode_prompt=8, decode_tokens=2)
    assert [r["g"] for r in rows] == [1, 2, 4] and [r["n_kv_head"] for r in rows] == [4, 2, 1]
    assert [r["kv_saving"] for r in rows] == [0.0, 0.5, 0.75]
    assert rows[0]["val_loss_converted"] == pytest.approx(val_loss(m, val), abs=1e-6)  # g=1: no conversion
    assert all(r["decode_tok_s"] > 0 and r["kv_bytes_per_token"] > 0 for r in rows)
    with pytest.raises(ValueError, match="do not divide"):
        group_size_experiment(m, tokens, val, group_sizes=(8,), steps=1)
    assert decode_tokens_per_s(m, batch=1, prompt_len=4, new_tokens=2, repeats=1) > 0


def test_bench_gqa_records_and_bad_groups() -> None:
    import argparse

    from codex_lab.lessons.l03_gqa import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--groups", "1,4", "--heads", "4", "--d-model", "32", "--layers", "1", "--batch", "2",
                         "--context", "6", "--steps", "1", "--repeats", "1", "--device", "cpu"])
    args.mode = Mode("fast")  # as the command line hands it over
    rows = bench.run(args)
    assert [r["kv_heads"] for r in rows] == [4, 1]
    assert [r["kv_bytes"] for r in rows] == [2 * 1 * 4 * 8 * 6 * 2 * 4, 2 * 1 * 1 * 8 * 6 * 2 * 4]
    assert rows[0]["speedup_vs_g1"] == 1.0 and all(r["tokens_per_s"] > 0 for r in rows)
    with pytest.raises(ValueError, match="must divide --heads=8"):
        bench.parse_groups("1,3", 8)
    with pytest.raises(ValueError, match="comma-separated integers"):
        bench.parse_groups("1,x", 8)
