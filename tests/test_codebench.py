"""codebench: problems are deterministic and held out from every training set, the canonical
answers pass and wrong answers fail (per family, through both execution paths), the batched
path equals one process per program, pass@k is HumanEval's estimator, and the command runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from codex_lab.evals import codebench as cb
from codex_lab.evals import codebench_run as cr


def test_problem_counts_and_determinism() -> None:
    sizes = cb.sizes()
    held_out = sum(s["test"] for s in sizes.values())
    assert held_out >= 400, sizes  # "hundreds": 4 families x 128 held-out problems
    assert all(s["test"] >= 100 and s["train"] > s["test"] for s in sizes.values()), sizes
    a, b = cb.load_problems(8, seed=3), cb.load_problems(8, seed=3)
    assert a == b and len(a) == 8 * len(cb.FAMILIES)
    assert [p.task_id for p in cb.load_problems(8, seed=4)] != [p.task_id for p in a]
    assert all(p.split == "test" for p in cb.load_problems())
    with pytest.raises(ValueError, match="families"):
        cb.load_problems(families=("translate",))
    with pytest.raises(ValueError, match="per_family"):
        cb.load_problems(0)


def test_fim_prompts_use_the_reserved_tokens(small_tokenizer) -> None:
    p = cb.load_problems(1, families=("fim",))[0]
    ids = small_tokenizer.encode(p.prompt)
    for special in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"):
        assert ids.count(small_tokenizer.token_id(special)) == 1
    assert ids[-1] == small_tokenizer.token_id("<|fim_middle|>")
    assert p.program(p.canonical_solution).startswith(p.prefix + p.canonical_solution + p.suffix)


def test_held_out_problems_are_in_no_training_data() -> None:
    """The test split's (operation, constant) groups never reach fine-tuning, and none of their
    functions occurs in the pre-training split of the corpus (the shipped model's data)."""
    from codex_lab.data.corpus import load_corpus

    test = cb.all_problems("test")
    test_groups = {p.group for p in test}
    ts = cb.training_tasks()
    for fam, splits in ts.examples.items():
        for split, exs in splits.items():
            assert exs, (fam, split)
            seen = {cb.split_of(next(f.group for f in cb.functions() if f.uid == e.func)) for e in exs}
            assert seen == {split}, (fam, split, seen)
            assert not {e.func for e in exs} & {p.func for p in test}
            texts = {e.input_text() + e.answer for e in exs}
            assert not any(p.canonical_solution in t and p.code in t for p in test if p.family == fam for t in texts)
    assert not {p.group for p in cb.all_problems("train")} & test_groups
    train_text = "\n".join(load_corpus().texts("train"))
    leaked = [p.func for p in test if p.family == "completion" and f"def {p.func}:" in train_text]
    assert not leaked, leaked


def test_canonical_answers_pass_every_problem() -> None:
    problems = cb.all_problems()  # every split: 1,728 programs in a few sandboxed processes
    results = cr.execute_batched(problems, cb.canonical_completions(problems))
    failed = [(p.task_id, r[0].detail) for p, r in zip(problems, results) if not r[0].passed]
    assert not failed, failed[:5]


def test_wrong_answers_fail_and_both_paths_agree() -> None:
    problems = cb.load_problems(3, seed=1)
    comps = [[p.canonical_solution, *cb.wrong_completions(p)] for p in problems]
    # the infinite loop of the completion family's wrong answers is cut by each path's timer
    fast = cr.execute_batched(problems, comps, timeout_s=1.0)
    ref = cr.execute(problems, comps, workers=2, timeout_s=1.0)
    for p, f, r in zip(problems, fast, ref):
        assert [x.passed for x in f] == [x.passed for x in r], (p.task_id, [x.detail for x in f], [x.detail for x in r])
        assert f[0].passed and not any(x.passed for x in f[1:]), (p.task_id, [(x.completion, x.detail) for x in f])
    loops = [x for f in fast for x in f if "while True" in x.completion]
    assert loops and all(x.detail == "timed out" for x in loops)


def test_testgen_needs_an_assertion_that_catches_the_mutant() -> None:
    p = cb.load_problems(1, families=("testgen",), seed=2)[0]
    fn = next(f for f in cb.functions() if f.uid == p.func)
    x = fn.probe()
    right = f"assert {fn.name}({x!r}) == {fn.value(x)!r}\n"
    both = f"assert {fn.name}({x!r}) == {fn.name}({x!r})\n"  # passes on the reference and the mutant
    wrong = f"assert {fn.name}({x!r}) == {fn.value(x, mutant=True)!r}\n"  # holds only for the mutant
    res = cr.execute_batched([p], [[right, both, wrong]])[0]
    assert [r.passed for r in res] == [True, False, False], [r.detail for r in res]
    assert "detects no bug" in res[1].detail


def test_a_batch_that_dies_is_rerun_one_program_at_a_time() -> None:
    problems = cb.load_problems(2, families=("completion",))
    comps = [[p.canonical_solution] for p in problems]
    comps[0].append("    import os\n    os._exit(3)\n")  # ends the batch's process without a result line
    res = cr.execute_batched(problems, comps)
    assert [r.passed for r in res[0]] == [True, False] and res[1][0].passed  # exit code 3: a failure on its own
    ref = cr.execute(problems, comps, workers=1)
    assert [[r.passed for r in rs] for rs in res] == [[r.passed for r in rs] for rs in ref]


def test_pass_at_k_per_family_and_records() -> None:
    problems = cb.load_problems(2)
    comps = [[p.canonical_solution, "    pass\n"] for p in problems]
    results = cr.execute_batched(problems, comps)
    fams = cr.family_scores(problems, results, ks=(1, 2))
    assert fams == {f: {1: 0.5, 2: 1.0} for f in cb.FAMILIES}
    rows = cr.records(problems, results, seconds=1.0, source="t", temperature=None, ks=(1, 2))
    assert {(r["family"], r["k"]): r["pass_at_k"] for r in rows}[("all", 1)] == 0.5
    assert cr.half_width(0.5, 128) == pytest.approx(1.96 * (0.25 / 128) ** 0.5)


def test_command_canonical_scores_one() -> None:
    out = subprocess.run([sys.executable, "-m", "codex_lab.cli", "eval", "codebench", "--canonical", "--per-family", "2",
                          "--json", "--no-progress", "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {r["family"] for r in rows} == {*cb.FAMILIES, "all"}
    assert all(r["pass_at_k"] == 1.0 for r in rows), rows


@pytest.mark.parametrize("leave", ["    import sys\n    sys.exit(0)\n", "    raise SystemExit\n",
                                   "    import os\n    os._exit(0)\n"])
def test_leaving_early_with_exit_code_zero_is_not_a_pass(leave: str) -> None:
    """A completion that exits 0 before the tests run has not passed, on both paths (as in the
    official HumanEval harness, which counts only programs whose tests ran to the end)."""
    p = cb.load_problems(1, families=("completion",), seed=3)[0]
    for res in (cr.execute_batched([p], [[p.canonical_solution, leave]])[0],
                cr.execute([p], [[p.canonical_solution, leave]], workers=1)[0]):
        assert [r.passed for r in res] == [True, False], [r.detail for r in res]
        assert "exited before its tests finished" in res[1].detail, res[1].detail
