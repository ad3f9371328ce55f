"""Batched prefill (``codex_lab.infer.engine.runner.eager.prefill_batch``) held to its reference, one
prefill forward per request (``Engine.batch_prefill = False``): the same tokens, logits equal
up to float rounding, one forward for a burst instead of one per request, chunked prompts,
attention patterns (window, strided, MoBA) and the fallback when the batched forward raises."""

import pytest
import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.generate import generate_ids
from codex_lab.infer.engine.runner.eager import prefill_batch, prefill_one
from codex_lab.infer.engine.scheduler import grow
from codex_lab.nn.model import CodexModel

from conftest import tiny_config

VOCAB = 300
LENGTHS = [3, 17, 1, 30, 9, 12, 8, 16]  # around block edges (block_size 8): 8, 16 end exactly on one


def model_for(**kw) -> CodexModel:
    torch.manual_seed(0)
    return CodexModel(tiny_config(vocab_size=VOCAB, **kw)).eval()


def prompts(lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


class _Tok:
    """The engine needs decode and eot_id only; ids stand for themselves."""

    eot_id = VOCAB - 1
    vocab_size = VOCAB

    def decode(self, ids):
        return "".join(chr(0x100 + i) for i in ids)


def run(model, ps, *, batch_prefill, max_tokens=6, **kw):
    eng = Engine(model, _Tok(), max_batch_size=len(ps), block_size=8, **kw)
    eng.batch_prefill = batch_prefill
    seen: list[tuple[int, int]] = []
    h = model.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    try:
        rids = [eng.submit(p, SamplingParams(max_tokens=max_tokens)) for p in ps]
        done = {f.rid: f for f in eng.run_until_done()}
    finally:
        h.remove()
    return [done[r] for r in rids], seen, eng


PATTERNS = [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]},
            {"attn_patterns": ["strided:3", "dense"]}, {"attn_patterns": ["dense", "moba:8:2"]}]


@pytest.mark.parametrize("kw", PATTERNS, ids=["dense", "gqa+window", "strided", "moba"])
def test_batched_prefill_gives_the_reference_tokens(kw):
    model = model_for(**kw)
    ps = prompts()
    fast, seen_fast, _ = run(model, ps, batch_prefill=True)
    ref, seen_ref, _ = run(model, ps, batch_prefill=False)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert a.output_ids == b.output_ids and a.finish_reason == b.finish_reason, f"request {i}"
        want, _ = generate_ids(model, ps[i], max_new_tokens=6, eos_id=_Tok.eot_id)
        assert a.output_ids == want, f"request {i} against the plain generator"
    # the burst of 8 arrivals: ONE prefill forward (8, 30) instead of eight (1, n), then decode (8, 1)
    assert seen_fast[:2] == [(len(ps), max(LENGTHS)), (len(ps), 1)], seen_fast[:3]
    assert seen_ref[: len(ps) + 1] == [(1, n) for n in LENGTHS] + [(len(ps), 1)], seen_ref[: len(ps) + 1]


def test_batched_prefill_logits_equal_one_by_one():
    model = model_for(n_kv_head=2)
    ps = prompts([5, 13, 8, 1, 24])
    eng = Engine(model, _Tok(), max_batch_size=8, block_size=8)
    for p in ps:
        eng.submit(p, SamplingParams(max_tokens=1))
    eng._drain_inbox()
    reqs = list(eng.waiting)
    for r in reqs:
        grow(eng.pool, r, len(r.prompt))
    rows = [(r, len(r.prompt)) for r in reqs]
    batched = prefill_batch(model, eng.pool, rows, eng.scratch, eng.device)  # (B, V)
    # the K/V the batch wrote are what each request attends to next: a one-by-one prefill of the
    # same prompt into the same blocks overwrites them with the values it computes itself
    single = torch.cat([prefill_one(model, eng.pool, r, n, eng.device) for r, n in rows])  # (B, V)
    assert batched.shape == single.shape == (len(ps), VOCAB)
    # float32 logits of O(1); a batched matmul sums in another order: differences are ~1e-6
    torch.testing.assert_close(batched, single, rtol=0, atol=1e-4)


def test_chunked_prefill_in_batches_gives_the_reference_tokens():
    model = model_for()
    ps = prompts([30, 3, 21, 12])
    fast, seen, eng = run(model, ps, batch_prefill=True, max_prefill_tokens=7, max_tokens=5)
    ref, _, _ = run(model, ps, batch_prefill=False, max_prefill_tokens=7, max_tokens=5)
    assert [f.output_ids for f in fast] == [f.output_ids for f in ref]
    # at most 7 prompt tokens a step, shared by the rows prefilled together
    steps_with_prefill = [p for _, p, _ in eng.timeline if p]
    assert len(steps_with_prefill) >= -(-sum(len(p) for p in ps) // 7)


def test_a_failing_batch_falls_back_to_one_forward_per_request(monkeypatch):
    import codex_lab.infer.engine.loop as engine_mod

    def broken(*a, **k):
        raise RuntimeError("batched forward failed")

    monkeypatch.setattr(engine_mod, "prefill_batch", broken)
    model = model_for()
    ps = prompts([4, 9, 15])
    fast, _, _ = run(model, ps, batch_prefill=True)
    monkeypatch.undo()
    ref, _, _ = run(model, ps, batch_prefill=False)
    assert [f.output_ids for f in fast] == [f.output_ids for f in ref]
    assert all(f.finish_reason == "length" for f in fast)


def test_the_scratch_block_is_owned_by_no_request_and_never_counted():
    model = model_for()
    eng = Engine(model, _Tok(), max_batch_size=4, max_kv_tokens=64, block_size=8)
    assert eng.stats()["kv_capacity_tokens"] == 64  # the scratch block is extra, not taken from the budget
    assert eng.pool.n_free == 64 // 8 and eng.scratch not in eng.pool._free
    for p in prompts([7, 20, 2]):
        eng.submit(p, SamplingParams(max_tokens=3))
    eng.step()
    assert all(eng.scratch not in r.blocks for r in eng.running.values())
    eng.run_until_done()
    assert eng.pool.n_free == 64 // 8  # every request's blocks came back; the scratch stays out
