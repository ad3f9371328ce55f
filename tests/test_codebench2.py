"""codebench 2: the DSL type-checks and renders, splits hold out structure (exactly and after
normalisation), hidden tests kill every wrong answer of the oracle, canonical answers pass on
every split and family (Python in the sandbox, JavaScript under node), scoring and intervals,
training tasks, and the command."""

from __future__ import annotations

import json
import random

import pytest

from codex_lab.data.tokenizer import ANSWER, EOT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, TASK_TAGS
from codex_lab.evals import codebench2 as c2
from codex_lab.evals.codebench2 import splits as sp
from codex_lab.evals.codebench2.dsl import Program, Step
from codex_lab.evals.codebench2.oracle import KINDS, hidden_tests, mutants
from codex_lab.evals.codebench2.problems import python_tests


def _need_node() -> None:
    if c2.node_path() is None:
        pytest.skip("node not found: apt-get install nodejs")


def _all_programs(split: str) -> list[Program]:
    return [p for part in c2.PARTS for p in c2.programs(split, part)]


# ---------------------------------------------------------------------------------------------- DSL


def test_composition_is_type_checked_and_rendered_one_statement_per_step() -> None:
    p = Program("list", (Step("filter_gt", (3,)), Step("sort_desc"), Step("take", (2,))), arg="items", name="top")
    assert p.docstring() == "Keep the items greater than 3, sort them in descending order, then keep the first 2 items."
    assert p.body() == ("    items = [v for v in items if v > 3]\n    items = sorted(items, reverse=True)\n"
                        "    items = items[:2]\n    return items\n")
    assert p.js_source() == ("function top(items) {\n  items = items.filter(v => v > 3);\n"
                             "  items = [...items].sort((a, b) => b - a);\n  items = items.slice(0, 2);\n"
                             "  return items;\n}\n")
    assert p.run([5, 1, 9, 4, 3]) == [9, 5] and p.signature == ("filter_gt", "sort_desc", "take")
    r = Program("str", (Step("split"), Step("long_words", (2,)), Step("word_count"), Step("int_mul", (3,))), arg="s")
    assert r.output_type == "int" and r.run(" a bcd ef ghi ") == 6
    assert "    words = s.split()\n" in r.body() and "  let result = words.length;\n" in r.js_source()
    with pytest.raises(TypeError, match="takes list"):
        Program("list", (Step("sum"), Step("sort_asc")))  # an int cannot be sorted
    with pytest.raises(TypeError, match="constants"):
        Program("list", (Step("take"),))
    with pytest.raises(TypeError, match="unknown primitive"):
        Program("str", (Step("explode"),))


def test_thousands_of_distinct_programs_deterministic_from_the_seed() -> None:
    sources = {p.source() for s in c2.PROGRAM_SPLITS for p in _all_programs(s)}
    assert len(sources) >= 2000, len(sources)
    again = sp.programs.__wrapped__("length", "val")  # the sampler rerun without its cache
    assert [p.uid for p in again] == [p.uid for p in c2.programs("length", "val")]
    assert all(1 <= len(p.steps) <= 4 for s in c2.PROGRAM_SPLITS for p in _all_programs(s))
    # every primitive is used somewhere, and both input types occur
    assert sp.primitives_used(_all_programs("iid")) == set(c2.PRIMS)
    assert {p.input_type for p in _all_programs("iid")} == {"list", "str"}


# ---------------------------------------------------------------------------------------------- splits


@pytest.mark.parametrize("split", c2.PROGRAM_SPLITS)
def test_test_structures_never_reach_training(split: str) -> None:
    train = [p for part in ("train", "val") for p in c2.programs(split, part)]
    test = c2.programs(split, "test")
    train_sigs = {p.signature for p in c2.programs(split, "train")}
    assert not {p.signature for p in test} & {p.signature for p in train}
    assert not {p.signature for p in c2.programs(split, "val")} & train_sigs  # val is held out from train too
    assert not {p.source() for p in test} & {p.source() for p in train}
    if split == "length":
        assert {len(p.steps) for p in c2.programs(split, "train")} == {1, 2}
        assert {len(p.steps) for p in test} == {3, 4}
    if split == "compose":
        train_pairs = {b for p in train for b in sp.bigrams(p.signature)}
        test_pairs = {b for p in test for b in sp.bigrams(p.signature)}
        assert test_pairs and not test_pairs & train_pairs
        assert all(len(p.steps) >= 2 for p in test)
        assert sp.primitives_used(test) <= sp.primitives_used(c2.programs(split, "train"))  # known parts, new pairs


@pytest.mark.parametrize("split", c2.PROGRAM_SPLITS)
def test_no_test_problem_is_a_training_item_even_after_normalising(split: str) -> None:
    """Every family's test problem against the split's whole training set (every family, train
    and val): no exact copy, and no copy once digits, strings and names are masked."""
    test = c2.load_problems(split, c2.FAMILIES)
    ts = c2.training_tasks(split)
    train = [e for d in ts.examples.values() for exs in d.values() for e in exs]
    a = c2.audit(test, train)
    assert a.test_items == 5 * sp.SIZES["test"] and a.train_items == 5 * (sp.SIZES["train"] + sp.SIZES["val"])
    assert (a.exact, a.near) == (0, 0), a.examples


def test_the_audit_finds_renamed_copies_and_legacy_near_duplicates() -> None:
    test = c2.load_problems("iid", ("completion",), n=20)
    prog = next(p for p in c2.programs("iid", "test") if p.uid == test[0].uid)
    # the same structure with other constants, argument and function names: a near-duplicate
    other = [Step(s.key, tuple((a + 1 if isinstance(a, int) else a) for a in s.args)) for s in prog.steps]
    twin = Program(prog.input_type, tuple(other), arg="zz" if prog.input_type == "list" else "q", name="other_fn")
    twin_item = c2.make_problem(twin, "completion", split="iid", part="train")
    a = c2.audit(test, [c2.task_example(twin_item)])
    assert (a.near, a.exact) == (1, 0), a
    assert c2.audit(test, [c2.task_example(test[0])]).exact == 1
    assert c2.normalise('def f(xs):\n    """Add 3."""\n    xs = [v + 3 for v in xs]\n') == \
        c2.normalise('def g(items):\n    """Add 7."""\n    items = [w + 7 for w in items]\n')
    assert c2.normalise("    items = [v + 3 for v in items]\n") != c2.normalise("    items = [v - 3 for v in items]\n")
    # the first codebench holds out constants only: the audit shows it (that is why codebench 2 exists)
    legacy = c2.split_audit("legacy", c2.load_problems("legacy", ("completion",)))
    assert legacy.exact == 0 and legacy.near > legacy.test_items // 2, legacy.line()


# ---------------------------------------------------------------------------------------------- oracle


@pytest.mark.parametrize("split", c2.PROGRAM_SPLITS)
def test_hidden_tests_reject_every_wrong_answer_of_the_oracle(split: str) -> None:
    """500 programs of the split: the rendered hidden tests (the text the sandbox runs) pass on the
    canonical function and raise on every mutant (executed here: all of it is our own text)."""
    sample = random.Random(f"oracle:{split}").sample(_all_programs(split), 500)
    kinds: dict[str, int] = dict.fromkeys(KINDS, 0)
    for prog in sample:
        tests = python_tests(prog)
        assert len(hidden_tests(prog)) >= 4, prog.source()
        exec(prog.source() + tests, {})  # noqa: S102 - raises if the canonical program fails its own tests
        ms = mutants(prog)
        assert ms, prog.source()
        for m in ms:
            kinds[m.kind] += 1
            with pytest.raises((AssertionError, TypeError, NameError, AttributeError, IndexError, ValueError)):
                exec(m.program.source() + tests, {})  # noqa: S102
        if len(prog.steps) >= 2:  # every step matters, so a missing step is a wrong answer wherever types allow it
            assert any(m.kind == "drop" for m in ms) or all(
                not _drop_composes(prog, j) for j in range(len(prog.steps))), prog.source()
    assert all(v > 0 for v in kinds.values()), kinds


def _drop_composes(prog: Program, j: int) -> bool:
    try:
        Program(prog.input_type, prog.steps[:j] + prog.steps[j + 1:])
    except TypeError:
        return False
    return True


def test_edge_cases_cover_every_threshold_boundary() -> None:
    prog = Program("list", (Step("filter_gt", (4,)), Step("sum")))
    xs = [x for x, _ in hidden_tests(prog)]
    assert [] in xs and any(len(x) == 1 for x in xs)
    assert [3, 4, 5] in xs and any(v < 0 for x in xs for v in x) and any(len(set(x)) < len(x) for x in xs)
    # >= instead of > differs only when 4 itself is in the list: the oracle's mutant must be caught
    ge = next(m for m in mutants(prog) if "filter_ge" in m.what)
    assert any(ge.program.run(x) != y for x, y in hidden_tests(prog))


# ---------------------------------------------------------------------------------------------- execution


@pytest.mark.parametrize("split", c2.PROGRAM_SPLITS)
def test_canonical_answers_pass_every_family(split: str) -> None:
    """Every test problem of the split, every family: pass@1 = 1.0 through the scoring path."""
    _need_node()
    problems = c2.load_problems(split, c2.FAMILIES)
    results = c2.execute(problems, c2.canonical_completions(problems))
    failed = [(p.task_id, r[0].detail) for p, r in zip(problems, results) if not r[0].passed]
    assert not failed, failed[:5]
    rows = c2.score_rows(problems, results, split=split, resamples=200)
    assert {r["family"] for r in rows} == {*c2.FAMILIES, "all"} and all(r["pass_at_k"] == 1.0 for r in rows)


def test_wrong_answers_fail_in_the_sandbox_and_under_node() -> None:
    _need_node()
    problems = [p for s in c2.PROGRAM_SPLITS for p in c2.load_problems(s, c2.FAMILIES, n=4, seed=7)]
    comps = [[p.canonical_solution, *c2.wrong_completions(p)] for p in problems]
    results = c2.execute(problems, comps)
    for p, rs in zip(problems, results):
        assert rs[0].passed, (p.task_id, rs[0].detail)
        passed = [(r.completion, r.detail) for r in rs[1:] if r.passed]
        assert not passed, (p.task_id, passed)
    assert {p.family for p in problems} == set(c2.FAMILIES) and sum(len(c) for c in comps) > 300


def test_testgen_needs_an_assertion_that_catches_the_mutant() -> None:
    p = c2.load_problems("compose", ("testgen",), n=1, seed=2)[0]
    name = p.code.split("def ", 1)[1].split("(", 1)[0]
    x_call = p.canonical_solution.split(" == ")[0][len("assert "):]
    both = f"assert {x_call} == {x_call}\n"  # passes on the reference and on the mutant
    res = c2.execute([p], [[p.canonical_solution, both, f"assert {name}(None) == 0\n"]])[0]
    assert [r.passed for r in res] == [True, False, False], [r.detail for r in res]
    assert "detects no bug" in res[1].detail


def test_node_runner_times_out_catches_errors_and_survives_a_dead_batch() -> None:
    _need_node()
    p = c2.load_problems("iid", ("translate",), n=1, seed=1)[0]
    name = p.code.split("def ", 1)[1].split("(", 1)[0]
    comps = [p.canonical_solution, f"function {name}(x) {{ while (true) {{}} }}\n", "function (\n",
             f"function {name}(x) {{ return x; }}\n",
             # leaves the vm context and ends the whole process: the batch is rerun one program per process
             f"this.constructor.constructor('return process')().exit(0);\n{p.canonical_solution}"]
    res = c2.execute([p], [comps], timeout_s=1.0)[0]
    assert [r.passed for r in res] == [True, False, False, False, False], [r.detail for r in res]
    assert res[1].detail == "timed out" and "SyntaxError" in res[2].detail and "expected" in res[3].detail


def test_fim_prompts_use_the_reserved_tokens_and_the_answer_format() -> None:
    for p in c2.load_problems("length", ("fim", "completion", "translate"), n=3):
        if p.family == "fim":
            assert p.prompt.startswith(FIM_PREFIX) and p.prompt.endswith(FIM_MIDDLE)
            assert p.prompt.count(FIM_SUFFIX) == 1 and p.canonical_solution.startswith("    ")
            assert p.program(p.canonical_solution).startswith(p.prefix + p.canonical_solution + p.suffix)
        else:
            assert p.prompt == f"{TASK_TAGS[p.family]}{p.code}{ANSWER}"
    plain = c2.load_problems("length", ("completion",), n=3, examples=False)
    assert all(">>>" not in p.prompt for p in plain) and all(">>>" in p.prompt for p in c2.load_problems(
        "length", ("completion",), n=3))
    ex = c2.task_example(c2.load_problems("iid", ("bugfix",), n=1)[0])
    assert ex.text().startswith(TASK_TAGS["bugfix"]) and ex.text().endswith(EOT)


# ---------------------------------------------------------------------------------------------- scoring


def test_pass_at_k_and_the_intervals() -> None:
    problems = c2.load_problems("iid", ("completion", "fim"), n=4)
    comps = [[p.canonical_solution, "    pass\n"] for p in problems]
    rows = c2.score_rows(problems, c2.execute(problems, comps), split="iid", ks=(1, 2), resamples=200)
    got = {(r["family"], r["k"]): r["pass_at_k"] for r in rows}
    assert got == {(f, k): v for f in ("completion", "fim", "all") for k, v in ((1, 0.5), (2, 1.0))}
    # a fair coin on 400 problems: the bootstrap percentile interval ~ mean +- 1.96 sqrt(p(1-p)/n) = +-0.049;
    # 0.01 of slack covers the Monte Carlo error of 2000 resamples (sd of a 2.5% quantile ~ 0.003)
    vals = [1.0, 0.0] * 200
    lo, hi = c2.bootstrap_interval(vals, seed=0)
    assert abs(lo - (0.5 - 0.049)) < 0.01 and abs(hi - (0.5 + 0.049)) < 0.01
    assert c2.bootstrap_interval(vals, seed=0) == (lo, hi) and c2.bootstrap_interval([1.0] * 9) == (1.0, 1.0)
    # seeds: identical seeds give the problem-level interval; seeds that disagree widen it
    same = c2.seed_problem_interval([vals] * 3, seed=0)
    assert same[0] == 0.5 and same[2] - same[1] < (hi - lo) * 1.1
    apart = c2.seed_problem_interval([[1.0] * 300 + [0.0] * 100, vals, [1.0] * 100 + [0.0] * 300], seed=0)
    assert apart[0] == pytest.approx(0.5) and apart[2] - apart[1] > 2 * (hi - lo)
    with pytest.raises(ValueError):
        c2.bootstrap_interval([])


# ---------------------------------------------------------------------------------------------- training data, API


def test_training_tasks_are_the_train_split_in_lesson_05s_shape() -> None:
    ts = c2.training_tasks("length", ("completion", "translate", "fim"), n_per_family=50, seed=3)
    assert ts.sizes() == {f: {"train": 50, "val": sp.SIZES["val"]} for f in ("completion", "translate", "fim")}
    test_uids = {p.uid for p in c2.programs("length", "test")}
    for fam, d in ts.examples.items():
        assert {e.split for e in d["train"]} == {"train"} and {e.split for e in d["val"]} == {"val"}
        assert not {e.func for exs in d.values() for e in exs} & test_uids
        assert all(e.task == fam and e.text().endswith(e.answer + EOT) for e in d["train"])
    again = c2.training_tasks("length", ("completion",), n_per_family=50, seed=3)
    assert [e.id for e in again.examples["completion"]["train"]] == [e.id for e in ts.examples["completion"]["train"]]
    legacy = c2.training_tasks("legacy", ("completion",))
    assert legacy.sizes()["completion"]["train"] > 0


def test_unknown_split_family_or_part_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown split 'random'.*iid.*length.*compose.*legacy"):
        c2.load_problems("random")
    with pytest.raises(ValueError, match=r"unknown families \['docs'\].*translate"):
        c2.load_problems("iid", ("docs",))
    with pytest.raises(ValueError, match=r"choose from \['completion', 'bugfix', 'testgen', 'fim', 'all'\]"):
        c2.load_problems("legacy", ("translate",))
    with pytest.raises(ValueError, match="unknown part"):
        c2.load_problems("iid", part="dev")
    with pytest.raises(ValueError, match="unknown split"):
        c2.training_tasks("nope")


# ---------------------------------------------------------------------------------------------- command


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """``codex-lab eval codebench ARGS`` in this process (the programs built by the other tests are reused)."""
    from codex_lab.cli import main

    try:
        rc = main(["eval", "codebench", *args, "--no-progress"])
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_command_scores_canonical_answers_one_and_prints_the_audit(capsys) -> None:
    _need_node()
    rc, out, err = _cli(capsys, "--split", "compose", "--family", "all", "--canonical", "--n", "3", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert {r["family"] for r in rows} == {*c2.FAMILIES, "all"} and all(r["split"] == "compose" for r in rows)
    assert all(r["pass_at_k"] == 1.0 and r["near_duplicates"] == 0 for r in rows), rows
    rc, out, err = _cli(capsys, "--split", "length", "--family", "bugfix", "--family", "testgen", "--canonical",
                        "--n", "2")
    assert rc == 0, err
    assert "audit: 0/4 test items" in out and out.count("pass@1 = 1.0000") == 3, out  # bugfix, testgen, all
    rc, _, err = _cli(capsys, "--split", "random")
    assert rc == 2 and "choose from 'iid', 'length', 'compose', 'legacy'" in err
    rc, _, err = _cli(capsys, "--split", "legacy", "--family", "translate", "--canonical")
    assert rc == 2 and "has no family translate" in err and "'completion', 'bugfix', 'testgen', 'fim'" in err


def test_command_legacy_is_the_first_codebench_with_its_audit(capsys) -> None:
    rc, out, err = _cli(capsys, "--split", "legacy", "--family", "completion", "--canonical", "--n", "2",
                        "--workers", "1")
    assert rc == 0, err
    assert "codebench legacy " in out and "pass@1 = 1.0000" in out
    assert "audit: 2/2 test items (100.0%) equal a training item" in out  # held out by constant only
