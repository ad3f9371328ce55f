"""Fast paths held equal to their plain references (equality only; speed lives in the benches)."""

from __future__ import annotations

import pytest
import torch

from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.infer.generate import generate_ids
from codex_lab.nn.model import CodexModel
from codex_lab.nn.patterns import AttentionPattern
from codex_lab.nn.sparse import sparse_attention

from conftest import tiny_config

# fp32 attention: outputs and gradients are O(1); the fast kernel sums the tiles in a
# different order (two softmax parts merged through log-sum-exp), so float rounding differs
ATOL = 2e-5

SPECS = ["dense", "window:5", "window:1", "strided:3", "fixed:8:2", "global:3", "blockstride:8:2",
         "window:7+strided:4", "window:8+blockstride:8:3", "window:128+blockstride:128:12"]


@pytest.fixture(params=["native", "flash"])
def fast_path(request, monkeypatch) -> str:
    """Run impl="fast" through its fused native kernel, or through its flash-call path (what it
    falls back to where the native kernel cannot be built): both are held to the reference."""
    import codex_lab.nn.sparse_fast as sf
    from codex_lab.nn.sparse_native import native_status

    if request.param == "native":
        # the project's CI and the course machines have a C compiler: a native kernel that does
        # not build is a failure here, not a skip
        assert native_status() == "", native_status()
    else:
        monkeypatch.setattr(sf, "native_status", lambda: "disabled by the test")
    return request.param


def _qkv(B: int, H: int, Hkv: int, N: int, D: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, D, generator=g).requires_grad_() for h in (H, Hkv, Hkv)]


def _fwd_bwd(impl: str, spec, q, k, v, block: int, seed: int = 1):
    out = sparse_attention(q, k, v, spec, impl=impl, block=block)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))  # random upstream gradient
    (out * g).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    return [out.detach(), *grads]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n,block,h,hkv", [(37, 8, 2, 1), (64, 16, 4, 2), (300, 128, 2, 2)])
def test_sparse_fast_equals_reference_forward_and_backward(spec: str, n: int, block: int, h: int, hkv: int,
                                                          fast_path: str) -> None:
    q, k, v = _qkv(2, h, hkv, n, 8)
    want = _fwd_bwd("reference", spec, q, k, v, block)
    got = _fwd_bwd("fast", spec, q, k, v, block)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"{spec} {name}")


# each case names the plan features it must exercise, so the test fails if the plan stops
# taking that path (half-size partial units, each key layout, rows that are not consecutive,
# query blocks that only full tiles reach, stacked query blocks in the backward, several
# query heads per K/V head)
FAST_CASES = [
    # spec, N, block, H, Hkv, features the plan must contain
    ("window:16+blockstride:16:3", 200, 16, 4, 2, {"unit/2", "sliding", "class", "shared", "gather", "scattered", "stack"}),
    ("window:16+blockstride:16:2", 300, 16, 2, 2, {"unit/2", "class", "stack"}),
    ("window:40+blockstride:32:2", 300, 32, 2, 1, {"unit/2", "class", "gather", "scattered", "per-row mask"}),
    ("global:16", 100, 16, 2, 2, {"unit/2", "shared", "uncovered"}),
    ("window:300", 1000, 128, 1, 1, {"unit/2", "gather", "scattered", "per-row mask"}),
    ("window:128+blockstride:128:12", 3500, 128, 2, 1, {"unit/2", "sliding", "class"}),
]


def _features(plan) -> set[str]:
    calls = plan.partial + plan.full + plan.full_bwd
    out = {c.layout for c in calls} | ({"stack"} if any(c.stack > 1 for c in plan.full_bwd) else set())
    out |= {"scattered"} if any(not c.contiguous for c in calls) else set()
    out |= {"per-row mask"} if any(c.mask is not None and c.mask.shape[1] > 1 for c in calls) else set()
    out |= {"unit/2"} if plan.unit < plan.block else set()
    out |= set() if plan.covered else {"uncovered"}
    return out


@pytest.mark.parametrize("chunk", [None, 1])
@pytest.mark.parametrize("spec,n,block,h,hkv,features", FAST_CASES)
def test_sparse_fast_plan_paths_equal_reference(spec, n, block, h, hkv, features, chunk, fast_path, monkeypatch) -> None:
    import codex_lab.nn.sparse_fast as sf
    import codex_lab.nn.sparse_native as sn
    from codex_lab.nn.patterns import parse_pattern
    from codex_lab.nn.sparse_fast_plan import fast_plan

    plan = fast_plan(parse_pattern(spec), n, block, h // hkv, "cpu", torch.float32)
    assert features <= _features(plan)
    if chunk is not None:
        # flash calls: every call split into one-row calls (the chunking paths); native: every
        # segment cut to one unit's keys, so each chunk of the forward's online softmax is one
        # segment and the rescaling runs at every step
        monkeypatch.setattr(sf, "CHUNK_FLOATS", chunk)
        monkeypatch.setattr(sn, "MAX_KEYS", plan.unit)
    sf._chunked.cache_clear()
    sn.native_table.cache_clear()
    q, k, v = _qkv(2, h, hkv, n, 16, seed=n)
    want = _fwd_bwd("reference", spec, q, k, v, block)
    got = _fwd_bwd("fast", spec, q, k, v, block)
    if chunk is not None and fast_path == "native":  # the cut took effect
        table = sn.native_table(plan, h // hkv, -(-n // block) * block // plan.unit)
        assert int(table.length.max()) == plan.unit
    sf._chunked.cache_clear()
    sn.native_table.cache_clear()
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"{spec} {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_fast_takes_strided_inputs_and_float64(dtype) -> None:
    """k and v as slices of longer buffers (a cache-like layout, not contiguous), q transposed
    from (B, N, H, D): the strided key views must not assume a dense layout; float64 keeps a
    float64 log-sum-exp."""
    spec, n = "window:16+blockstride:16:3", 144  # a multiple of the block: no padding copy
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, n, 4, 8, generator=g, dtype=dtype).transpose(1, 2).requires_grad_()  # (B, H, N, D) view
    k, v = (torch.randn(2, 2, n + 40, 8, generator=g, dtype=dtype)[:, :, :n].requires_grad_() for _ in range(2))
    want = _fwd_bwd("reference", spec, q, k, v, 16)
    got = _fwd_bwd("fast", spec, q, k, v, 16)
    # float64: the fused kernel's exp is a fast approximation (relative error ~1e-7) in every
    # dtype, so float64 agrees to ~1e-7, not to float64 rounding; 1e-6 leaves a 10x margin
    tol = ATOL if dtype == torch.float32 else 1e-6
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=name)


def test_sparse_fast_plan_keeps_one_class_stride() -> None:
    """Full tiles strided by 2 in early blocks and by 3 in later ones: one class layout is
    kept (the more common stride), the other calls fall back to copies, results unchanged."""
    from dataclasses import dataclass

    from codex_lab.nn.sparse_fast_plan import fast_plan

    @dataclass(frozen=True)
    class TwoStrides(AttentionPattern):
        @property
        def is_dense(self) -> bool:
            return False

        def allowed(self, q_pos, k_pos):
            qb, kb = q_pos // 8, k_pos // 8
            s = torch.where(qb < 9, 2, 3)
            return (k_pos <= q_pos) & (torch.remainder(qb - kb, s) == 0)

    plan = fast_plan(TwoStrides(), 160, 8, 1, "cpu", torch.float32)
    layouts = {(c.layout, c.step) for c in plan.full}
    assert plan.step in (2, 3) and ("gather", 0) in layouts and ("class", plan.step) in layouts
    q, k, v = _qkv(1, 2, 2, 160, 8)
    want = _fwd_bwd("reference", TwoStrides(), q, k, v, 8)
    for name, a, b in zip(("out", "dq", "dk", "dv"), _fwd_bwd("fast", TwoStrides(), q, k, v, 8), want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("threads", [2, 3])
def test_sparse_fast_native_is_thread_count_independent(threads: int) -> None:
    """Several threads: with fewer batch-heads than threads the backward adds each thread's
    key gradients into its own buffer and sums them after, with as many or more (B*H_kv = 4)
    one thread takes each batch-head whole; a dense run longer than one segment (2048 keys)
    is cut into several."""
    from codex_lab.nn.sparse_native import MAX_KEYS, native_status

    assert native_status() == "", native_status()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for spec, n, b, hkv in [("window:40+blockstride:32:2", 300, 1, 1), ("window:40+blockstride:32:2", 300, 2, 2),
                                ("dense", MAX_KEYS + 300, 1, 1)]:
            q, k, v = _qkv(b, 2, hkv, n, 8, seed=threads)
            want = _fwd_bwd("reference", spec, q, k, v, 32)
            got = _fwd_bwd("fast", spec, q, k, v, 32)
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"{spec} {name}")
    finally:
        torch.set_num_threads(before)


def test_native_kernels_leave_denormal_floats_alone() -> None:
    """Loading the kernels (built with -ffast-math) must not turn on flush-to-zero for the
    process: a library linked with -ffast-math does, and then top_p=5e-324 read as 0.0."""
    from codex_lab.nn.moe_native import moe_native_status
    from codex_lab.nn.sparse_native import native_status

    assert native_status() == "" and moe_native_status() == ""  # both loaded
    tiny = 5e-324  # the smallest float64 denormal
    assert tiny * 1.0 > 0.0
    assert float(torch.tensor([1e-40], dtype=torch.float32).mul(1.0)) > 0.0  # a float32 denormal


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_native_kernels_propagate_nan_like_the_torch_paths(where: str) -> None:
    """A NaN in the inputs (a diverged training run) must show in the outputs and gradients,
    on the same rows as through the flash-call path, never silently vanish; likewise a NaN
    token through the MoE kernel."""
    from codex_lab.nn.patterns import parse_pattern
    from codex_lab.nn.sparse_fast import sparse_fast

    pat = parse_pattern("window:16+blockstride:16:3")
    q, k, v = _qkv(1, 2, 2, 100, 8)
    with torch.no_grad():
        {"q": q, "k": k, "v": v}[where][0, 0, 50, 3] = float("nan")
    masks = []
    for native in (True, False):
        out = sparse_fast(q, k, v, pat, 16, native=native)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        masks.append([t.isnan().any(-1) for t in (out, *grads)])
    assert masks[0][0].any()  # the NaN reached the output
    for name, a, b in zip(("out", "dq", "dk", "dv"), *masks):
        assert torch.equal(a, b), name
    if where == "q":  # the MoE kernel: a NaN token's row is NaN, the others are not
        from test_moe_dispatch import layer

        from codex_lab.nn.moe import route
        from codex_lab.nn.moe_dispatch import dispatch_grouped

        fast, _ = layer(seed=9)
        x = torch.randn(6, 24)
        x[2, 5] = float("nan")
        r = route(torch.randn(6, 4), 2)
        with torch.no_grad():
            for native in (True, False):
                y = dispatch_grouped(x, r, fast.experts, native=native)
                assert y.isnan().any(-1).tolist() == [False, False, True, False, False, False], native


def test_sparse_native_says_why_it_is_off_and_fast_still_matches(monkeypatch, tmp_path) -> None:
    """CODEX_LAB_NATIVE=0, or a compiler that fails: native_status() names the reason,
    native=True raises it, float64 with native=True is refused, and impl="fast" runs its
    flash-call path with the reference's results."""
    import codex_lab.nn.sparse_native as sn
    from codex_lab.nn.native_build import load_native
    from codex_lab.nn.patterns import parse_pattern
    from codex_lab.nn.sparse_fast import sparse_fast

    spec = "window:16+blockstride:16:3"
    q, k, v = _qkv(1, 2, 2, 100, 8)
    want = _fwd_bwd("reference", spec, q, k, v, 16)
    try:
        for env, reason in [({"CODEX_LAB_NATIVE": "0"}, "CODEX_LAB_NATIVE=0"),
                            ({"CC": "false", "CODEX_LAB_NATIVE_DIR": str(tmp_path)}, "compiling sparse_attention.c failed")]:
            with monkeypatch.context() as m:
                for key, val in env.items():
                    m.setenv(key, val)
                load_native.cache_clear()
                assert sn.native_status().startswith(reason), sn.native_status()
                with pytest.raises(RuntimeError, match="native sparse kernel is unavailable"):
                    sparse_fast(q, k, v, parse_pattern(spec), 16, native=True)
                got = _fwd_bwd("fast", spec, q, k, v, 16)
                for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                    torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"{reason} {name}")
        assert list(tmp_path.iterdir()) == []  # the failed build left no file behind
    finally:
        load_native.cache_clear()
    with pytest.raises(ValueError, match="fp32 only"):
        sparse_fast(q.double(), k.double(), v.double(), parse_pattern(spec), 16, native=True)


def test_moe_native_kernel_refusals_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """native=True where it cannot run is an error naming why; with CODEX_LAB_NATIVE=0 the
    status says so and the default falls back to the torch path with the same output."""
    from test_moe_dispatch import ATOL as MOE_ATOL, layer

    from codex_lab.nn.moe import route
    from codex_lab.nn.moe_dispatch import dispatch_grouped, dispatch_reference
    from codex_lab.nn.moe_native import moe_native_status
    from codex_lab.nn.native_build import load_native

    fast, ref = layer(seed=8)
    r = route(torch.randn(7, 4), 2)
    x = torch.randn(7, 24)
    want = dispatch_reference(x, r, ref.experts).detach()
    with torch.no_grad():
        with pytest.raises(ValueError, match="fp32 on a CPU"):
            dispatch_grouped(x.double(), r, fast.experts.double(), native=True)
        fast.experts.float()
        try:
            monkeypatch.setenv("CODEX_LAB_NATIVE", "0")
            load_native.cache_clear()
            assert moe_native_status() == "CODEX_LAB_NATIVE=0"
            with pytest.raises(RuntimeError, match="native MoE kernel is unavailable: CODEX_LAB_NATIVE=0"):
                dispatch_grouped(x, r, fast.experts, native=True)
            torch.testing.assert_close(dispatch_grouped(x, r, fast.experts), want, atol=MOE_ATOL, rtol=0)
        finally:
            monkeypatch.delenv("CODEX_LAB_NATIVE")
            load_native.cache_clear()
        torch.testing.assert_close(dispatch_grouped(x, r, fast.experts, native=True), want, atol=MOE_ATOL, rtol=0)


def test_sparse_fast_is_a_registered_model_kernel() -> None:
    from codex_lab.nn.attention import get_attention_impl

    q, k, v = _qkv(1, 2, 2, 50, 8)
    pat = AttentionPattern()
    torch.testing.assert_close(get_attention_impl("fast")(q, k, v, pattern=pat),
                               sparse_attention(q, k, v, pat, impl="reference"), atol=ATOL, rtol=0)


# --- prompt-lookup decoding -------------------------------------------------------------


def test_lookup_draft_copies_what_followed_the_latest_match() -> None:
    from codex_lab.infer.prompt_lookup import lookup_draft

    toks = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup_draft(toks, max_ngram=3, num_draft=2) == [7, 8]  # latest "1 2 3" wins
    assert lookup_draft(toks, max_ngram=3, num_draft=10) == [7, 8, 5, 1, 2, 3]  # stops at the context's end
    assert lookup_draft([4, 5, 6], max_ngram=2) == []  # nothing repeats
    assert lookup_draft([4, 5, 6, 5], max_ngram=2) == [6, 5]  # falls back to a 1-gram


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}])
def test_prompt_lookup_equals_plain_greedy(kw) -> None:
    from codex_lab.infer.prompt_lookup import prompt_lookup_generate

    torch.manual_seed(0)
    target = CodexModel(tiny_config(**kw)).eval()
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, 512, (9,), generator=g).tolist()
    ref0, _ = generate_ids(target, base, max_new_tokens=12)
    drafted = accepted = 0
    # a random prompt, a periodic one and one that already contains its own greedy continuation
    for prompt in (base, [5, 6, 7] * 5, base + ref0 + base):
        ref, _ = generate_ids(target, prompt, max_new_tokens=15)
        for nd in (1, 4):
            ids, reason, st = prompt_lookup_generate(target, prompt, max_new_tokens=15, num_draft=nd)
            assert ids == ref and reason == "length", (prompt, nd)
            assert st.target_calls <= 15
            drafted += st.drafted
            accepted += st.accepted
    assert drafted > 0 and accepted > 0  # the drafting and the acceptance paths both ran
    prompt = base + ref0 + base
    ref, _ = generate_ids(target, prompt, max_new_tokens=12)
    eos = ref[5]  # pretend the 6th greedy token is end-of-text: both stop there
    want = generate_ids(target, prompt, max_new_tokens=12, eos_id=eos)
    assert want[1] == "stop" and prompt_lookup_generate(target, prompt, max_new_tokens=12, eos_id=eos)[:2] == want


# --- MoE dispatch -----------------------------------------------------------------------


@pytest.mark.parametrize("d,experts,top_k,capacity", [(16, 8, 2, None), (12, 4, 1, 1.0), (24, 16, 4, None)])
def test_moe_grouped_inference_path_equals_reference(d: int, experts: int, top_k: int, capacity) -> None:
    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.moe import MoEFeedForward

    cfg = ModelConfig(vocab_size=16, d_model=d, n_layer=1, n_head=1, moe_layers=[0], n_experts=experts,
                      moe_top_k=top_k, moe_ffn_hidden=2 * d + 4, moe_capacity_factor=capacity)
    torch.manual_seed(0)
    fast = MoEFeedForward(cfg).eval()
    ref = MoEFeedForward(cfg, impl="reference").eval()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 21, d)
    # fp32, a different summation order (experts run over sorted row tiles, index_add_ back): rounding only
    tol = dict(atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), ref(x), **tol)
        for m in (fast, ref):  # change a weight: the cached stacked weights must follow
            m.experts[1].up_proj.weight.mul_(-2.0)
        torch.testing.assert_close(fast(x), ref(x), **tol)
    with torch.enable_grad():  # the training path (per-expert loop) too
        torch.testing.assert_close(fast(x), ref(x), **tol)


# --- fixed-shape decode -----------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}])
def test_fast_decoder_equals_generate_ids_and_compiles_once(kw) -> None:

    torch.manual_seed(0)
    model = CodexModel(tiny_config(**kw)).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (9, 1, 5)]
    # the "eager" backend traces with dynamo (same guards as inductor) without generating code
    for dec in (FastDecoder(model, max_len=32, compile=False), FastDecoder(model, max_len=32, backend="eager")):
        for p in prompts:  # reused across prompts: stale slots beyond the new prompt are masked
            want, _ = generate_ids(model, p, max_new_tokens=14)
            assert dec.generate(p, 14)[0] == want
        assert dec.recompiles == 0 and dec.decode_calls == 3 * 13
    eos = generate_ids(model, prompts[0], max_new_tokens=14)[0][4]
    want, reason = generate_ids(model, prompts[0], max_new_tokens=14, eos_id=eos)
    assert reason == "stop" and FastDecoder(model, max_len=32, compile=False).generate(prompts[0], 14, eos_id=eos)[0] == want


def test_fast_decoder_default_cpu_compile_freezes_weights_and_matches() -> None:
    """The default CPU build (frozen weights, Inductor's C++ GEMM template, the C++ wrapper)
    gives generate_ids' tokens, compiles once, and really freezes: the matmul weights are
    constants of the graph, packed at its first compiled step, so changing them afterwards
    leaves this decoder's step as it was (a graph that took the weights as inputs, as before
    this was fixed, follows the change)."""

    torch.manual_seed(0)
    model = CodexModel(tiny_config()).eval()
    dec = FastDecoder(model, max_len=32)
    assert dec.options["freezing"] and dec.options["cpp_wrapper"] and dec.options["max_autotune_gemm_backends"] == "CPP"
    prompts = ([3, 1, 4, 1, 5], [9, 2, 6])
    before = []
    for p in prompts:
        want, _ = generate_ids(model, p, max_new_tokens=10)
        assert dec.generate(p, 10)[0] == want
        before.append(want)
    assert dec.compiled and dec.compile_error == "" and dec.recompiles == 0
    tok, pos = torch.tensor([[7]]), torch.tensor([5])  # one decode step on the decoder's own cache
    compiled_before, eager_before = dec.decode_step(tok, pos), dec._next(tok, pos)  # (1,) ids each
    assert torch.equal(compiled_before, eager_before)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # a different model: new feed-forward weights, written in place
        for layer in model.layers:
            for lin in (layer.ffn.gate_proj, layer.ffn.up_proj, layer.ffn.down_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g))
    eager_after = dec._next(tok, pos)
    assert not torch.equal(eager_after, eager_before)  # the eager step reads the live weights
    assert torch.equal(dec.decode_step(tok, pos), compiled_before)  # the frozen graph kept the old ones
    assert dec.compiled and dec.recompiles == 0

def test_fast_decoder_without_the_gemm_template_compiles_with_aten_matmuls() -> None:
    """Where Inductor's C++ GEMM template cannot serve a matmul (here: weights left unfrozen,
    so they are not constants it can pack), the first step recompiles with ATen's matmuls
    instead of falling back to eager, says so, and gives the same tokens."""

    torch.manual_seed(0)
    model = CodexModel(tiny_config()).eval()
    dec = FastDecoder(model, max_len=32, options={"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    want, _ = generate_ids(model, [3, 1, 4, 1, 5], max_new_tokens=8)
    assert dec.generate([3, 1, 4, 1, 5], 8)[0] == want
    assert dec.compiled and dec.compile_error.startswith("without the C++ GEMM template")
    assert "max_autotune" not in dec.options and dec.recompiles == 0


def test_every_fast_decoder_of_a_process_compiles_its_own_graph() -> None:
    """All FastDecoders share one step's code; past dynamo's default of 8 graphs per function
    the 9th and 10th compiled nothing and ran eagerly while saying ``compiled`` (2026-12-02).
    Ten decoders of ten cache lengths (ten graphs) each build one and give the generator's ids."""
    torch.manual_seed(0)
    model = CodexModel(tiny_config(vocab_size=300)).eval()
    want = generate_ids(model, [1, 2, 3], max_new_tokens=4)[0]
    for i in range(10):
        dec = FastDecoder(model, max_len=16 + i, backend="eager")
        assert dec.generate([1, 2, 3], 4)[0] == want, f"decoder {i}"
        assert dec.graphs >= 1 and dec.compiled, f"decoder {i} compiled no graph"
