"""The serving engine's frozen-weight graphs compiled ahead of time
(codex_lab.infer.engine.runner.aot_paged; `codex-lab serve`'s step): the same tokens as eager
decoding, through the packages, over tables longer than the one they were exported with; a
restarted engine loads every package from the compile cache instead of building it; the key
follows what the code depends on; a package that cannot be built falls back to torch.compile and
says why."""

from __future__ import annotations

import pytest
import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.engine.runner import compiled as compiled_step
from codex_lab.infer.engine.runner.aot_paged import PagedSpec, paged_package_key
from codex_lab.infer.generate import generate_ids
from codex_lab.serve.compiled import compiled_engine

from serving_helpers import run_greedy
from conftest import COMPILE_HANG_S as HANG_S, seeded_model

PROMPTS = [[5, 9, 2, 7, 30, 41, 12, 8, 19, 22], [11, 3, 60]]
NEW = 40  # 50 tokens: a table of 4 blocks of 16, longer than the 2 the packages were exported with


def _model(tok):
    """The engine tests' tiny model with its weights scaled x3, so its greedy tokens vary (a model
    that repeats one id would make equal token lists a weak check)."""
    m = seeded_model(tok)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)
    return m


def _run(eng: Engine, prompts: list[list[int]], n: int = NEW) -> list[list[int]]:
    return run_greedy(eng, prompts, n)


def _count_calls(step) -> dict[int, int]:
    """Wrap each loaded package's runner to count its calls: rows -> calls."""
    calls = {rows: 0 for rows in step.packages}
    for rows, package in step.packages.items():
        def counted(*a, _run=package.runner, _rows=rows):
            calls[_rows] += 1
            return _run(*a)
        package.runner = counted
    return calls


def test_the_served_step_ahead_of_time_equals_eager_decoding_and_a_restart_loads_it(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("CODEX_LAB_COMPILE_CACHE", str(tmp_path))
    model = _model(tok)
    want = [generate_ids(model, p, max_new_tokens=NEW)[0] for p in PROMPTS]
    assert len({t for w in want for t in w}) >= 5  # the tokens move: equality below is a real check

    eng = compiled_engine(model, tok, max_batch_size=2, mixed=False)
    step = eng.fast_step
    assert step.ready.wait(HANG_S) and not step.compile_error, step.compile_error
    # two frozen-weight shapes: the batch of 2 rows and a request alone; both built, none loaded
    assert sorted(step.packages) == [1, 2] and not any(step.aot_from_disk.values())
    assert len(list(tmp_path.rglob("step-paged-*.pt2"))) == 2
    calls = _count_calls(step)
    assert _run(eng, PROMPTS) == want  # two requests together: the 2-row package
    assert _run(eng, PROMPTS[:1]) == want[:1]  # one alone: the 1-row package
    assert calls[2] >= NEW - 1 and calls[1] >= NEW - 1  # every decode step of each run went through a package
    assert step.graphs == 0 and step.recompiles == 0  # no dynamo graph was compiled for them

    # a restart over the same cache: every package loaded, nothing built, the same tokens
    again = compiled_engine(model, tok, max_batch_size=2, mixed=False)
    assert again.fast_step.ready.wait(HANG_S) and not again.fast_step.compile_error
    assert sorted(again.fast_step.aot_from_disk) == [1, 2] and all(again.fast_step.aot_from_disk.values())
    assert len(list(tmp_path.rglob("step-paged-*.pt2"))) == 2
    assert _run(again, PROMPTS) == want


def test_the_paged_package_key_follows_what_the_code_depends_on(tok):
    model = seeded_model(tok)
    base = dict(model=model, n_layer=2, n_kv_head=4, head_dim=16, n_blocks=17, block_size=16, dtype=torch.float32,
                rows=2, min_blocks=2, max_blocks=8, one_query=True, options={"freezing": True}, threads=1)
    key = paged_package_key(PagedSpec(**base))
    assert key == paged_package_key(PagedSpec(**base))  # deterministic
    changed = [dict(rows=1), dict(n_blocks=33), dict(block_size=8), dict(max_blocks=9), dict(one_query=False),
               dict(options={"freezing": True, "max_autotune": True}), dict(threads=2), dict(dtype=torch.bfloat16)]
    for change in changed:
        assert paged_package_key(PagedSpec(**{**base, **change})) != key, change
    other = seeded_model(tok)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)  # other weights: another package
    assert paged_package_key(PagedSpec(**{**base, "model": other})) != key
    # other source for the step (an older checkout of the course): another package
    import codex_lab.infer.engine.runner.aot_paged as ap

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ap, "code_digest", lambda: "0" * 64)
        assert paged_package_key(PagedSpec(**base)) != key


def test_a_package_that_cannot_be_built_falls_back_to_torch_compile_and_says_why(tok, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("export found an op it cannot capture")

    monkeypatch.setattr(compiled_step, "package_for_step", broken)
    model = seeded_model(tok)
    # the eager backend: the fallback's graphs cost nothing to compile; frozen-weight options make
    # every shape a candidate for a package
    eng = Engine(model, tok, max_batch_size=2, compile=True, compile_backend="eager",
                 step_options={"aot": True, "options": {"freezing": True}})
    step = eng.fast_step
    assert step.aot and step.dynamic_blocks
    step.warmup_background()
    assert step.ready.wait(HANG_S)
    assert "ahead of time" in step.compile_error and "cannot capture" in step.compile_error
    assert not step.aot and not step.packages and step.compiled  # torch.compile's graphs serve instead
    assert _run(eng, PROMPTS, 12) == [generate_ids(model, p, max_new_tokens=12)[0] for p in PROMPTS]
