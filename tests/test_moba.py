"""The learned MoBA pattern ("moba:B:K") against an independent per-query loop; its model hook."""

from __future__ import annotations

from codex_lab.runtime.mode import Mode
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.kv_cache import make_dynamic_caches, make_static_caches
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moba import moba_attention, moba_density, moba_mask, moba_select, moba_top_k_for_density
from codex_lab.nn.patterns import MoBA, causal_pairs, parse_pattern

# fp32 attention: outputs and gradients are O(1) and the paths sum in different orders
ATOL = 2e-5


def naive_moba(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int, top_k: int) -> torch.Tensor:
    """Independent oracle, one query at a time: block means, MoBA's gate, top-k by sorting,
    then softmax over the own block's earlier keys and the chosen blocks. Differentiable
    through the attention; the choice is made on detached values (as MoBA does)."""
    B, H, N, D = q.shape
    g = H // k.shape[1]
    out = torch.zeros_like(q)
    rows = []
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // g], v[b, h // g]  # (N, D)
            for t in range(N):
                own = t // block
                means = [kh[j * block : (j + 1) * block].detach().mean(0) for j in range(own)]
                scores = [float(q[b, h, t].detach() @ m) for m in means]
                chosen = sorted(range(own), key=lambda j: -scores[j])[:top_k]
                keys = sorted([p for j in chosen for p in range(j * block, (j + 1) * block)] + list(range(own * block, t + 1)))
                idx = torch.tensor(keys)
                s = (kh[idx] @ q[b, h, t]) / math.sqrt(D)  # (|keys|,)
                rows.append(((b, h, t), torch.softmax(s, 0) @ vh[idx]))
    out = torch.stack([r for _, r in rows]).view(B, H, N, D)
    return out


def _qkv(B: int, H: int, Hkv: int, N: int, D: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, D, generator=g).requires_grad_() for h in (H, Hkv, Hkv)]


def _fwd_bwd(fn, q, k, v, seed: int = 1) -> list[torch.Tensor]:
    out = fn(q, k, v)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))  # random upstream gradient
    (out * up).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    return [out.detach(), *grads]


@pytest.mark.parametrize("B,H,Hkv,N,block,top_k", [(2, 4, 2, 23, 4, 2), (1, 2, 1, 17, 5, 1), (2, 2, 2, 12, 3, 9)])
def test_reference_equals_naive_oracle_forward_and_backward(B: int, H: int, Hkv: int, N: int, block: int, top_k: int) -> None:
    # odd N (not a multiple of the block), grouped heads, batch > 1, and top_k past the blocks there are
    q, k, v = _qkv(B, H, Hkv, N, 8, seed=N)
    want = _fwd_bwd(lambda *a: naive_moba(*a, block, top_k), q, k, v)
    got = _fwd_bwd(lambda *a: moba_attention(*a, f"moba:{block}:{top_k}"), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=name)


def test_selection_is_per_token_causal_and_counts_match_density() -> None:
    B, H, Hkv, N, bs, kk = 2, 4, 2, 45, 4, 3
    q, k, v = _qkv(B, H, Hkv, N, 8, seed=3)
    sel = moba_select(q, k, f"moba:{bs}:{kk}")  # (B, H, N, K)
    assert sel.shape == (B, H, N, kk)
    qb = torch.arange(N) // bs
    assert bool((sel < qb[:, None]).all())  # only strictly earlier blocks (or -1)
    # every query holds min(K, earlier blocks) distinct blocks
    for t in range(N):
        got = sel[:, :, t]
        assert bool(((got >= 0).sum(-1) == min(kk, int(qb[t]))).all())
    mask = moba_mask(q, k, f"moba:{bs}:{kk}")  # (B, H, N, N)
    assert not bool(mask.triu(1).any())  # causal
    pat = MoBA(bs, kk)
    assert int(mask.sum()) == B * H * pat.pairs(N)
    assert moba_density(N, bs, kk) == pytest.approx(pat.pairs(N) / causal_pairs(N))
    # a later query's q never changes an earlier query's selection (per token, no leak inside a block)
    q2 = q.detach().clone()
    q2[:, :, 30:] = torch.randn_like(q2[:, :, 30:])
    torch.testing.assert_close(moba_select(q2, k, pat)[:, :, :30], sel[:, :, :30], atol=0, rtol=0)


def test_density_formula_and_top_k_for_density() -> None:
    assert MoBA(4, 100).density(37) == pytest.approx(1.0)  # every earlier block chosen: dense causal
    assert MoBA(8, 1).pairs(8) == causal_pairs(8)  # one block: only the own block, causally
    # N = 20, block 8, K = 1: blocks of 8, 8, 4 queries: 36 + (36 + 64) + (10 + 32) pairs
    assert MoBA(8, 1).pairs(20) == 36 + 36 + 64 + 10 + 32
    d = MoBA(64, 4).density(2048)
    assert moba_top_k_for_density(2048, 64, d) == 4
    assert parse_pattern("moba:64:4").reach(4096) == 64 * 5


def test_spec_errors_are_clear() -> None:
    assert parse_pattern("moba:64:4") == MoBA(64, 4) and MoBA(64, 4).spec == "moba:64:4"
    with pytest.raises(ValueError, match="cannot join a union"):
        parse_pattern("window:8+moba:8:2")
    with pytest.raises(ValueError, match="'moba' takes 2"):
        parse_pattern("moba:8")
    with pytest.raises(TypeError, match="content-based"):
        MoBA(8, 2).mask(16)
    q, k, v = _qkv(1, 2, 1, 8, 4)
    with pytest.raises(ValueError, match="expected a 'moba"):
        moba_attention(q, k, v, "window:4")
    with pytest.raises(ValueError, match="impl="):
        moba_attention(q, k, v, "moba:4:1", impl="blocks")


def moba_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=32, n_layer=3, n_head=4, n_kv_head=2, max_seq_len=128,
                attn_patterns=["dense", "moba:8:2", "moba:16:1"])
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("impl", ["reference", "sdpa", "blocks"])
def test_model_with_moba_layers_trains_on_cpu(impl: str) -> None:
    torch.manual_seed(0)
    model = CodexModel(moba_cfg(attn_impl=impl))
    x = torch.randint(0, 64, (2, 75))  # 75: not a multiple of either block
    y = torch.randint(0, 64, (2, 75))
    out = model(x, y)
    out.loss.backward()
    for i in (1, 2):  # the moba layers' projections get gradients
        grad = model.layers[i].attn.q_proj.weight.grad
        assert grad is not None and bool(torch.isfinite(grad).all()) and float(grad.abs().sum()) > 0
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert float(model(x, y).loss.detach()) < float(out.loss.detach())


def test_model_moba_layer_equals_oracle_and_kv_cache_decode_equals_full() -> None:
    torch.manual_seed(0)
    model = CodexModel(moba_cfg(attn_impl="reference")).eval()
    x = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        full = model(x).logits
        caches = make_dynamic_caches(3)
        first = model(x[:, :29], caches=caches).logits  # prefill ends inside a block
        steps = [model(x[:, t : t + 1], caches=caches).logits for t in range(29, 40)]
    # decoding selects exactly what the full pass selected: the gate at t reads q_t and complete earlier blocks
    torch.testing.assert_close(torch.cat([first, *steps], 1), full, atol=ATOL, rtol=0)
    with torch.no_grad():  # a preallocated cache: empty slots (position -1) are no block's keys
        caches = make_static_caches(model.cfg, 2, 64)
        first = model(x[:, :29], caches=caches).logits
        steps = [model(x[:, t : t + 1], caches=caches).logits for t in range(29, 40)]
    torch.testing.assert_close(torch.cat([first, *steps], 1), full, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------
# The native fast path, held to the reference
# ----------------------------------------------------------------------------------------


@pytest.fixture
def native() -> None:
    from codex_lab.nn.moba_fast import moba_native_status

    # the project's CI and the course machines have a C compiler: a kernel that does not build
    # is a failure here, not a skip
    assert moba_native_status() == "", moba_native_status()


@pytest.mark.parametrize("B,H,Hkv,N,D,block,top_k", [
    (2, 4, 2, 37, 8, 4, 2),  # odd N, grouped heads, batch 2
    (1, 6, 2, 301, 16, 16, 3),  # g = 3, last block of 13 tokens
    (2, 2, 2, 12, 8, 3, 9),  # top_k past the blocks there are: dense causal
    (1, 4, 1, 300, 32, 64, 2),  # multi-query, blocks larger than most of N
    (1, 2, 1, 20, 8, 300, 1),  # one block longer than N: own block only
    (1, 2, 2, 1, 8, 4, 1),  # one token
])
def test_fast_equals_reference_forward_and_backward(native, B, H, Hkv, N, D, block, top_k) -> None:
    q, k, v = _qkv(B, H, Hkv, N, D, seed=N + block)
    spec = f"moba:{block}:{top_k}"
    want = _fwd_bwd(lambda *a: moba_attention(*a, spec, "reference"), q, k, v)
    got = _fwd_bwd(lambda *a: moba_attention(*a, spec, "fast"), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=name)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 80), block=st.sampled_from([1, 3, 4, 8, 64]), top_k=st.sampled_from([1, 2, 5, 70]),
       hkv=st.sampled_from([1, 2]), g=st.sampled_from([1, 3]), batch=st.sampled_from([1, 2]))
def test_fast_equals_reference_property(n: int, block: int, top_k: int, hkv: int, g: int, batch: int) -> None:
    from codex_lab.nn.moba_fast import moba_native_status

    assert moba_native_status() == "", moba_native_status()
    # top_k = 70 > 64: the gate's top-k runs as torch argmax rounds on both paths
    q, k, v = _qkv(batch, hkv * g, hkv, n, 8, seed=n * 7 + block)
    spec = f"moba:{block}:{top_k}"
    want = _fwd_bwd(lambda *a: moba_attention(*a, spec, "reference"), q, k, v)
    got = _fwd_bwd(lambda *a: moba_attention(*a, spec, "fast"), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("max_rows", [1, 5])
def test_fast_chunks_rows_and_is_thread_count_independent(native, monkeypatch, max_rows: int) -> None:
    import codex_lab.nn.moba_fast as mf

    q, k, v = _qkv(2, 4, 2, 90, 8, seed=7)
    want = _fwd_bwd(lambda *a: moba_attention(*a, "moba:8:3", "reference"), q, k, v)
    # the block size (8) sets the floor of a chunk: max(MAX_ROWS, block) rows
    monkeypatch.setattr(mf, "MAX_ROWS", max_rows)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2, 3):  # 1 and 2: a thread per whole K/V head (4 heads); 3: threads share each head
            torch.set_num_threads(n_threads)
            got = _fwd_bwd(lambda *a: moba_attention(*a, "moba:8:3", "fast"), q, k, v)
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"{name} threads={n_threads}")
    finally:
        torch.set_num_threads(threads)


def test_fast_falls_back_to_reference_where_it_does_not_apply(native) -> None:
    from codex_lab.nn.moba_fast import moba_fast_ok

    q, k, v = _qkv(1, 2, 1, 24, 8, seed=2)
    assert moba_fast_ok(q, k, None, None)
    shifted = torch.arange(5, 29)[None]  # positions 5..28: the reference's job
    assert not moba_fast_ok(q, k, shifted, shifted)
    assert not moba_fast_ok(q.double(), k.double(), None, None)
    got = moba_attention(q, k, v, "moba:4:2", "fast", q_pos=shifted, k_pos=shifted)
    torch.testing.assert_close(got, moba_attention(q, k, v, "moba:4:2", q_pos=shifted, k_pos=shifted), atol=0, rtol=0)
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    torch.testing.assert_close(moba_attention(q64, k64, v64, "moba:4:2", "fast"),
                               moba_attention(q64, k64, v64, "moba:4:2"), atol=0, rtol=0)


def test_model_fast_moba_equals_reference_with_gradients(native) -> None:
    torch.manual_seed(0)
    ref = CodexModel(moba_cfg(attn_impl="reference"))
    fast = CodexModel(moba_cfg(attn_impl="sdpa"))  # moba layers of a non-reference model take the native path
    fast.load_state_dict(ref.state_dict())
    x, y = torch.randint(0, 64, (2, 70)), torch.randint(0, 64, (2, 70))
    o_ref, o_fast = ref(x, y), fast(x, y)
    torch.testing.assert_close(o_fast.logits, o_ref.logits, atol=ATOL, rtol=0)
    o_ref.loss.backward()
    o_fast.loss.backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=ATOL, rtol=0, msg=name)


def test_native_gate_and_torch_rounds_choose_the_same_blocks_ties_to_the_lower(native, monkeypatch) -> None:
    import codex_lab.nn.moba_fast as mf

    q, k, _ = _qkv(2, 4, 2, 77, 8, seed=11)
    q, k = q.detach(), k.detach()
    pat = MoBA(6, 3)
    native_sel = moba_select(q, k, pat)  # plain positions: the native gate
    # the last 10 queries against all keys (a decode step's layout): torch scores, native top-k
    tail = moba_select(q[:, :, -10:], k, pat, q_pos=torch.arange(67, 77).expand(2, 10), k_pos=torch.arange(77).expand(2, 77))
    torch.testing.assert_close(tail, native_sel[:, :, -10:], atol=0, rtol=0)
    monkeypatch.setattr(mf, "moba_gate", lambda *a: None)
    monkeypatch.setattr(mf, "moba_topk", lambda *a: None)
    torch_sel = moba_select(q, k, pat)  # torch scores, K rounds of argmax
    torch.testing.assert_close(native_sel, torch_sel, atol=0, rtol=0)
    # exact ties (every block has the same mean): the lowest earlier blocks win, in order
    k_tied = torch.ones(1, 1, 40, 4)
    q1 = torch.ones(1, 1, 40, 4)
    monkeypatch.undo()
    sel = moba_select(q1, k_tied, MoBA(4, 2))
    assert sel[0, 0, 39].tolist() == [0, 1] and sel[0, 0, 5].tolist() == [0, -1] and sel[0, 0, 2].tolist() == [-1, -1]
    monkeypatch.setattr(mf, "moba_gate", lambda *a: None)
    monkeypatch.setattr(mf, "moba_topk", lambda *a: None)
    torch.testing.assert_close(moba_select(q1, k_tied, MoBA(4, 2)), sel, atol=0, rtol=0)


def test_bench_attention_has_moba_rows_at_the_fixed_patterns_density(native) -> None:
    import argparse

    from codex_lab.lessons.l02_sparse_attention import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    fixed = "window:64+blockstride:64:3"
    args = p.parse_args(["--sizes", "512", "--impls", "fast", "moba", "--heads", "2", "--head-dim", "16", "--repeats", "1",
                         "--pattern", fixed, "--moba-block", "64", "--backward", "--device", "cpu"])
    args.mode = Mode("fast")  # as the command line hands it over
    rows = {r["impl"]: r for r in bench.run(args)}
    m, f = rows["moba"], rows["fast"]
    d = parse_pattern(fixed).density(512)
    kk = moba_top_k_for_density(512, 64, d)
    assert m["pattern"] == f"moba:64:{kk}" and m["kernel"] == "native"
    assert m["density"] == pytest.approx(MoBA(64, kk).density(512)) and m["fixed_density"] == pytest.approx(d)
    # K is the closest density there is: one more or one fewer block is further from the fixed one
    assert all(abs(m["density"] - d) <= abs(MoBA(64, j).density(512) - d) for j in (kk - 1, kk + 1) if j >= 1)
    assert m["vs_fixed_fast"] == pytest.approx(m["median_ms"] / f["median_ms"])
    assert m["vs_fixed_fast_density_scaled"] == pytest.approx(m["vs_fixed_fast"] * d / m["density"])
    assert m["fwd_bwd_vs_fixed_fast"] == pytest.approx(m["fwd_bwd_ms"] / f["fwd_bwd_ms"])
    assert m["density"] <= m["computed_fraction"] <= 1 and m["goal_vs_fixed"] == 1.3
    assert all(isinstance(v, (int, float, str)) for v in m.values())  # flat, JSON-ready


def test_sparse_attention_and_registry_kernels_run_moba_patterns(native) -> None:
    from codex_lab.nn.attention import get_attention_impl
    from codex_lab.nn.sparse import sparse_attention

    q, k, v = (t.detach() for t in _qkv(2, 4, 2, 45, 8, seed=4))
    want = moba_attention(q, k, v, "moba:8:2")
    for impl in ("reference", "blocks", "fast", "flex"):
        torch.testing.assert_close(sparse_attention(q, k, v, "moba:8:2", impl=impl), want, atol=ATOL, rtol=0, msg=impl)
    pos = torch.arange(45).expand(2, 45)
    got = get_attention_impl("fast")(q, k, v, None, pattern=MoBA(8, 2), q_pos=pos, k_pos=pos)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- review: an oracle from the paper's definition


def _paper_mask(q: torch.Tensor, k: torch.Tensor, block: int, top_k: int) -> torch.Tensor:
    """MoBA (Lu et al. 2025) per query token, in fp64: its own block causally, plus the top_k
    blocks strictly before it by q . mean(K_block), ties to the lower block. (B, H, T, S)."""
    B, H, T, _ = q.shape
    g, S = H // k.shape[1], k.shape[2]
    m = torch.zeros(B, H, T, S, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            kh = k[b, h // g].double()
            for t in range(T):
                own = t // block
                sc = sorted(((-float(q[b, h, t].double() @ kh[j * block:(j + 1) * block].mean(0)), j) for j in range(own)))
                for _, j in sc[:top_k]:
                    m[b, h, t, j * block:(j + 1) * block] = True
                m[b, h, t, own * block:t + 1] = True
    return m


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("B,H,Hkv,N,block,top_k", [(2, 4, 2, 37, 3, 2), (1, 2, 1, 3, 8, 1), (1, 2, 2, 16, 4, 1),
                                                   (1, 3, 1, 21, 7, 100), (1, 1, 1, 1, 1, 1)])
def test_fp64_inputs_stay_fp64_against_the_papers_definition(impl, B, H, Hkv, N, block, top_k) -> None:
    # fp64 in, fp64 out at fp64 precision: the reference attention used to softmax fp64 scores
    # in fp32 (errors ~1e-7); 1e-10 is far above fp64 rounding of O(1) sums of <= 37 terms
    g = torch.Generator().manual_seed(N)
    q, k, v = [torch.randn(B, h, N, 8, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv)]
    mask = _paper_mask(q, k, block, top_k)
    assert torch.equal(moba_mask(q, k, f"moba:{block}:{top_k}"), mask)
    kr, vr = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = (q @ kr.transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    want = torch.softmax(s, -1) @ vr
    out = moba_attention(q, k, v, f"moba:{block}:{top_k}", impl)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    # gradients through the chosen blocks, against autograd of the oracle (the choice held fixed)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda a, b, c: moba_attention(a, b, c, f"moba:{block}:{top_k}", impl),
               lambda a, b, c: torch.softmax((a @ b.repeat_interleave(H // Hkv, 1).transpose(-1, -2) / math.sqrt(8))
                                             .masked_fill(~mask, float("-inf")), -1) @ c.repeat_interleave(H // Hkv, 1)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        (fn(*leaves) * up).sum().backward()
        grads.append([t.grad for t in leaves])
    for name, a, b in zip(("dq", "dk", "dv"), *grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=name)


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("T,S", [(0, 0), (0, 5), (3, 0)])
def test_no_queries_or_no_keys_is_an_empty_or_zero_output_like_dense(impl, T, S) -> None:
    # dense attention_reference gives (B, H, T, D) (zeros where a row has no key); MoBA raised
    # "max(): Expected reduction dim" from the block count of an empty position tensor
    q = torch.randn(1, 2, T, 4, requires_grad=True)
    k, v = torch.randn(1, 2, S, 4), torch.randn(1, 2, S, 4)
    out = moba_attention(q, k, v, "moba:2:1", impl)
    assert out.shape == (1, 2, T, 4) and not out.abs().sum()
    out.sum().backward()
    assert moba_mask(q, k, "moba:2:1").shape == (1, 2, T, S)
    assert moba_select(q, k, "moba:2:1").shape == (1, 2, T, 0)


@pytest.mark.parametrize("bad", ["past the blocks", "own block", "a later block", "twice", "int32", "fp64 q", "bf16 k"])
def test_moba_fast_refuses_what_the_kernel_would_index_out_of_bounds(bad) -> None:
    # moba_fast is public; a block id of 10**9 used to be a heap write past the task table
    # (segmentation fault), a future block a causal leak, a repeated block a double count
    from codex_lab.nn.moba_fast import moba_fast, moba_native_status

    if moba_native_status():
        pytest.skip(moba_native_status())
    q, k, v = (torch.randn(1, 2, 16, 4) for _ in range(3))
    sel = moba_select(q, k, "moba:4:2")
    if bad == "past the blocks":
        sel = torch.full_like(sel, 10**9)
    elif bad == "own block":
        sel[0, 0, 13, 0] = 3
    elif bad == "a later block":
        sel[0, 1, 2, 0] = 2
    elif bad == "twice":
        sel[0, 0, 15, 1] = sel[0, 0, 15, 0]
    elif bad == "int32":
        sel = sel.int()
    elif bad == "fp64 q":
        q = q.double()
    else:
        k = k.bfloat16()
    with pytest.raises(ValueError, match="selected|moba_fast needs"):
        moba_fast(q, k, v, MoBA(4, 2), sel)
    # the check leaves moba_select's own choice alone
    q, k, v = (torch.randn(1, 2, 16, 4) for _ in range(3))
    torch.testing.assert_close(moba_fast(q, k, v, MoBA(4, 2), moba_select(q, k, "moba:4:2")),
                               moba_attention(q, k, v, "moba:4:2"), atol=ATOL, rtol=0)


def test_native_gate_and_topk_refuse_or_handle_shapes_the_kernel_cannot_take() -> None:
    # k = 0 made the kernel's top-k write one slot before its output buffer; a kbar with more
    # blocks than the queries cover made the gate call BLAS with a negative row count
    from codex_lab.nn.moba_fast import moba_gate, moba_native_status, moba_topk

    if moba_native_status():
        pytest.skip(moba_native_status())
    scores = torch.randn(3, 5)
    assert moba_topk(scores, 0).shape == (3, 0)
    assert moba_topk(scores, 2).tolist() == scores.topk(2).indices.tolist()
    q = torch.randn(1, 2, 10, 4)
    assert moba_gate(q, torch.randn(1, 1, 3, 4), 4, 0).shape == (1, 2, 10, 0)
    for kbar, block in ((torch.randn(1, 1, 9, 4), 4), (torch.randn(1, 3, 3, 4), 4), (torch.randn(1, 1, 3, 5), 4)):
        with pytest.raises(ValueError, match="moba_gate needs"):
            moba_gate(q, kbar, block, 1)


def test_density_closed_form_and_top_k_search_equal_the_loops_and_scale() -> None:
    # MoBA.pairs summed block by block (O(n / block): 8 s at n = 1e7, block 1) and
    # moba_top_k_for_density scanned every top_k (O(blocks^2): n = 1e5, block 1 never ended);
    # both now closed form / bisection, held here to the plain loops
    import random
    import time

    def pairs_loop(n: int, b: int, k: int) -> int:
        return sum(min(b, n - i * b) * (min(b, n - i * b) + 1) // 2 + min(b, n - i * b) * b * min(k, i)
                   for i in range(-(-n // b)))

    def top_k_scan(n: int, b: int, d: float) -> int:
        return min(range(1, max(2, -(-n // b))), key=lambda kk: abs(moba_density(n, b, kk) - d))

    rng = random.Random(0)
    for _ in range(300):
        n, b, k = rng.randint(1, 300), rng.randint(1, 40), rng.randint(1, 12)
        assert MoBA(b, k).pairs(n) == pairs_loop(n, b, k), (n, b, k)
        d = rng.choice([rng.uniform(0.01, 1.0), moba_density(n, b, k)])
        assert moba_top_k_for_density(n, b, d) == top_k_scan(n, b, d), (n, b, d)
    t = time.perf_counter()
    assert 0 < moba_density(10**9, 1, 3) < 1e-8 and moba_top_k_for_density(10**6, 1, 0.1) > 1
    assert time.perf_counter() - t < 1.0  # microseconds of arithmetic; 1 s leaves room for a loaded machine
