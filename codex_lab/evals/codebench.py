"""codebench: an executable benchmark the course builds itself, sized for small models.

HumanEval is the real-model measurement, but a 4M-parameter model scores 0/164 on it, so
no difference between two small models is visible there. codebench keeps HumanEval's
method (a prompt, a hidden test, a canonical solution, execution in the sandbox, pass@k)
on problems made from short templates, one family per task of the article:

- ``completion``: signature + docstring -> the body (``    return x + 3``);
- ``bugfix``: a function with one seeded bug (an operator changed against its docstring)
  -> the fixed line (the program is the function's header + that line);
- ``testgen``: a function -> one assertion that passes on it and fails on a hidden mutant
  (the seeded bug of ``bugfix``): a generated test must *detect* a bug, not only run;
- ``fim``: fill in the middle (Bavarian et al. 2022): prefix and suffix of a two-line body
  -> the removed line, in the tokenizer's reserved ``<|fim_prefix|>`` / ``<|fim_suffix|>``
  / ``<|fim_middle|>`` format (prefix-suffix-middle).

How problems are made: a *function* is one template (:data:`TEMPLATES`: an operation with
a docstring, an expression and a mutant expression) with a constant and an argument name.
Its split (``train`` / ``val`` / ``test``) is a stable hash of the (template, constant)
*group*, so every argument-name variant of ``add 3`` lands in the same split and no
held-out (``test``) operation-constant pair is ever seen in training, in any family.
Hidden tests call the function on fixed inputs with expected values computed from the
canonical expression here, at build time. Everything is deterministic; ``seed`` only
chooses which problems a smaller draw keeps (:func:`load_problems`).

Model-facing prompts (:attr:`Problem.prompt`) use the fine-tuning format of lesson 05
(``<|task|> code <|answer|>``; the answer ends at ``<|endoftext|>``), except ``fim``,
which uses the FIM tokens. Scoring runs through :mod:`codex_lab.evals.humaneval`'s runner.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Sequence

from codex_lab.data.functions import TaskExample
from codex_lab.data.tasks import TaskSet
from codex_lab.data.tokenizer import ANSWER, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, TASK_TAGS

FAMILIES: tuple[str, ...] = ("completion", "bugfix", "testgen", "fim")
SPLITS: tuple[str, ...] = ("train", "val", "test")
# share of (template, constant) groups per split, in basis points of a sha1 bucket
SPLIT_BP: dict[str, int] = {"test": 3_000, "val": 1_000}  # the rest (60%) is train
CONSTANTS: tuple[int, ...] = tuple(range(2, 14))
ARG_NAMES: dict[str, tuple[str, ...]] = {"int": ("x", "n", "value", "num"), "list": ("items", "xs", "values", "seq"),
                                         "str": ("text", "s", "word", "line")}
INPUTS: dict[str, tuple[Any, ...]] = {  # the hidden tests call the function on each of these
    "int": (0, 1, 2, 5, 9, 14, -3), "list": (list(range(20)), list(range(30, 50))),
    "str": ("ab", "Hello", "xyz"),
}


@dataclass(frozen=True)
class Template:
    """One operation: ``{c}`` is the constant, ``{a}`` the argument name.

    ``expr`` is the canonical body expression, ``mutant`` the seeded bug (it must differ
    from ``expr`` on ``probe``, the input the canonical test uses; a string probe for the
    sequence templates keeps that test short), ``kind`` the argument's type (a key of
    :data:`ARG_NAMES`).
    """

    key: str
    kind: str
    name: str
    doc: str
    expr: str
    mutant: str
    probe: Any


TEMPLATES: tuple[Template, ...] = (
    Template("add", "int", "add_{c}", "Return {a} plus {c}.", "{a} + {c}", "{a} - {c}", 0),
    Template("sub", "int", "sub_{c}", "Return {a} minus {c}.", "{a} - {c}", "{a} + {c}", 0),
    Template("mul", "int", "times_{c}", "Return {a} times {c}.", "{a} * {c}", "{a} + {c}", 1),
    Template("gt", "int", "above_{c}", "Return True if {a} is greater than {c}.", "{a} > {c}", "{a} < {c}", 20),
    Template("lt", "int", "below_{c}", "Return True if {a} is less than {c}.", "{a} < {c}", "{a} > {c}", 0),
    Template("eq", "int", "is_{c}", "Return True if {a} equals {c}.", "{a} == {c}", "{a} != {c}", "{c}"),
    Template("item", "list", "item_{c}", "Return item {c} of {a}.", "{a}[{c}]", "{a}[{c} - 1]", "abcdefghijklmnop"),
    Template("head", "list", "head_{c}", "Return the first {c} items of {a}.", "{a}[:{c}]", "{a}[{c}:]", "abcdefghijklmnop"),
    Template("repeat", "str", "repeat_{c}", "Return {a} repeated {c} times.", "{a} * {c}", "{a} * {c} + {a}", "a"),
)


@dataclass(frozen=True)
class Function:
    """One instance of a template: the canonical function, its mutant and its hidden test."""

    template: Template
    c: int
    arg: str

    @property
    def group(self) -> str:
        """The split unit: every argument name of one (template, constant) shares it."""
        return f"{self.template.key}:{self.c}"

    @property
    def name(self) -> str:
        return self.template.name.format(c=self.c)

    @property
    def uid(self) -> str:
        return f"{self.name}({self.arg})"

    def _fill(self, s: str) -> str:
        return s.format(a=self.arg, c=self.c)

    def header(self) -> str:
        """``def name(arg):`` and the docstring, each line ended by a newline."""
        return f'def {self.name}({self.arg}):\n    """{self._fill(self.template.doc)}"""\n'

    def code(self, *, mutant: bool = False) -> str:
        """The whole function: header + ``return`` of the canonical (or the mutant) expression."""
        return self.header() + f"    return {self._fill(self.template.mutant if mutant else self.template.expr)}\n"

    def value(self, x: Any, *, mutant: bool = False) -> Any:
        """The function's result on ``x``, computed here from its expression (trusted templates)."""
        ns: dict[str, Any] = {}
        exec(self.code(mutant=mutant), ns)  # noqa: S102 - our own template text, never model output
        return ns[self.name](x)

    def probe(self) -> Any:
        p = self.template.probe
        return int(p.format(c=self.c)) if isinstance(p, str) and self.template.kind == "int" else p

    def test(self) -> str:
        """The hidden test: assertions on every input of :data:`INPUTS` (and the probe)."""
        xs = [*INPUTS[self.template.kind], self.probe()]
        return "".join(f"assert {self.name}({x!r}) == {self.value(x)!r}\n" for x in xs)

    def assertion(self) -> str:
        """The canonical generated test: one assertion on the probe input (kills the mutant)."""
        return f"assert {self.name}({self.probe()!r}) == {self.value(self.probe())!r}\n"


def _bucket(text: str) -> int:
    """Stable bucket in 0..9999: int(sha1(text)) mod 10_000."""
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % 10_000


def split_of(group: str) -> str:
    """``test`` / ``val`` / ``train`` for a (template, constant) group, by a stable hash."""
    b = _bucket("codebench:" + group)
    if b < SPLIT_BP["test"]:
        return "test"
    return "val" if b < SPLIT_BP["test"] + SPLIT_BP["val"] else "train"


def functions() -> list[Function]:
    """Every template x constant x argument name, in a fixed order (template, constant, arg)."""
    return [Function(t, c, a) for t in TEMPLATES for c in CONSTANTS for a in ARG_NAMES[t.kind]]


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    ``prompt`` is the text the model reads (special tokens included); ``code`` is the same
    input as plain code (for display); ``canonical_solution`` the reference answer; ``test``
    the hidden test; ``mutant`` (testgen only) the buggy function the answer must catch.
    ``func`` is the source function's uid, ``group`` its split unit, ``split`` the split.
    """

    task_id: str
    family: str
    prompt: str
    code: str
    canonical_solution: str
    test: str
    func: str
    group: str
    split: str
    prefix: str = ""
    suffix: str = ""
    mutant: str = ""

    def program(self, completion: str) -> str:
        """The file the sandbox runs for ``completion``: it exits 0 exactly when the answer is right."""
        body = completion if completion.endswith("\n") else completion + "\n"
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


def make_problem(fn: Function, family: str) -> Problem:
    """The ``family`` problem built from ``fn`` (see the module docstring)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {list(FAMILIES)}")
    tid = f"codebench/{family}/{fn.uid}"
    common = dict(func=fn.uid, group=fn.group, split=split_of(fn.group), test=fn.test())
    if family == "completion":
        code = fn.header()
        answer = fn.code()[len(code):]
        return Problem(tid, family, f"{TASK_TAGS['completion']}{code}{ANSWER}", code, answer, **common)
    if family == "bugfix":  # the answer is the fixed line: the program is header + answer
        code = fn.code(mutant=True)
        return Problem(tid, family, f"{TASK_TAGS['bugfix']}{code}{ANSWER}", code, fn.code()[len(fn.header()):],
                       prefix=fn.header(), **common)
    if family == "testgen":
        code = fn.code()
        return Problem(tid, family, f"{TASK_TAGS['testgen']}{code}{ANSWER}", code, fn.assertion(),
                       mutant=fn.code(mutant=True), **common)
    # fim: a two-line body "result = expr / return result"; which line is removed is a stable hash
    lines = [fn.header(), f"    result = {fn._fill(fn.template.expr)}\n", "    return result\n"]
    k = 1 + _bucket("fim:" + fn.uid) % 2
    prefix, middle, suffix = "".join(lines[:k]), lines[k], "".join(lines[k + 1:])
    prompt = f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"
    return Problem(tid, family, prompt, f"{prefix}<FILL>\n{suffix}", middle, prefix=prefix, suffix=suffix, **common)


def all_problems(split: str | None = None, families: Sequence[str] = FAMILIES) -> list[Problem]:
    """Every problem of ``families`` (optionally of one split), in a fixed order."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    out = [make_problem(f, fam) for fam in families for f in functions()]
    return [p for p in out if split is None or p.split == split]


def load_problems(per_family: int | None = None, *, seed: int = 0, split: str = "test",
                  families: Sequence[str] = FAMILIES) -> list[Problem]:
    """The benchmark: problems of ``split`` (default the held-out ``test``), grouped by family.

    ``per_family`` keeps that many problems of each family, drawn with ``random.Random(seed)``
    (the same seed gives the same problems on every machine); None keeps them all.

    Raises:
        ValueError: an unknown family or split, or ``per_family`` < 1.
    """
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise ValueError(f"unknown families {bad}; choose from {list(FAMILIES)}")
    if per_family is not None and per_family < 1:
        raise ValueError(f"per_family must be >= 1, got {per_family}")
    out: list[Problem] = []
    for fam in families:
        ps = all_problems(split, (fam,))
        if per_family is not None and per_family < len(ps):
            ps = sorted(random.Random(f"{seed}:{fam}").sample(ps, per_family), key=lambda p: p.task_id)
        out += ps
    return out


def canonical_completions(problems: Sequence[Problem]) -> list[list[str]]:
    """One completion per problem: its reference answer (the oracle: must pass every test)."""
    return [[p.canonical_solution] for p in problems]


def wrong_completions(problem: Problem) -> list[str]:
    """Plausible wrong answers of ``problem`` that its check must reject (tests use them)."""
    fn = next(f for f in functions() if f.uid == problem.func)
    mutant_body = fn.code(mutant=True)[len(fn.header()):]
    common = ["", "    pass\n", "    return None\n"]
    if problem.family == "completion":
        return [*common, mutant_body, "    while True:\n        pass\n"]
    if problem.family == "bugfix":
        return [*common, mutant_body, "    return (\n"]
    if problem.family == "testgen":
        x = fn.probe()
        return ["assert True\n", f"assert {fn.name}({x!r}) == {fn.name}({x!r})\n",
                f"assert {fn.name}({x!r}) == {fn.value(x, mutant=True)!r}\n", "assert (\n", ""]
    wrong_middle = f"    result = {fn._fill(fn.template.mutant)}\n" if "result =" in problem.canonical_solution else "    return None\n"
    return [wrong_middle, "    pass\n", ""]


def sizes() -> dict[str, dict[str, int]]:
    """Number of problems per family and split."""
    ps = all_problems()
    return {fam: {s: sum(p.family == fam and p.split == s for p in ps) for s in SPLITS} for fam in FAMILIES}


# share of each family's training problems kept for fine-tuning (stable hash): the sizes
# differ as in the article (completion large, bug fixing and test generation small)
TRAIN_SHARE: dict[str, float] = {"completion": 1.0, "fim": 0.5, "bugfix": 0.25, "testgen": 0.15}


def task_example(p: Problem) -> TaskExample:
    """``p`` as a fine-tuning example (lesson 05's format): same input text, the canonical answer."""
    prompt = p.prompt if p.family == "fim" else p.code  # TaskExample adds the tag and <|answer|> itself
    return TaskExample(f"{p.family}:{p.func}", p.family, prompt, p.canonical_solution, p.func, p.split)


def training_tasks(families: Sequence[str] = FAMILIES, share: dict[str, float] | None = None) -> TaskSet:
    """Fine-tuning examples of the ``train`` and ``val`` splits only (never ``test``).

    ``share`` (default :data:`TRAIN_SHARE`) keeps a stable-hash fraction of each family's
    *training* problems; validation problems are all kept (they measure convergence).
    """
    share = {**TRAIN_SHARE, **(share or {})}
    ts = TaskSet()
    for fam in families:
        keep = round(share.get(fam, 1.0) * 10_000)
        train = [task_example(p) for p in all_problems("train", (fam,)) if _bucket("share:" + p.task_id) < keep]
        ts.examples[fam] = {"train": train, "val": [task_example(p) for p in all_problems("val", (fam,))]}
    return ts
