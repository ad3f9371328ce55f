"""New prompts ride in the compiled decode step as extra rows (codex_lab.infer.engine.runner.mixed): one graph
call per step instead of an eager prefill beside it. The tokens stay the plain generator's, a
prompt row's logits are its prefill's, every bucket of both shapes compiles (past dynamo's
default limit of 8 graphs), and steps that do not fit, or whose combined call fails, take
the separate path with the same tokens."""

from __future__ import annotations

import pytest
import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.generate import decode_step, generate_ids
from codex_lab.infer.engine.runner.compiled import CompiledPagedStep
from codex_lab.nn.kv_cache import PagedKVPool

from conftest import seeded_model


def _staggered(eng: Engine, prompts: list[list[int]], n_tokens: list[int]) -> dict[int, list[int]]:
    """Submit two prompts, then one more every other step, so prompts arrive while others decode."""
    done: dict[int, list[int]] = {}
    queue = list(enumerate(prompts))
    for i, p in queue[:2]:
        eng.submit(p, SamplingParams(max_tokens=n_tokens[i], ignore_eos=True))
    queue, step = queue[2:], 0
    while eng.has_work() or queue:
        if queue and step % 2 == 1:
            i, p = queue.pop(0)
            eng.submit(p, SamplingParams(max_tokens=n_tokens[i], ignore_eos=True))
        done.update({f.rid: f.output_ids for f in eng.step()})
        step += 1
    return done


def _row_counts(monkeypatch) -> list[int]:
    """Rows of every call of a CompiledPagedStep from now on."""
    seen: list[int] = []
    call = CompiledPagedStep.__call__

    def counting(self, tokens, positions, tables):
        seen.append(len(tokens))
        return call(self, tokens, positions, tables)

    monkeypatch.setattr(CompiledPagedStep, "__call__", counting)
    return seen


@pytest.mark.parametrize("backend,kw", [("eager", {}), ("eager", {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}),
                                        ("inductor", {})])
def test_mixed_steps_give_the_plain_generators_tokens(tok, backend, kw, monkeypatch):
    model = seeded_model(tok, **kw)
    g = torch.Generator().manual_seed(3)
    lengths = [5, 9, 3, 14, 30, 2, 7]  # the 30-token prompt does not fit the spare rows: the separate path
    prompts = [torch.randint(0, tok.vocab_size, (n,), generator=g).tolist() for n in lengths]
    n_tokens = [6 + 3 * i for i in range(len(prompts))]
    rows = _row_counts(monkeypatch)
    eng = Engine(model, tok, max_batch_size=3, block_size=8, compile=True, compile_backend=backend,
                 step_options={"mixed_rows": 16, "min_bucket_tokens": 16})
    done = _staggered(eng, prompts, n_tokens)
    for i, p in enumerate(prompts):
        assert done[i] == generate_ids(model, p, max_new_tokens=n_tokens[i])[0], f"request {i}"
    fast = eng.fast_step
    assert any(r > 3 for r in rows), rows  # steps of the mixed shape ran (decode rows + prompt tokens)
    assert fast.mixed_compile_s and fast.recompiles == 0 and fast.compile_error == ""
    # a prompt-only step that fits the decode shape rides it too; the long prompt prefilled eagerly
    assert any(r <= 3 for r in rows) and eng.pool.n_free == eng.usable_blocks


def test_a_prompt_tokens_rows_give_its_prefill_logits(tok):
    """The last of a prompt's rows gives the logits a prefill forward gives, beside a decode row."""
    model = seeded_model(tok, n_kv_head=2)
    pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 4)
    step = CompiledPagedStep(model, pool, 2, min_bucket_tokens=16, mixed_rows=8, compile=False)
    other = pool.allocate(2)  # a request with 5 tokens cached, decoding its 6th
    decode_step(model, torch.arange(1, 6)[None], torch.arange(5)[None], pool.views(torch.tensor([other])))
    prompt, table = [9, 4, 7, 1, 3, 8], pool.allocate(2)
    got = step([2] + prompt, [5] + list(range(6)), [other] + [table] * 6)  # (7, V): 1 decode row + 6 prompt rows
    ref_pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 4)
    want = decode_step(model, torch.tensor([prompt]), torch.arange(6)[None], ref_pool.views(torch.tensor([table])))
    assert got.shape == (7, model.cfg.vocab_size)
    # the same math over the same keys; only the order of float sums differs (padded slots are masked)
    torch.testing.assert_close(got[-1:], want, atol=1e-5, rtol=1e-5)
    # and the keys/values the rows wrote are the prefill's
    for layer in range(model.cfg.n_layer):
        torch.testing.assert_close(pool.k[layer][table], ref_pool.k[layer][table], atol=1e-5, rtol=1e-5)


def test_which_steps_can_mix(tok):
    model = seeded_model(tok)  # max_seq_len 128: 32 blocks of 4
    pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 4)
    with pytest.raises(ValueError, match="must exceed max_batch_size"):
        CompiledPagedStep(model, pool, 4, mixed_rows=4)
    step = CompiledPagedStep(model, pool, 4, min_bucket_tokens=16, mixed_rows=8, mixed_max_tokens=32, backend="eager")
    assert step.max_mixed_blocks == 8 and step.max_compiled_blocks == 32
    assert step.can_mix(8, 8) and step.can_mix(3, 30)  # the mixed shape; the decode shape (any bucket)
    assert not step.can_mix(9, 1) and not step.can_mix(5, 9)  # too many rows; too long a table for the mixed shape
    with pytest.raises(ValueError, match="mixed_rows=8"):
        step([1] * 9, [0] * 9, [[0]] * 9)
    plain = CompiledPagedStep(model, pool, 4, backend="eager")
    assert not plain.can_mix(5, 1) and plain.mixed_rows == 0


def test_every_bucket_of_both_shapes_compiles_past_dynamos_default_limit(tok):
    """9 buckets in 2 shapes are 18 graphs of one function; dynamo's default limit (8) would
    run the rest eagerly, silently."""
    model = seeded_model(tok)
    pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 4)
    step = CompiledPagedStep(model, pool, 2, min_bucket_tokens=8, mixed_rows=4, mixed_max_tokens=128, backend="eager")
    assert len(step.buckets) == 9
    # the step's own count: a compile elsewhere in the process (another test's engine, a background
    # thread) does not move it, as it moved dynamo's process-wide counter (19 where 18 were expected)
    per = step.warmup()
    assert sorted(per) == list(step.buckets) and len(step.compile_s) == len(step.mixed_compile_s) == 9
    assert step.graphs == 18 and step.recompiles == 0
    # every later step, in any bucket of either shape, replays a graph
    for rows in (1, 3):
        for nb in step.buckets:
            step([1] * rows, [nb * 4 - 1] * rows, [[step.scratch] * nb] * rows)
    assert step.recompiles == 0


def test_a_compile_in_another_thread_is_not_the_steps_recompile(tok):
    """Another function compiled in another thread while the step runs moves dynamo's process-wide
    counter, never the step's own: its recompiles stay 0. The step's own recompile (a new shape
    its graphs did not cover, with guards evaluated) does count."""
    import threading

    from codex_lab.infer.compile_options import graphs_compiled

    model = seeded_model(tok)
    pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 4)
    step = CompiledPagedStep(model, pool, 2, min_bucket_tokens=8, backend="eager")
    step([1, 2], [3, 3], [[step.scratch], [step.scratch]])
    mine = step.graphs
    assert mine >= 1 and step.recompiles == 0
    before = graphs_compiled()

    def elsewhere() -> None:
        f = torch.compile(lambda x: torch.sin(x) * 3 + 1, backend="eager")
        f(torch.ones(5))

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    step([1, 2], [3, 3], [[step.scratch], [step.scratch]])
    assert graphs_compiled() > before  # the process compiled a graph ...
    assert step.graphs == mine and step.recompiles == 0  # ... that was not the step's
    # the counterfactual: the step's own function recompiled (a graph behind the bucket's back) counts;
    # dynamo's graph limit is lifted as for the step's planned compiles (else, past 8 graphs of the
    # step's code in this process, dynamo would run the new shape eagerly and compile nothing)
    from codex_lab.infer.compile_options import first_compile

    with first_compile(step.options):
        step._fn(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long),
                 torch.full((3, step.buckets[0]), step.scratch))
    assert step.recompiles == 1


def test_a_failing_mixed_call_falls_back_to_the_separate_path(tok, monkeypatch):
    model = seeded_model(tok)
    prompts = [[5, 9, 2, 7], [11, 3, 8], [4, 4, 1, 9, 2]]
    want = [generate_ids(model, p, max_new_tokens=8)[0] for p in prompts]
    call = CompiledPagedStep.__call__
    failed = []

    def broken(self, tokens, positions, tables):
        if len(tokens) > self.max_batch_size:  # the mixed shape only
            failed.append(len(tokens))
            raise RuntimeError("the mixed graph broke")
        return call(self, tokens, positions, tables)

    monkeypatch.setattr(CompiledPagedStep, "__call__", broken)
    eng = Engine(model, tok, max_batch_size=2, compile=True, compile_backend="eager", step_options={"mixed_rows": 12})
    done = _staggered(eng, prompts, [8, 8, 8])
    assert failed and [done[i] for i in range(3)] == want
    assert eng.pool.n_free == eng.usable_blocks


def test_prompts_that_do_not_all_fit_wait_their_turn_a_step_each(tok):
    """Two requests decode; three 4-token prompts arrive at once into 8 mixed rows: each step
    takes the prompts that fit the rows left (in order), the rest wait for the next step."""
    model = seeded_model(tok)
    eng = Engine(model, tok, max_batch_size=5, compile=True, compile_backend="eager", step_options={"mixed_rows": 8})
    first = [[5, 9, 2], [11, 3, 8]]
    later = [[4, 4, 1, 9], [7, 2, 2, 6], [1, 8, 3, 5]]
    for p in first:
        eng.submit(p, SamplingParams(max_tokens=12, ignore_eos=True))
    done = {f.rid: f.output_ids for f in eng.step()}  # both prefilled (6 rows): no decode yet
    for p in later:
        eng.submit(p, SamplingParams(max_tokens=6, ignore_eos=True))
    start = eng.steps
    while eng.has_work():
        done.update({f.rid: f.output_ids for f in eng.step()})
    steps = {s: pre for s, pre, _ in eng.timeline}
    # 2 decoding + 4 prompt rows; then 3 + 4; then 4 + 4: one prompt per step
    assert [steps[start], steps[start + 1], steps[start + 2]] == [[2], [3], [4]], list(eng.timeline)[:6]
    want = [generate_ids(model, p, max_new_tokens=12)[0] for p in first] + \
        [generate_ids(model, p, max_new_tokens=6)[0] for p in later]
    assert [done[i] for i in range(5)] == want


def test_a_burst_at_an_idle_engine_that_does_not_fit_is_prefilled_together(tok, monkeypatch):
    """Nobody decodes yet: three 4-token prompts into 8 mixed rows go through one eager prefill
    (no prompt waits a step), and the step after decodes all three in the decode shape."""
    model = seeded_model(tok)
    rows = _row_counts(monkeypatch)
    eng = Engine(model, tok, max_batch_size=5, compile=True, compile_backend="eager", step_options={"mixed_rows": 8})
    later = [[4, 4, 1, 9], [7, 2, 2, 6], [1, 8, 3, 5]]
    for p in later:
        eng.submit(p, SamplingParams(max_tokens=6, ignore_eos=True))
    done = {f.rid: f.output_ids for f in eng.step()}
    assert list(eng.timeline)[0][1] == [0, 1, 2] and rows == []  # all prefilled at once, eagerly
    while eng.has_work():
        done.update({f.rid: f.output_ids for f in eng.step()})
    assert rows and max(rows) == 3
    assert [done[i] for i in range(3)] == [generate_ids(model, p, max_new_tokens=6)[0] for p in later]


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_request_alone_runs_the_one_row_shape_with_the_plain_generators_tokens(tok, backend):
    """``solo``: one request decoding alone computes one row, not max_batch_size; two at once use
    the decode shape; the tokens are the plain generator's either way and nothing recompiles."""
    model = seeded_model(tok)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, tok.vocab_size, (n,), generator=g).tolist() for n in (6, 11)]
    eng = Engine(model, tok, max_batch_size=4, block_size=8, compile=True, compile_backend=backend,
                 step_options={"min_bucket_tokens": 16, "solo": True})
    fast = eng.fast_step
    # the one-row step is one graph, symbolic in the table's length
    assert fast.solo and [(r, nb) for r, nb in fast.compile_plan() if r == 1] == [(1, fast.solo_blocks)]
    eng.submit(prompts[0], SamplingParams(max_tokens=9, ignore_eos=True))
    alone = {f.rid: f.output_ids for f in eng.run_until_done()}
    assert alone[0] == generate_ids(model, prompts[0], max_new_tokens=9)[0]
    # which shapes ran: each one's graphs are built on first use (no warm-up here)
    assert fast.solo_compile_s and not fast.compile_s  # the decode shape never ran
    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=7, ignore_eos=True))
    both = {f.rid: f.output_ids for f in eng.run_until_done()}
    for rid, p in zip(sorted(both), prompts):
        assert both[rid] == generate_ids(model, p, max_new_tokens=7)[0]
    assert fast.compile_s and fast.recompiles == 0 and fast.compile_error == ""  # two at once: the 4-row shape


def test_one_slot_has_no_separate_one_row_shape(tok):
    model = seeded_model(tok)
    pool = PagedKVPool(model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.head_dim, 40, 8)
    step = CompiledPagedStep(model, pool, 1, backend="eager", solo=True, min_bucket_tokens=16)
    assert not step.solo and all(r == 1 for r, _ in step.compile_plan())
    assert len(step.compile_plan()) == len(step.buckets)  # each bucket once, not twice


@pytest.mark.parametrize("skip_guards", [True, False])
def test_the_one_row_graph_serves_every_table_length_without_recompiling(tok, skip_guards):
    """A request alone whose table grows from 1 to 7 blocks runs ONE one-row graph (its table's
    length symbolic; a 1-block table is padded to 2, as dynamo specialises a length of 1): the
    plain generator's tokens, no recompile, with dynamo's guards skipped or evaluated."""
    model = seeded_model(tok)
    eng = Engine(model, tok, max_batch_size=4, block_size=8, compile=True, compile_backend="eager",
                 step_options={"min_bucket_tokens": 8, "solo": True})
    fast = eng.fast_step
    fast.skip_guards = skip_guards
    assert fast.solo_blocks == 2 and fast.min_blocks == 1
    prompt = [5, 9, 2]
    eng.submit(prompt, SamplingParams(max_tokens=50, ignore_eos=True))  # 53 tokens: 7 blocks of 8
    out = eng.run_until_done()[0].output_ids
    assert out == generate_ids(model, prompt, max_new_tokens=50)[0]
    assert list(fast.solo_compile_s) == [2] and not fast.compile_s  # one graph, the decode shape never ran
    assert fast.recompiles == 0 and fast.compile_error == ""


@pytest.mark.parametrize("skip_guards", [True, False])
def test_frozen_weights_compile_one_graph_per_shape_for_every_length(tok, skip_guards):
    """With frozen weights (``freezing``: the C++ GEMM template's options, which Inductor never
    caches) each shape is ONE graph symbolic in the table's length, not one per bucket: requests
    decoding together, arriving mid-run (the mixed shape) and alone, over tables of 1 to 7 blocks,
    give the plain generator's tokens, with three graphs in all and no recompile. The eager backend
    only traces (it ignores the options), so dynamo's shapes and guards are what is tested."""
    model = seeded_model(tok)
    eng = Engine(model, tok, max_batch_size=3, block_size=8, compile=True, compile_backend="eager",
                 step_options={"min_bucket_tokens": 8, "solo": True, "mixed_rows": 16,
                               "options": {"freezing": True}})
    fast = eng.fast_step
    fast.skip_guards = skip_guards
    assert fast.dynamic_blocks and fast.compile_plan() == [(3, 2), (16, 2), (1, 2)]
    assert fast.bucket(1) == 2 and fast.bucket(7) == 7  # the table's own length: no bucket padding
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, tok.vocab_size, (n,), generator=g).tolist() for n in (2, 1, 9)]
    news = (40, 35, 45)
    for p, n in zip(prompts[:2], news[:2]):  # two together: the decode shape, its tables growing from 1 to 6 blocks
        eng.submit(p, SamplingParams(max_tokens=n, ignore_eos=True))
    for _ in range(20):
        eng.step()
    # a third arrives (its prompt rides in the mixed shape), then decodes alone (the one-row graph)
    eng.submit(prompts[2], SamplingParams(max_tokens=news[2], ignore_eos=True))
    done = {f.rid: f.output_ids for f in eng.run_until_done()}
    assert [done[i] for i in range(3)] == [generate_ids(model, p, max_new_tokens=n)[0] for p, n in zip(prompts, news)]
    assert len(fast.compile_s) == len(fast.solo_compile_s) == 1 and len(fast.mixed_compile_s) == 1
    assert fast.recompiles == 0 and fast.compile_error == ""
