"""The continuous-batching engine: same tokens as the plain generator, fair admission,
paged memory returned, streaming deltas, stop strings, seeds, deadlines, cancel, threads."""

import threading

import pytest
import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.engine.scheduler import Finished
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.generate import generate_ids
from codex_lab.nn.model import CodexModel

from conftest import seeded_model, tiny_config



class FakeClock:
    """Advances 1 ms per reading, so timings are deterministic."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


model_for = seeded_model  # a tiny seeded model over tok's vocabulary


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}])
def test_engine_greedy_equals_plain_generator(tok, kw):
    model = model_for(tok, **kw)
    g = torch.Generator().manual_seed(0)
    lengths = [3, 17, 1, 30, 9, 12]
    prompts = [torch.randint(0, tok.vocab_size, (n,), generator=g).tolist() for n in lengths]
    # 3 slots and a pool too small for all at once: requests wait, join and leave mid-run
    eng = Engine(model, tok, max_batch_size=3, max_kv_tokens=112, block_size=8, clock=FakeClock())
    deltas: dict[int, list[str]] = {}
    rids = [eng.submit(p, SamplingParams(max_tokens=6 + 2 * i),
                       on_token=lambda t, d, i=i: deltas.setdefault(i, []).append(d)) for i, p in enumerate(prompts)]
    done = {f.rid: f for f in eng.run_until_done()}
    for i, p in enumerate(prompts):
        ref, reason = generate_ids(model, p, max_new_tokens=6 + 2 * i, eos_id=tok.eot_id)
        f = done[rids[i]]
        assert f.output_ids == ref and f.finish_reason == reason, f"request {i}"
        assert "".join(deltas.get(i, [])) == f.text == tok.decode(ref)
        assert len(f.token_times) == len(ref) and f.ttft is not None and f.ttft > 0
        assert len(f.tbt) == len(ref) - 1 and all(x > 0 for x in f.tbt)
    steps = list(eng.timeline)
    assert steps[0][1] == [0, 1, 2]  # first step admits as many as fit
    assert max(len(s[2]) for s in steps) <= 3
    # continuous: a later request is prefilled while earlier ones are still decoding
    assert any(s[1] and s[2] for s in steps)
    st = eng.stats()
    assert st["running"] == st["waiting"] == st["kv_used_tokens"] == st["kv_allocated_tokens"] == 0


def test_engine_memory_accounting_and_waiting(tok):
    model = model_for(tok)
    eng = Engine(model, tok, max_batch_size=4, max_kv_tokens=32, block_size=8)
    a = eng.submit([5] * 10, SamplingParams(max_tokens=10))  # needs 3 blocks of 4
    b = eng.submit([6] * 10, SamplingParams(max_tokens=10))  # cannot fit beside a: waits
    eng.step()
    st = eng.stats()
    assert st["running"] == 1 and st["waiting"] == 1
    assert st["kv_used_tokens"] == 10 and st["kv_allocated_tokens"] == 16  # 10 tokens in 2 blocks of 8
    per_token = 2 * 2 * 4 * 16 * 4  # K and V * layers * H_kv * D * fp32 bytes
    assert st["kv_used_bytes"] == 10 * per_token and st["kv_capacity_bytes"] == 32 * per_token
    finished = eng.run_until_done()
    assert [f.rid for f in finished] == [a, b]


def test_stop_strings_and_streaming(tok):
    model = model_for(tok)
    prompt = tok.encode("def f(x):\n")
    free = generate_ids(model, prompt, max_new_tokens=12)[0]
    text = tok.decode(free)
    stop = text[3:5]  # a stop string the model is going to produce
    eng = Engine(model, tok)
    seen: list[str] = []
    eng.submit(prompt, SamplingParams(max_tokens=12, stop=[stop]), on_token=lambda t, d: seen.append(d))
    (f,) = eng.run_until_done()
    assert f.finish_reason == "stop" and f.text == text[: text.find(stop)]
    assert stop not in "".join(seen) and "".join(seen) == f.text


def test_per_request_seeds(tok):
    model = model_for(tok)
    eng = Engine(model, tok)
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=7)
    r1 = eng.submit([1, 2, 3], p)
    r2 = eng.submit([1, 2, 3], p)
    r3 = eng.submit([1, 2, 3], SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=8))
    out = {f.rid: f.output_ids for f in eng.run_until_done()}
    assert out[r1] == out[r2] != out[r3]


def test_cancel_deadline_and_bad_input(tok):
    model = model_for(tok)
    clock = FakeClock()
    eng = Engine(model, tok, max_batch_size=2, clock=clock)
    a = eng.submit([1, 2], SamplingParams(max_tokens=50))
    b = eng.submit([3, 4], SamplingParams(max_tokens=50), deadline_s=0.02)
    eng.step()
    eng.cancel(a)  # engine idle: freed at once
    assert eng.stats()["running"] == 1
    finished = {f.rid: f for f in eng.run_until_done()}
    assert finished[a].finish_reason == "cancelled" and finished[b].finish_reason == "deadline"
    assert len(finished[b].output_ids) < 50
    with pytest.raises(ValueError, match="empty"):
        eng.submit([], SamplingParams())
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.submit([1] * 100, SamplingParams(max_tokens=40))
    with pytest.raises(ValueError, match="top_p"):
        eng.submit([1], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="KV blocks"):
        Engine(model, tok, max_kv_tokens=32, block_size=16).submit([1] * 40, SamplingParams(max_tokens=4))


def test_submit_and_cancel_from_another_thread(tok):
    model = model_for(tok)
    eng = Engine(model, tok, max_batch_size=4)
    stop = threading.Event()
    results: list[Finished] = []

    def loop() -> None:
        while not stop.is_set() or eng.has_work():
            results.extend(eng.step())

    th = threading.Thread(target=loop)
    th.start()
    rids = [eng.submit([i + 1] * 5, SamplingParams(max_tokens=30)) for i in range(6)]
    eng.cancel(rids[0])
    stop.set()
    th.join(timeout=60)
    assert not th.is_alive()
    by = {f.rid: f for f in results}
    assert sorted(by) == rids and by[rids[0]].finish_reason == "cancelled"
    assert all(by[r].finish_reason == "length" and len(by[r].output_ids) == 30 for r in rids[1:])


def test_bench_hf_and_batching_records(tok):
    """The benchmark's records: HF generate on the same weights gives the same tokens."""
    from codex_lab.lessons.l06_inference import bench

    model = model_for(tok)
    rows = bench.bench_hf(model, prompt_len=8, new_tokens=6)
    assert [r["impl"] for r in rows] == ["hf_generate", "codex_lab_static_cache"]
    assert all(r["same_tokens"] and r["tokens_per_s"] > 0 and r["scenario"] == "hf" for r in rows)
    reqs = [([i + 1] * (3 + 2 * i), 4 + i) for i in range(5)]
    done, wall, eng = bench.run_engine(model, tok, reqs, max_batch_size=2, static=True)
    assert sorted(len(f.output_ids) for f in done) == [4, 5, 6, 7, 8] and wall > 0
    lat = bench.latency_fields(done)
    assert set(lat) == {"ttft_p50_ms", "ttft_p95_ms", "tbt_p50_ms", "tbt_p95_ms"}
    assert lat["ttft_p95_ms"] >= lat["ttft_p50_ms"] > 0


def test_chunked_prefill_same_tokens(tok):
    model = model_for(tok, attn_patterns=["window:6", "dense"])
    prompts = [list(range(1, 31)), [7, 8, 9], list(range(40, 52))]
    eng = Engine(model, tok, max_batch_size=3, max_prefill_tokens=8, block_size=4)
    rids = [eng.submit(p, SamplingParams(max_tokens=6)) for p in prompts]
    done = {f.rid: f for f in eng.run_until_done()}
    for rid, p in zip(rids, prompts):
        assert done[rid].output_ids == generate_ids(model, p, max_new_tokens=6, eos_id=tok.eot_id)[0]
    # 8 prompt tokens per step: the 30-token prompt (first in line) takes steps 0-3
    pre_steps = [s for s, pre, _ in eng.timeline if rids[0] in pre]
    assert len(pre_steps) == 4 and pre_steps == list(range(4))  # 8 + 8 + 8 + 6 tokens, first come first served
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        Engine(model, tok, max_prefill_tokens=0)


def test_streamable_holds_back_partial_characters_and_stop_prefixes():
    from codex_lab.infer.engine.output import streamable as _streamable

    assert _streamable("ab\ufffd", []) == "ab"  # a character whose bytes are still incomplete
    assert _streamable("x = 1\n", ["\n\n"]) == "x = 1"  # "\n" may become the stop string
    assert _streamable("x = 1\n", ["\ndef"]) == "x = 1"
    assert _streamable("x = 1\nd", ["\ndef"]) == "x = 1"
    assert _streamable("x = 1\nz", ["\ndef", "\n\n"]) == "x = 1\nz"


class _FailOneRequest(Engine):
    """Sampling raises for the request whose seed is 666, at its third token (a stand-in
    for a bad kernel or NaN logits that only one request meets)."""

    def _emit(self, req, logits, greedy=None):
        if req.params.seed == 666 and len(req.output) == 2:
            raise RuntimeError("simulated failure in one request")
        return super()._emit(req, logits, greedy)


def test_failure_in_one_request_fails_it_alone(tok):
    model = model_for(tok)
    eng = _FailOneRequest(model, tok, max_batch_size=4)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    rids = [eng.submit(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    bad = eng.submit([1, 2, 3], SamplingParams(max_tokens=8, seed=666, ignore_eos=True))
    eng.step()  # all four running in one batch
    assert eng.stats()["running"] == 4
    with pytest.warns(UserWarning, match="simulated failure"):
        done = {f.rid: f for f in eng.run_until_done()}
    assert done[bad].finish_reason == "error" and "simulated failure" in done[bad].error
    assert len(done[bad].output_ids) == 2  # it failed at its third token, mid-batch
    for rid, p in zip(rids, prompts):  # the rest of the batch finished with the reference tokens
        ref = generate_ids(model, p, max_new_tokens=8)[0]
        assert done[rid].finish_reason == "length" and done[rid].output_ids == ref
    st = eng.stats()
    assert st["running"] == 0 and st["kv_allocated_tokens"] == 0  # the failed request's blocks came back
    # and the engine keeps serving
    again = eng.submit([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    assert {f.rid: f.finish_reason for f in eng.run_until_done()} == {again: "length"}


class _FailBatchedForward(Engine):
    """The batched decode forward raises whenever the request with seed 13 is in it."""

    def _forward(self, reqs):
        if any(r.params.seed == 13 for r in reqs):
            raise RuntimeError("kernel failure on this request's input")
        return super()._forward(reqs)


def test_batched_forward_failure_is_narrowed_to_its_request(tok):
    model = model_for(tok)
    eng = _FailBatchedForward(model, tok, max_batch_size=4)
    good = [eng.submit([i + 2] * 4, SamplingParams(max_tokens=5, ignore_eos=True)) for i in range(3)]
    bad = eng.submit([9, 9], SamplingParams(max_tokens=5, seed=13, ignore_eos=True))
    with pytest.warns(UserWarning, match="kernel failure"):
        done = {f.rid: f for f in eng.run_until_done()}
    assert done[bad].finish_reason == "error" and len(done[bad].output_ids) == 1  # its prefill worked
    for i, rid in enumerate(good):  # retried one by one: same tokens as the reference
        assert done[rid].output_ids == generate_ids(model, [i + 2] * 4, max_new_tokens=5)[0]


@pytest.mark.parametrize("t", [1e-38, 1e-300, 5e-324, 1e-7])
def test_tiny_temperatures_are_greedy(tok, t):
    from codex_lab.infer.sampling import GREEDY_BELOW, sample_next

    assert t < GREEDY_BELOW
    model = model_for(tok)
    eng = Engine(model, tok)
    rid = eng.submit([3, 4, 5], SamplingParams(max_tokens=6, temperature=t, seed=1, ignore_eos=True))
    (f,) = eng.run_until_done()
    assert f.rid == rid and f.finish_reason == "length"
    assert f.output_ids == generate_ids(model, [3, 4, 5], max_new_tokens=6)[0]
    # the sampler alone: logits whose scaled values would overflow float32 give the argmax
    logits = torch.tensor([[3.0, 9.0, -2.0], [50.0, -50.0, 49.0]])
    assert sample_next(logits, temperature=t, generator=torch.Generator().manual_seed(0)).tolist() == [1, 0]
    # just above the threshold it samples (a finite softmax, no error)
    assert sample_next(logits, temperature=GREEDY_BELOW * 2).shape == (2,)


@pytest.mark.parametrize("p", [5e-324, 1e-300, 1e-45])
def test_tiny_top_p_keeps_the_most_likely_token(p):
    """top_p below float32's smallest number rounds to 0; the nucleus still keeps the top token."""
    from codex_lab.infer.sampling import sample_next

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    out = sample_next(logits, temperature=1.0, top_p=p, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_step_same_tokens_and_one_graph_per_bucket(tok, backend):
    """The engine's fixed-shape step (batch padded to max_batch_size, tables to power-of-two
    buckets, padding rows writing only a scratch block) gives the eager engine's tokens,
    compiles each bucket once and never hands its scratch block to a request."""
    from codex_lab.infer.engine.runner.compiled import CompiledPagedStep

    model = model_for(tok, n_kv_head=2, attn_patterns=["window:6", "dense"], max_seq_len=256)
    g = torch.Generator().manual_seed(1)
    lengths = [3, 40, 1, 150, 9]  # tables of 1..21 blocks of 8: buckets 16 (the smallest, 128 tokens) and 24
    prompts = [torch.randint(0, tok.vocab_size, (n,), generator=g).tolist() for n in lengths]
    runs = {}
    for compile in (False, True):
        eng = Engine(model, tok, max_batch_size=3, max_kv_tokens=512, block_size=8, clock=FakeClock(),
                     compile=compile, compile_backend=backend)
        for i, p in enumerate(prompts):
            eng.submit(p, SamplingParams(max_tokens=5 + 4 * i, ignore_eos=True))
        seen: set[int] = set()
        while eng.has_work():
            fins = eng.step()
            for r in eng.running.values():
                seen.update(r.blocks)
            runs.setdefault(compile, []).extend(fins)
        st = eng.stats()
        assert st["kv_capacity_tokens"] == 512 and st["kv_allocated_tokens"] == 0
        if compile:
            fast = eng.fast_step
            assert isinstance(fast, CompiledPagedStep) and fast.compiled and fast.compile_error == ""
            assert fast.scratch not in seen  # padding rows write where no request lives
            assert set(fast.compile_s) == {16, 24}
            assert fast.recompiles == 0
    by_rid = [{f.rid: f.output_ids for f in runs[c]} for c in (False, True)]
    assert by_rid[0] == by_rid[1]
    for i, p in enumerate(prompts):  # and both equal the plain generator
        assert by_rid[1][i] == generate_ids(model, p, max_new_tokens=5 + 4 * i)[0]


def test_compiled_step_buckets_and_padding_rows(tok):
    """Buckets are the smallest times 1, 1.5, 2, 3, ..., clamped to max_seq_len; a step of fewer rows
    than max_batch_size returns only those rows, equal to the unpadded eager step."""
    from codex_lab.infer.engine.runner.compiled import CompiledPagedStep
    from codex_lab.nn.kv_cache import PagedKVPool

    model = model_for(tok)  # max_seq_len 128
    pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 4)
    step = CompiledPagedStep(model, pool, 4, min_bucket_tokens=16, compile=False)
    assert step.buckets == (4, 6, 8, 12, 16, 24, 32)
    assert [step.bucket(n) for n in (1, 4, 5, 9, 17, 32, 40)] == [4, 4, 6, 12, 24, 32, 32]
    with pytest.raises(ValueError, match="max_batch_size=4"):
        step([1] * 5, [0] * 5, [[0]] * 5)
    # two rows with prompts of 6 and 3 tokens, prefilled by the eager path
    from codex_lab.infer.generate import decode_step

    tables = [pool.allocate(2), pool.allocate(1)]
    for row, n in zip(tables, (6, 3)):
        ids = torch.arange(1, n + 1)[None]  # (1, n)
        decode_step(model, ids, torch.arange(n)[None], pool.views(torch.tensor([row])))
    want = decode_step(model, torch.tensor([[7], [8]]), torch.tensor([[6], [3]]),
                       pool.views(torch.tensor([tables[0], tables[1] + tables[1]])))  # (2, V)
    got = step([7, 8], [6, 3], tables)  # (2, V), padded to 4 rows and 4 blocks (16 slots)
    assert got.shape == want.shape
    # same math on the same slots; the padded slots are masked (exp(-inf) = 0), so only the
    # order of float sums over a longer row can differ
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # buckets past max_bucket_tokens are never compiled: those steps run the padded step eagerly
    capped = CompiledPagedStep(model, pool, 4, min_bucket_tokens=16, max_bucket_tokens=32, backend="eager")
    assert capped.max_compiled_blocks == 8 and sorted(capped.warmup()) == [4, 6, 8]
    long_row = pool.allocate(9)  # a table of 9 blocks: bucket 12, past the cap
    out = capped([1], [33], [long_row])  # (1, V)
    assert out.shape == (1, model.cfg.vocab_size) and sorted(capped.compile_s) == [4, 6, 8]


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_two_compiled_engines_with_different_weights_stay_apart(tok, backend):
    """Two models served side by side (a canary beside its primary), each engine with its own
    compiled step: guard skipping on the reused graphs must still tell them apart, so each
    keeps giving its own model's greedy tokens while the two alternate step by step."""
    prompts = [[5, 9, 2, 7], [11, 3]]
    models = [model_for(tok), model_for(tok)]
    with torch.no_grad():
        for p in models[1].parameters():  # a different model of the same shape
            p.mul_(-1.0)
    engines = [Engine(m, tok, max_batch_size=2, compile=True, compile_backend=backend) for m in models]
    for eng in engines:
        for p in prompts:
            eng.submit(p, SamplingParams(max_tokens=12, ignore_eos=True))
    done: list[dict[int, list[int]]] = [{}, {}]
    while any(e.has_work() for e in engines):
        for i, eng in enumerate(engines):  # interleaved: each step replays a graph of the other's code
            done[i].update({f.rid: f.output_ids for f in eng.step()})
    for i, m in enumerate(models):
        want = [generate_ids(m, p, max_new_tokens=12)[0] for p in prompts]
        assert [done[i][r] for r in sorted(done[i])] == want, f"engine {i}"
    assert done[0] != done[1]  # the two models really differ


@pytest.mark.parametrize("kw", [{"moe_layers": [1], "n_experts": 4, "moe_top_k": 2},
                                {"attn_patterns": ["window:8+blockstride:8:3", "dense"], "attn_impl": "blocks",
                                 "moe_layers": [1], "n_experts": 4},
                                {"attn_patterns": ["window:8+blockstride:8:3", "dense"], "attn_impl": "flex"}])
def test_compiled_step_on_moe_and_sparse_models(tok, kw):
    """MoE layers (data-dependent dispatch: graph breaks) and block-sparse layers decode through
    the compiled step with the plain generator's tokens and no recompiles; a model with sparse
    FlexAttention layers (a new block mask, so a new compile, every position) runs the step
    eagerly and says why."""
    torch.manual_seed(0)
    model = CodexModel(tiny_config(vocab_size=tok.vocab_size, **kw)).eval()
    eng = Engine(model, tok, max_batch_size=3, compile=True, compile_backend="eager")
    prompts = [[5, 9, 2, 7], [11, 3], list(range(1, 40))]
    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=8, ignore_eos=True))
    done = {f.rid: f.output_ids for f in eng.run_until_done()}
    assert [done[i] for i in range(3)] == [generate_ids(model, p, max_new_tokens=8)[0] for p in prompts]
    fast = eng.fast_step
    assert fast.recompiles == 0
    if kw.get("attn_impl") == "flex":
        assert not fast.compiled and "flex" in fast.compile_error
    else:
        assert fast.compiled and fast.compile_error == "" and fast.compile_s


def test_another_models_collected_moe_cache_does_not_recompile_the_step(tok):
    """The stacked-experts cache is a weak dictionary of every MoE layer's weights: a compiled
    step must not guard on it, or another model's entry being collected recompiles the step."""
    import gc

    from codex_lab.nn.moe_dispatch import stacked_weights

    kw = {"moe_layers": [1], "n_experts": 4, "moe_top_k": 2}
    torch.manual_seed(0)
    model = CodexModel(tiny_config(vocab_size=tok.vocab_size, **kw)).eval()
    others = [CodexModel(tiny_config(vocab_size=tok.vocab_size, **kw)).eval() for _ in range(3)]
    for o in others:  # entries of other models in the cache, before and after this model's own
        stacked_weights(o.layers[1].ffn.experts)
    eng = Engine(model, tok, max_batch_size=2, compile=True, compile_backend="eager")
    for p in ([5, 9, 2, 7], [11, 3]):
        eng.submit(p, SamplingParams(max_tokens=10, ignore_eos=True))
    eng.step()
    eng.step()
    del others  # the other models go: their cache entries are collected between steps
    gc.collect()
    done = {f.rid: f.output_ids for f in eng.run_until_done()}
    assert [done[i] for i in range(2)] == [generate_ids(model, p, max_new_tokens=10)[0] for p in ([5, 9, 2, 7], [11, 3])]
    assert eng.fast_step.recompiles == 0
