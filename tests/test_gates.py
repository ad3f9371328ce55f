"""Release gates: syntax, functional (sandboxed), style consistency, latency, decision rule."""

from __future__ import annotations

import math

import pytest
import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.serve.gates import (
    SUITE, Sample, engine_completer, functional_pass, gate_decision, percentile, run_gates, score, style_consistency,
)
from codex_lab.nn.model import CodexModel

GOOD = {  # correct bodies for the suite (an "oracle model"); prompts end at the docstring's quotes
    "add": "\n    return a + b\n", "is_even": "\n    return n % 2 == 0\n", "maximum": "\n    return max(items)\n",
    "reverse": "\n    return text[::-1]\n",
    "factorial": "\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
    "count_vowels": "\n    return sum(ch in 'aeiou' for ch in text)\n", "square_all": "\n    return [x * x for x in numbers]\n",
    "first_word": "\n    return line.split()[0]\n",
}



def test_suite_answers_pass_and_wrong_answers_fail():
    for p in SUITE:
        assert functional_pass(p, GOOD[p.name]), p.name
    assert not functional_pass(SUITE[0], "\n    return a - b\n")  # wrong
    assert not functional_pass(SUITE[0], "\n    return (\n")  # does not parse
    assert not functional_pass(SUITE[4], "\n    while True:\n        pass\n", timeout_s=1.0)  # killed at the limit
    assert not functional_pass(SUITE[0], "\n    import socket\n    socket.create_connection(('127.0.0.1', 1))\n")


def test_style_consistency_measure():
    p = SUITE[0].prompt
    assert style_consistency(p, "    total = a + b\n    return total\n") == 1.0
    assert style_consistency(p, "") == 0.0
    # 2 lines x 2 checks + 1 name: the camelCase name fails -> 4/5
    assert math.isclose(style_consistency(p, "    myTotal = a + b\n    return myTotal\n"), 4 / 5)
    assert math.isclose(style_consistency(p, "\treturn a + b\n"), 1 / 2)  # tab indent: 1 of 2 line checks fails
    long = "    return " + "a + " * 30 + "b\n"  # > 79 characters: one of two line checks fails
    assert math.isclose(style_consistency(p, long), 1 / 2)


def test_score_and_percentile():
    good = [Sample(GOOD[p.name], arrival=0.0, token_times=[0.05, 0.06, 0.07]) for p in SUITE]
    rep = score(good)
    assert (rep.syntax, rep.functional, rep.style) == (1.0, 1.0, 1.0)
    assert rep.ttft_attainment == 1.0 and rep.tbt_attainment == 1.0
    assert math.isclose(rep.ttft_p95_s, 0.05)
    bad = [Sample("\n    return (\n", arrival=0.0, token_times=[0.2, 0.3]) for _ in SUITE]
    rep2 = score(bad)
    assert rep2.syntax == 0.0 and rep2.functional == 0.0 and rep2.ttft_attainment == 0.0
    empty = score([Sample("\n\n") for _ in SUITE])  # a docstring-only function parses but is no answer
    assert empty.syntax == 0.0 and empty.style == 0.0 and math.isnan(empty.ttft_attainment)
    assert percentile([1, 2, 3, 4], 50) == 2.5 and math.isnan(percentile([], 95))


def test_gate_decision_rule():
    base = {"syntax": 0.5, "functional": 0.25, "style": 0.9, "ttft_attainment": 0.9, "tbt_attainment": 0.8}
    assert gate_decision(dict(base), base) == (True, [])
    ok, why = gate_decision({**base, "functional": 0.125}, base)
    assert not ok and why[0].startswith("functional")
    assert gate_decision({**base, "ttft_attainment": 0.85}, base)[0]  # within the latency tolerance
    assert not gate_decision({**base, "ttft_attainment": 0.7}, base)[0]
    assert not gate_decision({k: v for k, v in base.items() if k != "style"}, base)[0]  # missing = fail
    assert gate_decision({**base, "syntax": 1.0}, base)[0]  # better is fine


def test_gates_through_the_engine_catch_a_perturbed_candidate(small_tokenizer):
    torch.manual_seed(0)
    m = CodexModel(ModelConfig(vocab_size=small_tokenizer.vocab_size, d_model=64, n_layer=2, n_head=4,
                               max_seq_len=128)).eval()
    suite = SUITE[:3]
    base = run_gates(engine_completer(m, small_tokenizer), suite=suite, max_tokens=4)
    assert len(base.samples) == len(suite) and base.tbt_p95_s > 0
    assert gate_decision(base.scores(), {**base.scores(), "ttft_attainment": math.nan, "tbt_attainment": math.nan})[0]
    # the same weights with an injected 30 ms per engine step fail the latency gate
    slow = run_gates(engine_completer(m, small_tokenizer, step_delay_s=0.03), suite=suite, max_tokens=4)
    assert (slow.syntax, slow.functional) == (base.syntax, base.functional)  # same greedy text
    assert slow.tbt_attainment == 0.0  # every gap >= 30 ms > 20 ms
    ok, why = gate_decision(slow.scores(), {**base.scores(), "tbt_attainment": 1.0})
    assert not ok and any("tbt" in w for w in why)


@pytest.mark.parametrize("split", ["iid", "legacy"])
def test_functional_gate_scores_codebench_answers(split: str) -> None:
    """Canonical answers pass, the benchmark's own wrong answers (off-by-one constants, wrong
    operators, wrong order, partial programs) fail, half and half scores 0.5; on codebench 2
    iid (the default) and on the first codebench."""
    from codex_lab.evals import codebench as cb
    from codex_lab.evals import codebench2 as cb2
    from codex_lab.serve.gates import bench_problems

    probs = bench_problems(2, split=split)
    assert len({p.family for p in probs}) >= 4
    wrong_of = cb.wrong_completions if split == "legacy" else cb2.wrong_completions
    good = [Sample(GOOD[p.name]) for p in SUITE]
    right = score(good, bench=probs, bench_answers=[p.canonical_solution for p in probs])
    assert right.functional == 1.0 and right.syntax == 1.0
    wrong = score(good, bench=probs, bench_answers=[wrong_of(p)[-1] for p in probs])
    assert wrong.functional == 0.0 and wrong.syntax == 1.0  # the suite's answers do not count any more
    half = [p.canonical_solution if i % 2 else "    pass\n" for i, p in enumerate(probs)]
    assert score(good, bench=probs, bench_answers=half).functional == 0.5
    with pytest.raises(ValueError, match="both"):
        score(good, bench=probs)


def test_the_default_functional_gate_is_codebench2_iid() -> None:
    from codex_lab.evals import codebench2 as cb2
    from codex_lab.evals.codebench2.js import node_path
    from codex_lab.serve.gates import BENCH_PER_FAMILY, bench_problems

    probs = bench_problems()
    assert {p.split for p in probs} == {"iid"} and {p.part for p in probs} == {"test"}
    fams = {p.family for p in probs}
    assert fams == set(cb2.FAMILIES) - ({"translate"} if node_path() is None else set())
    assert len(probs) == BENCH_PER_FAMILY * len(fams)
    with pytest.raises(ValueError, match="'default'"):
        run_gates(lambda prompts, n: [], bench="iid")


def test_functional_gate_tells_the_tuned_baseline_from_a_damaged_copy() -> None:
    """The release baseline (the shipped model fine-tuned on codebench 2 iid, shipped as
    float16 weights) against the same weights with noise added, on the default gate.

    No score of a particular checkpoint is assumed: only that the baseline scores above zero
    and that noise of the weights' own size destroys it."""
    import copy

    from codex_lab.training.checkpoint import load_codebench2_tuned

    ck = load_codebench2_tuned()
    assert ck.meta["split"] == "iid" and "provenance" in ck.meta
    damaged = copy.deepcopy(ck.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in damaged.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.float().std().clamp(min=1e-3))  # noise as large as the weights
    good = run_gates(engine_completer(ck.model, ck.tokenizer), max_tokens=24)
    bad = run_gates(engine_completer(damaged, ck.tokenizer), max_tokens=24)
    assert good.functional > 0.0, good.functional
    assert bad.functional < good.functional, (bad.functional, good.functional)
    ok, why = gate_decision(bad.scores(), good.scores())
    assert not ok and any(w.startswith("functional") for w in why), why


def test_legacy_functional_gate_tells_a_tuned_model_from_a_damaged_copy() -> None:
    """The first codebench (``bench="legacy"``): the shipped model, fine-tuned as in lesson 05,
    against the same weights with noise added.

    No score of a particular checkpoint is assumed: only that fine-tuning lifts codebench
    pass@1 above zero and that noise of the weights' own size destroys it."""
    import copy

    from codex_lab.lessons.l05_multitask.experiments import tune_for_codebench
    from codex_lab.training.checkpoint import load_pretrained

    ck = load_pretrained()
    tuned = tune_for_codebench(ck.model, ck.tokenizer, steps=40, seed=0)
    damaged = copy.deepcopy(tuned)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in damaged.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.float().std().clamp(min=1e-3))  # noise as large as the weights
    good = run_gates(engine_completer(tuned, ck.tokenizer), max_tokens=24, bench="legacy")
    bad = run_gates(engine_completer(damaged, ck.tokenizer), max_tokens=24, bench="legacy")
    assert good.functional > 0.0, good.functional
    assert bad.functional < good.functional, (bad.functional, good.functional)
    ok, why = gate_decision(bad.scores(), good.scores())
    assert not ok and any(w.startswith("functional") for w in why), why


def _report(syntax: list[bool], style: list[float], bench: list[bool], ttft: float = 1.0):
    from codex_lab.serve.gates import GateReport

    rows = [(f"p{i}", "body", ok, False, st) for i, (ok, st) in enumerate(zip(syntax, style))]
    return GateReport(syntax=sum(syntax) / len(syntax), functional=sum(bench) / len(bench), style=sum(style) / len(style),
                      ttft_attainment=ttft, tbt_attainment=1.0, ttft_p95_s=0.05, tbt_p95_s=0.01, samples=rows,
                      bench_passed=list(bench))


def test_release_gates_with_intervals_pass_shown_no_worse_and_refuse_worse_or_unshown():
    from codex_lab.serve.gates import paired_noninferiority, release_decision

    n = 60
    base = _report([True] * n, [0.9] * n, [i % 2 == 0 for i in range(n)])
    # the same answers on 60 problems: the loss's bound (~0.05) is inside the 0.10 margin -> passes
    same = _report([True] * n, [0.9] * n, [i % 2 == 0 for i in range(n)])
    ok, why, comps = release_decision(same, base)
    assert ok and why == [] and all(c.verdict == "holds" for c in comps.values())
    assert 0.0 < -comps["functional"].lo < 0.10  # the pseudo-problems give identical models a non-zero interval
    assert "problems 60 vs 60" in comps["functional"].describe()  # counts problems, not seeds
    # worse by 20 of 60 functional problems: shown worse than the margin -> fails, named
    worse = _report([True] * n, [0.9] * n, [i % 2 == 0 and i >= 40 for i in range(n)])
    ok, why, comps = release_decision(worse, base)
    assert not ok and comps["functional"].verdict == "fails" and why[0].startswith("functional")
    # the same answers on 8 problems cannot show "no worse" within 0.10: refused as not resolved, not passed
    small = _report([True] * 8, [0.9] * 8, [True] * 8)
    ok, why, comps = release_decision(small, small)
    assert not ok and {c.verdict for c in comps.values()} == {"not resolved"}
    # latency keeps the tolerance rule: attainment 0.7 against 1.0 refuses, 0.95 passes
    assert not release_decision(_report([True] * n, [0.9] * n, [True] * n, ttft=0.7),
                                _report([True] * n, [0.9] * n, [True] * n))[0]
    assert release_decision(_report([True] * n, [0.9] * n, [True] * n, ttft=0.95),
                            _report([True] * n, [0.9] * n, [True] * n))[0]
    with pytest.raises(ValueError, match="same problems"):
        paired_noninferiority([1.0, 0.0], [1.0], margin=0.1, metric="m")
