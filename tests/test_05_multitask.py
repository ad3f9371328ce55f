"""Lesson 05's claim experiment on codebench 2: the arms, the equal compute, seeds that vary
initialisation, data order and evaluation sample, training states from held-out curves, and
verdicts that follow the scores only when every arm has plateaued (a tiny model keeps it to
seconds; the report runs the sizes of ``protocol_setup``)."""

from __future__ import annotations

import math

import pytest
import torch

from codex_lab.lessons.l05_multitask import experiments as ex
from codex_lab.stats import UNDER_TRAINED

FAMS = ("completion", "bugfix")


@pytest.fixture(scope="module")
def tiny_run():
    torch.set_num_threads(1)
    setup = ex.Setup(families=FAMS, steps=12, batch_size=2, d_model=16, n_layer=1, n_head=2, vocab=300, max_len=160,
                     n_per_family=24, evals=4, per_family=2, val_per_task=3, warmup=2, max_new_tokens=24)
    return setup, ex.run_experiment(setup)


def test_arms_equal_compute_and_seeds(tiny_run) -> None:
    setup, res = tiny_run
    assert res.arms == ["single-task", "naive", "coba"] and res.primary == "coba"
    for arm in res.arms:
        assert len(res.scores[arm]) == 3 and len(res.curves[arm]) == 3, arm
        assert all(set(s) == set(FAMS) and all(len(v) == setup.per_family for v in s.values())
                   for s in res.scores[arm]), arm
        assert all(x in (0.0, 1.0) for s in res.scores[arm] for v in s.values() for x in v)
    # equal compute: each multi-task run made `steps` steps; the K specialists share that budget
    assert all(len(r.steps) == setup.steps for rs in res.runs.values() for r in rs)
    assert res.runs["naive"][0].config.mix == "size" and res.runs["coba"][0].config.mix == "balancer"
    spec_steps = res.curves["single-task"][0][-1][0]
    assert spec_steps * len(FAMS) == setup.steps
    # every curve starts at step 0 and has the same evaluation steps across seeds
    assert all(c[0][0] == 0.0 and [s for s, _ in c] == [s for s, _ in cs[0]] for cs in res.curves.values() for c in cs)
    # seeds draw different test problems (the evaluation sample) ...
    uids = [{p.uid for p in ps} for ps in res.problems]
    assert uids[0] != uids[1] and all(p.part == "test" for ps in res.problems for p in ps)
    # ... and different initialisations
    tok, _ = ex.data(setup)
    a, b = ex.new_model(setup, tok.vocab_size, 0), ex.new_model(setup, tok.vocab_size, 1)
    assert not torch.equal(next(a.parameters()), next(b.parameters()))
    assert torch.equal(next(a.parameters()), next(ex.new_model(setup, tok.vocab_size, 0).parameters()))
    # the audit line names every test item scored
    n_items = len({p.task_id for ps in res.problems for p in ps})
    assert f"/{n_items} test items" in res.audit_line()


def test_short_runs_get_no_verdict(tiny_run) -> None:
    """12 steps cannot plateau: the training-state rule fires and every verdict is withheld."""
    _, res = tiny_run
    states = res.states()
    assert {s.state for s in states.values()} == {"under-trained"}
    assert res.primary_comparison().verdict == UNDER_TRAINED
    sec = res.secondary()
    assert len(sec) == 2 * len(FAMS) and all(c.verdict == UNDER_TRAINED for c in sec)
    assert all(c.role.startswith("secondary") for c in sec)


def _made(scores: dict[str, list[list[float]]], curve: dict[str, list[float]]) -> ex.Results:
    """Hand-made results: per arm, per seed the pass of 4 problems of one family; held-out curves per arm."""
    res = ex.Results(ex.Setup(families=("completion",), seeds=(0, 1, 2), per_family=4))
    res.scores = {a: [{"completion": s} for s in per_seed] for a, per_seed in scores.items()}
    # seeds' curves differ by a little noise; the values are the arm's curve
    res.curves = {a: [[(float(10 * i), v + 0.001 * k) for i, v in enumerate(c)] for k in range(3)]
                  for a, c in curve.items()}
    return res


FLAT = [3.0, 1.0, 0.5, 0.42, 0.41, 0.41, 0.41, 0.41]
FALLING = [3.0, 2.5, 2.0, 1.6, 1.3, 1.0, 0.8, 0.6]


def test_verdicts_follow_scores_and_states() -> None:
    low = [[0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]]
    high = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1]]
    res = _made({"single-task": low, "naive": low, "coba": high}, {"single-task": FLAT, "naive": FLAT, "coba": FLAT})
    assert all(s.trained for s in res.states().values())
    c = res.primary_comparison()
    assert c.verdict == "holds" and c.lo > 0 and math.isclose(c.diff, 10 / 12 - 2 / 12)
    # the reverse claim fails
    rev = _made({"single-task": high, "naive": high, "coba": low}, {"single-task": FLAT, "naive": FLAT, "coba": FLAT})
    assert rev.primary_comparison().verdict == "fails"
    # same scores, one arm still learning: no verdict
    und = _made({"single-task": low, "naive": low, "coba": high}, {"single-task": FALLING, "naive": FLAT, "coba": FLAT})
    assert und.states()["single-task"].state == "under-trained"
    assert und.primary_comparison().verdict == UNDER_TRAINED
    # the two-level bootstrap interval brackets the mean and is wider than zero when seeds or problems vary
    m, lo, hi = res.interval("coba", "all")
    assert lo < m < hi and math.isclose(m, 10 / 12)


def test_protocol_sizes() -> None:
    fast, std, full = (ex.protocol_setup(m) for m in ("fast", "standard", "full"))
    assert fast.steps < std.steps <= full.steps and fast.d_model <= std.d_model <= full.d_model
    assert all(len(s.seeds) >= 3 for s in (fast, std, full)) and len(full.seeds) >= 5
    assert ex.protocol_splits("standard") == ("iid",) and ex.protocol_splits("full") == ("iid", "length", "compose")
    assert std.steps % len(std.families) == 0  # the specialists split the budget exactly
