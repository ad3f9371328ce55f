"""Sparse kernels against an independent dense reference; the model's sparse path."""

from __future__ import annotations

from codex_lab.runtime.mode import Mode
import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.kv_cache import make_dynamic_caches
from codex_lab.nn.model import CodexModel
from codex_lab.nn.patterns import AttentionPattern, parse_pattern
from codex_lab.nn.sparse import sparse_attention, tiles_computed

# fp32 attention: outputs are O(1) and the summation order differs between paths
ATOL = 1e-5

SPECS = ["dense", "window:5", "window:1", "window:300", "strided:1", "strided:3", "fixed:8:2", "global:3",
         "blockstride:8:2", "window:7+strided:4", "window:8+blockstride:8:3", "global:2+fixed:4:1"]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Independent oracle: Python loop over queries, softmax over the allowed keys only."""
    B, H, N, D = q.shape
    g = H // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(H):
        kh, vh = k[:, h // g], v[:, h // g]  # (B, N, D)
        for i in range(N):
            idx = torch.nonzero(allowed[i]).flatten()
            if idx.numel() == 0:
                continue
            s = (q[:, h, i, None, :] * kh[:, idx]).sum(-1) / math.sqrt(D)  # (B, |idx|)
            out[:, h, i] = (torch.softmax(s, -1)[:, :, None] * vh[:, idx]).sum(1)
    return out


def rand_qkv(B: int, H: int, Hkv: int, N: int, D: int, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)]


@pytest.mark.parametrize("spec", SPECS)
def test_reference_and_blocks_equal_naive_oracle(spec: str) -> None:
    q, k, v = rand_qkv(2, 4, 2, 21, 8, seed=1)  # N=21 is not a multiple of the block (8)
    want = naive_attention(q, k, v, parse_pattern(spec).mask(21))
    ref = sparse_attention(q, k, v, spec, impl="reference")
    blk = sparse_attention(q, k, v, spec, impl="blocks", block=8)
    torch.testing.assert_close(ref, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(blk, want, atol=ATOL, rtol=0)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 45), block=st.sampled_from([1, 4, 8, 16, 64]), hkv=st.sampled_from([1, 2, 4]),
    spec=st.sampled_from(SPECS + ["window:2+strided:2+global:1", "blockstride:4:1", "fixed:3:3"]),
)
def test_blocks_equals_reference_property(n: int, block: int, hkv: int, spec: str) -> None:
    q, k, v = rand_qkv(1, 4, hkv, n, 8, seed=n)
    ref = sparse_attention(q, k, v, spec, impl="reference")
    blk = sparse_attention(q, k, v, spec, impl="blocks", block=block)
    torch.testing.assert_close(blk, ref, atol=ATOL, rtol=0)


def test_one_token() -> None:
    q, k, v = rand_qkv(1, 2, 2, 1, 4)
    for impl in ("reference", "blocks"):
        out = sparse_attention(q, k, v, "window:4+strided:2", impl=impl)
        torch.testing.assert_close(out, v, atol=ATOL, rtol=0)  # one key: the output is its value


def test_blocks_gradients_equal_reference() -> None:
    spec = "window:6+blockstride:4:3"
    q1, k1, v1 = rand_qkv(2, 4, 2, 30, 8, seed=3, grad=True)
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q1, k1, v1))
    w = torch.randn(2, 4, 30, 8)
    (sparse_attention(q1, k1, v1, spec, impl="reference") * w).sum().backward()
    (sparse_attention(q2, k2, v2, spec, impl="blocks", block=4) * w).sum().backward()
    for a, b in [(q1, q2), (k1, k2), (v1, v2)]:
        torch.testing.assert_close(b.grad, a.grad, atol=ATOL, rtol=0)


@dataclass(frozen=True)
class SkipRows(AttentionPattern):
    """Test-only pattern: queries 5..12 see no key at all (the first of them fills a whole block)."""

    @property
    def is_dense(self) -> bool:
        return False

    def allowed(self, q_pos, k_pos):
        return (k_pos <= q_pos) & ((q_pos < 5) | (q_pos > 12))


def test_fully_masked_rows_are_zero_not_nan_forward_and_backward() -> None:
    q, k, v = rand_qkv(1, 2, 1, 20, 4, grad=True)
    for impl, kw in [("reference", {}), ("blocks", {"block": 4}), ("fast", {"block": 4})]:
        out = sparse_attention(q, k, v, SkipRows(), impl=impl, **kw)
        assert not out.isnan().any(), impl
        assert (out[:, :, 5:13] == 0).all(), impl
        out.sum().backward()
        assert all(not t.grad.isnan().any() for t in (q, k, v)), impl
        q.grad = k.grad = v.grad = None
    want = naive_attention(q.detach(), k.detach(), v.detach(), SkipRows().mask(20))
    torch.testing.assert_close(sparse_attention(q, k, v, SkipRows(), impl="blocks", block=4), want, atol=ATOL, rtol=0)


def test_fast_kernel_matches_reference_on_rows_without_keys_with_gradients() -> None:
    """The fast kernel's log-sum-exp merge must give the reference's outputs and gradients
    where whole query rows (and one whole block) see no key."""
    grads = {}
    for impl in ("reference", "fast"):
        q, k, v = rand_qkv(1, 2, 1, 20, 4, grad=True)
        w = torch.randn(1, 2, 20, 4, generator=torch.Generator().manual_seed(1))
        out = sparse_attention(q, k, v, SkipRows(), impl=impl, block=4)
        (out * w).sum().backward()
        grads[impl] = (out.detach(), q.grad, k.grad, v.grad)
    for name, a, b in zip(("out", "dq", "dk", "dv"), grads["fast"], grads["reference"]):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=name)


def test_blocks_computes_only_touched_tiles() -> None:
    # window 128 + every 4th block at N=1024, 128-token tiles: 8 diagonal + 7 window + strided
    n = 1024
    p = parse_pattern("window:128+blockstride:128:4")
    strided = sum(len(range(i - 4, -1, -4)) for i in range(8))  # tiles 4, 8, ... blocks back
    want = 8 + 7 + sum(1 for i in range(8) for j in range(i - 4, -1, -4) if j != i - 1)
    assert strided == 4 and tiles_computed(p, n) == want
    assert tiles_computed("strided:32", n) == 36  # every causal tile: a token stride skips nothing


def test_bad_input_raises_clear_errors() -> None:
    q, k, v = rand_qkv(1, 4, 3, 8, 4)
    with pytest.raises(ValueError, match="must divide"):
        sparse_attention(q, k, v, "dense")
    q, k, v = rand_qkv(1, 4, 2, 8, 4)
    with pytest.raises(ValueError, match="impl="):
        sparse_attention(q, k, v, "dense", impl="fastest")  # "fast" is a real impl (sparse_fast)
    with pytest.raises(ValueError, match="4-D"):
        sparse_attention(q[0], k, v, "dense")
    with pytest.raises(ValueError, match="pattern spec"):
        sparse_attention(q, k, v, "windw:3")


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=32, n_layer=4, n_head=4, n_kv_head=2, max_seq_len=128,
                attn_patterns=["dense", "window:6+strided:5", "window:8+blockstride:8:2", "fixed:8:2"])
    return ModelConfig(**{**base, **kw})


def test_model_blocks_equals_reference_and_trains() -> None:
    torch.manual_seed(0)
    ref = CodexModel(tiny_cfg(attn_impl="reference"))
    blk = CodexModel(tiny_cfg(attn_impl="blocks"))
    blk.load_state_dict(ref.state_dict())
    x = torch.randint(0, 64, (2, 70))
    y = torch.randint(0, 64, (2, 70))
    o_ref, o_blk = ref(x, y), blk(x, y)
    torch.testing.assert_close(o_blk.logits, o_ref.logits, atol=ATOL, rtol=0)
    o_ref.loss.backward()
    o_blk.loss.backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), blk.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=ATOL, rtol=0, msg=name)
    # one optimiser step through the sparse path lowers the loss on this batch
    opt = torch.optim.SGD(blk.parameters(), lr=0.5)
    opt.step()
    assert float(blk(x, y).loss.detach()) < float(o_blk.loss.detach())


def test_model_blocks_with_kv_cache_equals_uncached_reference() -> None:
    torch.manual_seed(0)
    ref = CodexModel(tiny_cfg(attn_impl="reference")).eval()
    blk = CodexModel(tiny_cfg(attn_impl="blocks")).eval()
    blk.load_state_dict(ref.state_dict())
    x = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        full = ref(x).logits
        caches = make_dynamic_caches(4)
        first = blk(x[:, :30], caches=caches).logits  # multi-token prefill
        steps = [blk(x[:, t : t + 1], caches=caches).logits for t in range(30, 40)]
    torch.testing.assert_close(torch.cat([first, *steps], 1), full, atol=ATOL, rtol=0)


def test_flex_equals_reference_and_falls_back_for_training() -> None:
    """The only FlexAttention compile in this file: one pattern, one small N."""
    spec = "window:40+blockstride:128:2"
    q, k, v = rand_qkv(1, 4, 2, 300, 16, seed=5)  # 300: not a multiple of 128
    with torch.no_grad():
        out = sparse_attention(q, k, v, spec, impl="flex")
    torch.testing.assert_close(out, sparse_attention(q, k, v, spec, impl="reference"), atol=ATOL, rtol=0)
    q.requires_grad_(True)
    with pytest.warns(UserWarning, match="no backward on CPU"):
        out = sparse_attention(q, k, v, spec, impl="flex")
    out.sum().backward()  # went through "blocks"
    assert q.grad is not None and not q.grad.isnan().any()


def test_bench_attention_records_are_flat_and_complete() -> None:
    import argparse

    from codex_lab.lessons.l02_sparse_attention import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--sizes", "256", "--impls", "reference", "blocks", "fast", "--heads", "2", "--head-dim", "16",
                         "--repeats", "1", "--pattern", "window:64+blockstride:64:2", "--device", "cpu"])
    args.mode = Mode("fast")  # as the command line hands it over
    rows = bench.run(args)
    assert [r["impl"] for r in rows] == ["sdpa", "reference", "blocks", "fast"]  # the baseline is always measured
    for r in rows:
        assert {"impl", "pattern", "N", "median_ms", "peak_mib", "density", "speedup_vs_sdpa"} <= set(r)
        assert all(isinstance(v, (int, float, str)) for v in r.values())  # flat, JSON-ready
        assert r["median_ms"] > 0 and r["N"] == 256
    sd = rows[0]
    assert sd["density"] == 1.0 and sd["speedup_vs_sdpa"] == 1.0
    d = parse_pattern("window:64+blockstride:64:2").density(256)
    assert rows[2]["density"] == pytest.approx(d) and rows[2]["limit_1_over_d"] == pytest.approx(1 / d)
    assert rows[2]["speedup_vs_sdpa"] == pytest.approx(sd["median_ms"] / rows[2]["median_ms"])
    # computed pairs: blocks computes whole 128-token tiles (here all 3 causal ones, each
    # 128^2 pairs of the 256*257/2 causal ones); fast computes no more and every allowed pair
    assert rows[2]["computed_fraction"] == pytest.approx(3 * 128 * 128 / (256 * 257 / 2))
    assert d <= rows[3]["computed_fraction"] <= rows[2]["computed_fraction"]
