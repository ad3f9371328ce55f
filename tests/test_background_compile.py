"""The server's decode step compiles in the background: until every bucket is built, steps run
the same padded step eagerly (the same tokens), then all switch to the graphs at once; a
compile that fails leaves the steps eager and says why. `codex-lab serve` uses this so its
first answer does not wait for the compiler (issue: a server that answers in seconds)."""

from __future__ import annotations

import threading

import pytest
import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.generate import generate_ids
from codex_lab.nn.model import CodexModel

from serving_helpers import run_greedy
from conftest import COMPILE_HANG_S as HANG_S, seeded_model, tiny_config


def _run(eng: Engine, prompts: list[list[int]], n: int = 10) -> list[list[int]]:
    return run_greedy(eng, prompts, n)


def test_steps_stay_eager_until_every_bucket_is_compiled_then_switch(tok):
    model = seeded_model(tok)
    eng = Engine(model, tok, max_batch_size=2, compile=True, compile_backend="eager")
    step = eng.fast_step
    gate = threading.Event()
    calls = {"graph": 0}
    compiled = step._compiled

    def slow_compiled(*a, **kw):  # hold the background compile until the first requests are done
        if not gate.is_set() and threading.current_thread().name == "codex-lab-compile":
            gate.wait(HANG_S)
        if threading.current_thread().name != "codex-lab-compile":
            calls["graph"] += 1
        return compiled(*a, **kw)

    step._compiled = slow_compiled
    finished: list[dict] = []
    step.warmup_background(finished.append)
    prompts = [[5, 9, 2, 7], [11, 3]]
    want = [generate_ids(model, p, max_new_tokens=10)[0] for p in prompts]
    assert _run(eng, prompts) == want and calls["graph"] == 0  # served while compiling: eager steps
    assert not step.ready.is_set()
    gate.set()
    assert step.ready.wait(HANG_S) and finished and sorted(finished[0]) == list(step.buckets[: len(finished[0])])
    assert _run(eng, prompts) == want and calls["graph"] > 0  # now through the graphs, same tokens
    assert step.recompiles == 0


def test_a_failed_background_compile_stays_eager_and_says_why(tok):
    model = seeded_model(tok)
    eng = Engine(model, tok, max_batch_size=2, compile=True, compile_backend="eager")
    step = eng.fast_step

    def broken(*a, **kw):
        raise RuntimeError("no C++ compiler here")

    step._fn = broken
    step.warmup_background()
    assert step.ready.wait(HANG_S)
    assert not step.compiled and "no C++ compiler" in step.compile_error
    prompts = [[5, 9, 2, 7]]
    assert _run(eng, prompts) == [generate_ids(model, prompts[0], max_new_tokens=10)[0]]


@pytest.mark.parametrize("freeze", [True, False])
def test_after_the_background_compile_long_lived_objects_are_frozen(tok, freeze):
    """What the compiler leaves behind (~550k objects for the shipped model) is moved out of the
    cyclic collector's reach, so a full collection cannot stall every stream for ~0.5 s."""
    import gc

    gc.unfreeze()  # this worker's earlier tests may have frozen objects
    assert gc.get_freeze_count() == 0
    eng = Engine(seeded_model(tok), tok, max_batch_size=2, compile=True, compile_backend="eager")
    eng.fast_step.warmup_background(freeze_gc=freeze).join(120)
    assert eng.fast_step.ready.is_set()
    # the engine itself (alive now) is among the frozen objects when freezing is on
    assert (gc.get_freeze_count() > 1000) == freeze, gc.get_freeze_count()
    gc.unfreeze()


def test_the_compile_thread_hands_the_interpreter_lock_back_quickly_then_restores_it(tok):
    """While buckets compile in the background the switch interval is short (the serving
    thread, which lets go of the lock in every torch op, gets it back within 0.2 ms instead of
    5 ms per op); afterwards, and after a failed compile, the process's own interval is back."""
    import sys

    from codex_lab.infer.engine.runner import background

    before = sys.getswitchinterval()
    for fail in (False, True):
        eng = Engine(seeded_model(tok), tok, max_batch_size=2, compile=True, compile_backend="eager")
        seen = []

        def warmup(buckets=None, _fail=fail):
            seen.append(sys.getswitchinterval())
            if _fail:
                raise RuntimeError("the compiler broke")
            return {}

        eng.fast_step.warmup = warmup
        eng.fast_step.warmup_background(freeze_gc=False).join(60)
        assert seen and seen[0] <= background.COMPILE_SWITCH_INTERVAL_S < before
        assert sys.getswitchinterval() == before
        assert ("the compiler broke" in eng.fast_step.compile_error) == fail


def test_the_engine_step_with_frozen_weights_and_the_gemm_template_matches_eager(tok):
    """What `codex-lab serve` compiles (serve.compiled.compiled_engine): the same greedy tokens
    as the eager engine; use_options() is refused once a bucket has compiled; and where the
    template cannot serve (here: freezing left off, so the weights are not constants), the first
    bucket recompiles with ATen's matmuls and says so instead of going eager."""
    from codex_lab.infer.compile_options import decode_compile_options

    model = seeded_model(tok)
    prompts = [[5, 9, 2, 7], [11, 3]]
    want = [generate_ids(model, p, max_new_tokens=6)[0] for p in prompts]
    eng = Engine(model, tok, max_batch_size=2, compile=True)
    eng.fast_step.use_options(decode_compile_options(None, "inductor", None, torch.device("cpu")))
    eng.fast_step.warmup([1])
    assert eng.fast_step.compiled and eng.fast_step.compile_error == ""
    assert _run(eng, prompts, n=6) == want and eng.fast_step.recompiles == 0
    with pytest.raises(RuntimeError, match="none of whose buckets has compiled"):
        eng.fast_step.use_options({})
    torch.manual_seed(1)  # another model: dynamo must trace anew, not reuse the graph built above
    other = CodexModel(tiny_config(vocab_size=tok.vocab_size)).eval()
    want = [generate_ids(other, p, max_new_tokens=6)[0] for p in prompts]
    eng2 = Engine(other, tok, max_batch_size=2, compile=True)
    eng2.fast_step.use_options({"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    eng2.fast_step.warmup([1])
    assert eng2.fast_step.compiled and eng2.fast_step.compile_error.startswith("without the C++ GEMM template")
    assert _run(eng2, prompts, n=6) == want


def test_the_served_engine_carries_prompts_in_its_step(tok):
    """`codex-lab serve`'s engine (compiled_engine): the step's second shape has twice the
    batch's rows and its smallest bucket holds 48 tokens; mixed=False leaves prefill eager."""
    from codex_lab.serve.compiled import compiled_engine

    model = seeded_model(tok)
    eng = compiled_engine(model, tok, max_batch_size=3, block_size=8, compile_backend="eager")
    step = eng.fast_step
    assert step.mixed_rows == 6 and step.min_blocks == 6  # 48 tokens in blocks of 8
    assert step.ready.wait(HANG_S) and step.compile_error == "" and step.mixed_compile_s
    prompts = [[5, 9, 2, 7], [11, 3]]
    assert _run(eng, prompts) == [generate_ids(model, p, max_new_tokens=10)[0] for p in prompts]
    plain = compiled_engine(model, tok, max_batch_size=3, compile_backend="eager", mixed=False)
    assert plain.fast_step.mixed_rows == 0 and plain.fast_step.ready.wait(HANG_S)


def test_compile_progress_counts_the_graphs_warmup_builds(tok):
    """What /health and /metrics report while the server warms: (graphs done, graphs in all),
    from (0, n) before the background compile to (n, n) after it; n is warmup()'s plan (all three
    shapes), and the warming flag is up only while the compile thread runs."""
    from codex_lab.infer.engine.runner.options import served_step_options

    eng = Engine(seeded_model(tok), tok, max_batch_size=2, compile=True, compile_backend="eager",
                 step_options=served_step_options(2))
    step = eng.fast_step
    plan = step.compile_plan()
    assert step.compile_progress() == (0, len(plan)) and not step.warming
    # the decode shape, the mixed one (2 x the batch) and the one-row shape of a request alone
    assert {rows for rows, _ in plan} == {2, 4, 1}
    step.warmup_background(freeze_gc=False).join(120)
    assert step.compile_progress() == (len(plan), len(plan)) and not step.warming
    assert len(step.compile_s) + len(step.mixed_compile_s) + len(step.solo_compile_s) == len(plan)
