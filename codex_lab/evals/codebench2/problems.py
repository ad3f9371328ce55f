"""Problems of codebench 2: five families of tasks on the same programs, in the model-facing format.

Every program of a split (:mod:`.splits`) gives one problem per family:

- ``completion``: signature + docstring (with two ``>>>`` examples) -> the body;
- ``bugfix``: the function with one seeded bug (a mutant of :mod:`.oracle`: an off-by-one
  constant, a wrong operator, two steps in the wrong order or a missing step; the
  docstring still says what the function must do) -> the fixed body (the program is the
  header + the answer);
- ``testgen``: the function -> one assertion that passes on it and fails on a hidden mutant
  (the bugfix mutant): a generated test must *detect* a bug, not only run;
- ``translate``: the Python function -> the same function in JavaScript, scored by running
  it under Node on the same hidden tests (:mod:`.js`);
- ``fim``: fill in the middle (Bavarian et al. 2022) in the tokenizer's reserved format
  ``<|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>`` -> the removed body line.

Prompts use lesson 05's fine-tuning format, ``<|task|> code <|answer|>`` (the answer ends at
``<|endoftext|>``), except ``fim`` (its own tokens), as in :mod:`codex_lab.evals.codebench`.
Which line FIM removes and which mutant bugfix shows are stable hashes of the program.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Sequence

from codex_lab.data.functions import TaskExample
from codex_lab.data.tasks import TaskSet
from codex_lab.data.tokenizer import ANSWER, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, TASK_TAGS
from codex_lab.evals.codebench2.dsl import Program
from codex_lab.evals.codebench2.inputs import example_inputs
from codex_lab.evals.codebench2.oracle import hidden_tests, killing_input, mutants
from codex_lab.evals.codebench2.splits import PARTS, PROGRAM_SPLITS, bucket, check_split, programs

FAMILIES: tuple[str, ...] = ("completion", "bugfix", "testgen", "translate", "fim")
LEGACY_FAMILIES: tuple[str, ...] = ("completion", "bugfix", "testgen", "fim")


@dataclass(frozen=True)
class Problem:
    """One codebench 2 problem (compatible in spirit with :class:`codex_lab.evals.codebench.Problem`).

    Attributes:
        uid: the program's id (``p`` + 10 hex digits of its canonical source).
        family, split, part: family (:data:`FAMILIES`), benchmark split (``iid``,
            ``length``, ``compose``) and part (``train`` / ``val`` / ``test``).
        prompt: the text the model reads (special tokens included).
        code: the same input as plain code (what :class:`TaskExample` takes as its prompt).
        canonical_solution: the reference answer.
        test: the hidden tests: Python ``assert`` lines, or (``translate``) the JavaScript
            harness appended after the answer.
        structure: the structure signature (``"filter_gt>sort_desc>take"``).
        language: ``"python"`` or ``"javascript"`` (what runs :meth:`program`).
        prefix, suffix: ``fim``: the text around the hole; ``bugfix``: prefix = the header.
        mutant: ``testgen``: the buggy function the answer must catch.
    """

    uid: str
    family: str
    split: str
    part: str
    prompt: str
    code: str
    canonical_solution: str
    test: str
    structure: str
    language: str = "python"
    prefix: str = ""
    suffix: str = ""
    mutant: str = ""

    @property
    def task_id(self) -> str:
        return f"codebench2/{self.split}/{self.family}/{self.uid}"

    @property
    def func(self) -> str:
        """The source program's id (the old module's name for it)."""
        return self.uid

    @property
    def group(self) -> str:
        """The split unit: the structure signature."""
        return self.structure

    def program(self, completion: str) -> str:
        """The file that runs ``completion``: it ends normally exactly when the answer is right."""
        body = completion if completion.endswith("\n") else completion + "\n"
        if self.family == "translate":
            return f"{body}\n{self.test}"
        if self.family == "completion":
            return f"{self.code}{body}\n\n{self.test}"
        if self.family == "fim":
            return f"{self.prefix}{body}{self.suffix}\n\n{self.test}"
        if self.family == "bugfix":
            return f"{self.prefix}{body}\n\n{self.test}"
        # testgen: the answer must pass on the reference, then fail (raise) on the mutant
        indented = "".join("    " + ln + "\n" for ln in body.splitlines())
        return (f"{self.code}\n{body}\n\n{self.mutant}\n"
                f"try:\n{indented}except Exception:\n    pass\nelse:\n"
                f"    raise SystemExit('the test passes on the mutant too: it detects no bug')\n")


def check_families(families: Sequence[str] | str, choices: Sequence[str] = FAMILIES) -> tuple[str, ...]:
    """``families`` as a tuple, or a ``ValueError`` naming the choices (``"all"`` means every one)."""
    families = (families,) if isinstance(families, str) else tuple(families)
    fams = tuple(choices) if families == ("all",) else families
    bad = [f for f in fams if f not in choices]
    if bad or not fams:
        raise ValueError(f"unknown families {bad or list(families)}; choose from {[*choices, 'all']}")
    return fams


def python_tests(program: Program) -> str:
    """The hidden tests as Python: one ``assert name(x) == y`` per (input, expected) pair."""
    return "".join(f"assert {program.name}({x!r}) == {y!r}\n" for x, y in hidden_tests(program))


def js_harness(program: Program) -> str:
    """The JavaScript harness after a translation: call the function on every JSON input, compare JSON outputs."""
    cases = json.dumps([[x, y] for x, y in hidden_tests(program)])
    n = program.name
    return (f"for (const [x, want] of {cases}) {{\n"
            f"  const got = {n}(x);\n"
            f"  if (JSON.stringify(got) !== JSON.stringify(want)) {{\n"
            f"    throw new Error(\"{n}(\" + JSON.stringify(x) + \") returned \" + JSON.stringify(got) + \", "
            f"expected \" + JSON.stringify(want));\n"
            f"  }}\n}}\n")


def shown_mutant(program: Program) -> Program:
    """The bug of ``bugfix`` (and the hidden mutant of ``testgen``): a stable-hash choice among the mutants."""
    ms = mutants(program)
    if not ms:
        raise ValueError(f"program {program.uid} has no mutant")
    return ms[bucket("bug:" + program.uid) % len(ms)].program


def _examples(program: Program) -> list[tuple[Any, Any]]:
    return [(x, program.run(x)) for x in example_inputs(program)]


def make_problem(program: Program, family: str, *, split: str, part: str, examples: bool = True) -> Problem:
    """The ``family`` problem built from ``program`` (see the module docstring).

    ``examples``: put two ``>>>`` input/output examples in the docstring (default) or none.
    """
    check_families([family])
    header = program.header(_examples(program) if examples else ())
    body = program.body()
    full = header + body
    common = dict(uid=program.uid, family=family, split=split, part=part, structure=">".join(program.signature))
    tests = python_tests(program)
    if family == "completion":
        return Problem(prompt=f"{TASK_TAGS['completion']}{header}{ANSWER}", code=header, canonical_solution=body,
                       test=tests, **common)
    if family == "bugfix":
        code = header + shown_mutant(program).body()
        return Problem(prompt=f"{TASK_TAGS['bugfix']}{code}{ANSWER}", code=code, canonical_solution=body,
                       test=tests, prefix=header, **common)
    if family == "testgen":
        bad = shown_mutant(program)
        x = killing_input(program, bad)
        answer = f"assert {program.name}({x!r}) == {program.run(x)!r}\n"
        return Problem(prompt=f"{TASK_TAGS['testgen']}{full}{ANSWER}", code=full, canonical_solution=answer,
                       test=tests, mutant=bad.source(), **common)
    if family == "translate":
        return Problem(prompt=f"{TASK_TAGS['translate']}{full}{ANSWER}", code=full,
                       canonical_solution=program.js_source(), test=js_harness(program), language="javascript",
                       **common)
    # fim: one step line of the body is removed (a stable hash chooses which); the return stays
    lines = [header, *program.lines()]
    k = 1 + bucket("fim:" + program.uid) % len(program.steps)
    prefix, middle, suffix = "".join(lines[:k]), lines[k], "".join(lines[k + 1:])
    return Problem(prompt=f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}", code=f"{prefix}<FILL>\n{suffix}",
                   canonical_solution=middle, test=tests, prefix=prefix, suffix=suffix, **common)


def load_problems(split: str = "iid", families: Sequence[str] | str = ("all",), *, part: str = "test",
                  n: int | None = None, seed: int = 0, examples: bool = True) -> list[Any]:
    """The problems of ``split``'s ``part`` for ``families`` (``"all"``: every family of the split), by family.

    ``n`` keeps that many problems (programs) per family, drawn with
    ``random.Random(f"{seed}:{family}")``; None keeps them all. ``examples``: docstrings
    with two ``>>>`` examples (default) or without. ``split="legacy"`` returns
    the first codebench's problems (:class:`codex_lab.evals.codebench.Problem`; its parts
    are its own ``train`` / ``val`` / ``test``; it has no ``translate`` family).

    Raises:
        ValueError: an unknown split, part or family, or ``n`` < 1.
    """
    check_split(split)
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; choose from {list(PARTS)}")
    if n is not None and n < 1:
        raise ValueError(f"n (problems per family) must be >= 1, got {n}")
    if split == "legacy":
        from codex_lab.evals import codebench as cb

        fams = check_families(families, LEGACY_FAMILIES)
        return cb.load_problems(n, seed=seed, split=part, families=fams)
    fams = check_families(families)
    progs = list(programs(split, part))
    out: list[Problem] = []
    for fam in fams:
        chosen = progs if n is None or n >= len(progs) else random.Random(f"{seed}:{fam}").sample(progs, n)
        out += sorted((make_problem(p, fam, split=split, part=part, examples=examples) for p in chosen),
                      key=lambda q: q.uid)
    return out


def canonical_completions(problems: Sequence[Any]) -> list[list[str]]:
    """One completion per problem: its reference answer (the oracle: must pass every test)."""
    return [[p.canonical_solution] for p in problems]


def _program_of(problem: Problem) -> Program:
    for p in programs(problem.split, problem.part):
        if p.uid == problem.uid:
            return p
    raise KeyError(f"no program {problem.uid} in {problem.split}/{problem.part}")


def wrong_completions(problem: Any) -> list[str]:
    """Wrong answers that ``problem``'s check must reject: every mutant of the oracle, in the family's form.

    completion / bugfix: each mutant's body (bugfix: including the unchanged buggy body);
    translate: each mutant's JavaScript; fim: each mutant's version of the removed line
    (where it differs) and the empty line (the step missing); testgen: assertions that hold
    on both versions, or only on the mutant. Plus empty and trivial answers. Legacy
    problems get the first codebench's wrong answers.
    """
    if not isinstance(problem, Problem):
        from codex_lab.evals import codebench as cb

        return cb.wrong_completions(problem)
    prog = _program_of(problem)
    ms = [m.program for m in mutants(prog)]
    if problem.family in ("completion", "bugfix"):
        return [m.body() for m in ms] + ["", "    pass\n", "    return None\n"]
    if problem.family == "translate":
        return [m.js_source() for m in ms] + ["", f"function {prog.name}(x) {{ return null; }}\n",
                                              f"function {prog.name}(x) {{\n"]
    if problem.family == "fim":
        k = len(prog.steps) - len(problem.suffix.splitlines())  # the removed step: the suffix is the rest + return
        # only mutants that differ from the program at the removed line alone (constant, operator): the
        # filled-in program is then exactly that mutant, a different program by construction
        same = [j for j in range(len(prog.steps)) if j != k]
        alt = {m.lines()[k] for m in ms if len(m.steps) == len(prog.steps)
               and all(m.lines()[j] == prog.lines()[j] for j in same) and m.lines()[k] != problem.canonical_solution}
        return sorted(alt) + ["", "    pass\n"]
    # testgen
    bad = shown_mutant(prog)
    x = killing_input(prog, bad)
    n = prog.name
    return ["assert True\n", f"assert {n}({x!r}) == {n}({x!r})\n", f"assert {n}({x!r}) == {bad.run(x)!r}\n",
            "assert (\n", ""]


def task_example(p: Problem) -> TaskExample:
    """``p`` as a fine-tuning example (lesson 05's format): same input text, the canonical answer."""
    prompt = p.prompt if p.family == "fim" else p.code  # TaskExample adds the tag and <|answer|> itself
    return TaskExample(f"{p.family}:{p.split}:{p.uid}", p.family, prompt, p.canonical_solution, p.uid, p.part)


def training_tasks(split: str = "iid", families: Sequence[str] | str = ("all",), n_per_family: int | None = None,
                   seed: int = 0, examples: bool = True) -> TaskSet:
    """The ``train`` (and ``val``) problems of ``split`` as lesson 05's :class:`TaskSet`; never ``test``.

    ``examples[family] = {"train": [...], "val": [...]}``. ``n_per_family`` keeps that many
    training examples per family (drawn with ``seed``; None keeps all); val is kept whole
    (it measures convergence). ``split="legacy"`` returns the first codebench's training set.
    """
    check_split(split)
    if n_per_family is not None and n_per_family < 1:
        raise ValueError(f"n_per_family must be >= 1, got {n_per_family}")
    if split == "legacy":
        from codex_lab.evals import codebench as cb

        ts = cb.training_tasks(check_families(families, LEGACY_FAMILIES))
        if n_per_family is not None:
            for fam, d in ts.examples.items():
                if n_per_family < len(d["train"]):
                    d["train"] = random.Random(f"{seed}:{fam}").sample(d["train"], n_per_family)
        return ts
    fams = check_families(families)
    ts = TaskSet()
    for fam in fams:
        train = load_problems(split, (fam,), part="train", n=n_per_family, seed=seed, examples=examples)
        val = load_problems(split, (fam,), part="val", examples=examples)
        ts.examples[fam] = {"train": [task_example(p) for p in train], "val": [task_example(p) for p in val]}
    return ts


def sizes() -> dict[str, dict[str, int]]:
    """Programs per split and part (every family has one problem per program; legacy: per family)."""
    from codex_lab.evals import codebench as cb

    out = {s: {part: len(programs(s, part)) for part in PARTS} for s in PROGRAM_SPLITS}
    legacy = cb.sizes()
    out["legacy"] = {part: legacy["completion"][part] for part in PARTS}
    return out


__all__ = ["FAMILIES", "LEGACY_FAMILIES", "Problem", "make_problem", "load_problems", "canonical_completions",
    "wrong_completions", "task_example", "training_tasks", "sizes", "check_families", "python_tests",
    "js_harness", "shown_mutant"]
