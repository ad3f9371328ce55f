"""HumanEval: problems load from the installed wheel, the canonical solutions pass and wrong
completions fail through the sandbox, pass@k matches its definition, and the command runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from codex_lab.evals import humaneval as he


def test_problems_load_from_the_wheel() -> None:
    ps = he.load_problems()
    assert len(ps) == he.N_PROBLEMS
    assert ps[0].task_id == "HumanEval/0" and ps[-1].task_id == "HumanEval/163"
    assert all(p.entry_point in p.prompt for p in ps)
    assert len(he.load_problems(3)) == 3
    with pytest.raises(ValueError, match="limit"):
        he.load_problems(0)


def test_canonical_passes_and_wrong_completions_fail() -> None:
    ps = he.load_problems(4)
    wrong = ["    return None\n", "    pass\n", "    raise RuntimeError('no')\n", "    while True:\n        pass\n"]
    comps = [[p.canonical_solution, w] for p, w in zip(ps, wrong)]
    rows, results = he.evaluate(ps, comps, source="test", workers=2, timeout_s=3.0, ks=(1, 2))
    assert [rs[0].passed for rs in results] == [True] * 4, [rs[0].detail for rs in results]
    assert [rs[1].passed for rs in results] == [False] * 4
    assert results[2][1].detail.startswith("RuntimeError")
    assert results[3][1].detail == "timed out"
    # one of two samples passes on every problem: pass@1 = 1/2 and pass@2 = 1 exactly
    assert {r["k"]: r["pass_at_k"] for r in rows} == {1: 0.5, 2: 1.0}


def test_pass_at_k_equals_its_definition() -> None:
    for n, c, k in [(10, 0, 1), (10, 3, 1), (10, 3, 5), (20, 7, 10), (5, 5, 2), (200, 13, 100)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        # the product form reorders float operations: 1e-12 relative is far above rounding
        # (a few ulps per factor, <= 200 factors) and far below any real difference
        assert he.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-12)
    assert he.pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-12)  # pass@1 = c/n
    with pytest.raises(ValueError):
        he.pass_at_k(3, 4, 1)


def test_stop_sequences_cut_a_function_body() -> None:
    body = "    return x + 1\n\n\ndef other():\n    pass"
    assert he.cut_at_stop(body) == "    return x + 1\n\n"
    assert he.cut_at_stop("    y = 1\n# comment\n") == "    y = 1"
    assert he.cut_at_stop("    return 1\n") == "    return 1\n"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codex_lab.cli", "eval", "humaneval", *args, "--no-progress"],
                          capture_output=True, text=True, timeout=600)


def test_cli_canonical_json() -> None:
    r = _cli("--canonical", "--limit", "3", "--json", "--workers", "2")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows[0]["problems"] == 3 and rows[0]["k"] == 1 and rows[0]["pass_at_k"] == 1.0
    assert {"samples", "time_s"} <= rows[0].keys()


def test_engine_completions_of_the_shipped_model_are_cut_and_scored() -> None:
    from codex_lab import load_pretrained

    ck = load_pretrained("cpu")
    ps = he.load_problems(2)
    comps, cut = he.complete(ck.model, ck.tokenizer, ps, max_new_tokens=24, batch_size=2)
    assert cut == 0 and len(comps) == 2 and all(len(c) == 1 for c in comps)
    assert all(not any(s in c[0] for s in he.STOP) for c in comps)
    rows, _ = he.evaluate(ps, comps, source="shipped", temperature=0.0, workers=2)
    assert rows[0]["problems"] == 2 and 0.0 <= rows[0]["pass_at_k"] <= 1.0


def test_cli_rejects_bad_limit() -> None:
    r = _cli("--limit", "0")
    assert r.returncode == 2 and "--limit" in r.stderr
