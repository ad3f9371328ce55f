"""Supervised code tasks built from the corpus for multi-task fine-tuning (lesson 05).

Every example comes from one function of the corpus and is deterministic (same corpus,
same examples, same ids on every machine). The train/validation split is decided per
*function* by a stable hash of its normalised source, so no function (nor an identical
copy of it in another file) ever feeds both splits, whatever the task.

Tasks (the sizes differ on purpose, as in the article):
- ``completion``: signature + docstring -> body (large: every documented function);
- ``bugfix``: the function with one injected bug (AST mutation: flipped comparison,
  off-by-one constant, swapped operands, negated condition) -> the original (medium);
- ``testgen``: the function without its examples -> doctest examples that hold for it
  (small: only top-level functions whose doctests pass when run in the sandbox);
- ``docstring``: the function without its docstring -> the docstring;
- ``translate``: an honest *proxy* for cross-language translation, since the corpus is one
  language: snake_case code -> the same code with camelCase local names (a style transfer).

Prompt format (token level): ``<|task|> prompt <|answer|> answer <|endoftext|>``. Only the
answer and the end-of-text token carry loss ("valid tokens"); see :func:`collate`.
"""

from __future__ import annotations

import ast
import copy
import doctest
import hashlib
import json
import re
import textwrap
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from torch import Tensor

from codex_lab.data.corpus import Corpus, SourceFile
from codex_lab.sandbox import run_python
from codex_lab.data.tokenizer import ANSWER, EOT, TASK_TAGS, CodeTokenizer

TASKS: tuple[str, ...] = ("completion", "bugfix", "testgen", "docstring", "translate")
MUTATIONS: tuple[str, ...] = ("flip_compare", "off_by_one", "swap_operands", "negate_condition")


def _bucket(text: str) -> int:
    """Stable bucket in 0..9999: int(sha1(text)) mod 10_000."""
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % 10_000


@dataclass(frozen=True)
class FunctionRecord:
    """One function of the corpus.

    ``source`` is the dedented original text, ``code`` its normalised form
    (``ast.unparse``, comments and layout dropped), ``imports`` the module-level import
    statements of its file (needed to run it), ``split`` "train" or "val".
    """

    path: str
    qualname: str
    source: str
    code: str
    imports: str
    top_level: bool
    split: str

    @property
    def uid(self) -> str:
        """Stable id ``path::qualname``."""
        return f"{self.path}::{self.qualname}"


@dataclass(frozen=True)
class TaskExample:
    """One supervised example: ``prompt`` -> ``answer`` for ``task``.

    ``id`` is stable (``task:path::qualname``), ``func`` the source function's uid,
    ``context`` code that makes the function runnable (testgen only: imports + def).
    """

    id: str
    task: str
    prompt: str
    answer: str
    func: str
    split: str
    context: str = ""

    def text(self) -> str:
        """The full training text: tag, prompt, answer separator, answer, end of text."""
        return f"{TASK_TAGS[self.task]}{self.prompt}{ANSWER}{self.answer}{EOT}"


# --------------------------------------------------------------------------------------
# Functions of the corpus
# --------------------------------------------------------------------------------------


def _docstring_node(fn: ast.FunctionDef) -> ast.Expr | None:
    first = fn.body[0] if fn.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def extract_functions(
    files: Iterable[SourceFile], *, val_fraction: float = 0.15, max_chars: int = 1200, min_lines: int = 3
) -> list[FunctionRecord]:
    """Top-level functions and methods (one class level deep) of ``files``, deduplicated.

    A function is kept when its source has ``min_lines``..``max_chars`` and parses on its own
    after dedenting. Its split is "val" when sha1(normalised code) mod 10_000 <
    ``val_fraction`` * 10_000, so identical functions in different files share a split.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    out: list[FunctionRecord] = []
    seen: set[str] = set()
    for f in files:
        try:
            tree = ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        lines = f.text.splitlines(keepends=True)
        imports = "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and not (isinstance(n, ast.ImportFrom) and n.level))
        todo: list[tuple[ast.AST, str, bool]] = [(n, n.name, True) for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            todo += [(n, f"{cls.name}.{n.name}", False) for n in cls.body if isinstance(n, ast.FunctionDef)]
        for node, qualname, top in todo:
            assert isinstance(node, ast.FunctionDef)
            src = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
            if not min_lines <= src.count("\n") or len(src) > max_chars:
                continue
            try:
                code = ast.unparse(ast.parse(src))
            except (SyntaxError, ValueError):
                continue
            if code in seen:
                continue
            seen.add(code)
            split = "val" if _bucket(code) < round(val_fraction * 10_000) else "train"
            out.append(FunctionRecord(f.path, qualname, src, code, imports, top, split))
    return out


# --------------------------------------------------------------------------------------
# Completion, docstring
# --------------------------------------------------------------------------------------


def completion_example(fn: FunctionRecord) -> TaskExample | None:
    """Signature + docstring -> the rest of the body (original text). None without a docstring."""
    node = ast.parse(fn.source).body[0]
    assert isinstance(node, ast.FunctionDef)
    doc = _docstring_node(node)
    if doc is None or len(node.body) < 2:
        return None
    lines = fn.source.splitlines(keepends=True)
    cut = doc.end_lineno or doc.lineno
    prompt, answer = "".join(lines[:cut]), "".join(lines[cut:])
    if not answer.strip():
        return None
    return TaskExample(f"completion:{fn.uid}", "completion", prompt, answer, fn.uid, fn.split)


def docstring_example(fn: FunctionRecord) -> TaskExample | None:
    """The function without its docstring (normalised code) -> the docstring text."""
    tree = ast.parse(fn.source)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    doc = _docstring_node(node)
    if doc is None or len(node.body) < 2:
        return None
    text = ast.get_docstring(node) or ""
    if len(text.split()) < 3:
        return None
    node.body = node.body[1:]
    return TaskExample(f"docstring:{fn.uid}", "docstring", ast.unparse(tree) + "\n", text, fn.uid, fn.split)


# --------------------------------------------------------------------------------------
# Bug injection
# --------------------------------------------------------------------------------------

_FLIP: dict[type, type] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)


def mutation_sites(tree: ast.AST) -> list[tuple[str, int]]:
    """Every place one of :data:`MUTATIONS` applies, as (kind, index in ``ast.walk`` order).

    - flip_compare: a one-operator comparison, operator replaced by its negation (< -> >=);
    - off_by_one: an int constant inside a comparison, a subscript or a ``range`` call, +1;
    - swap_operands: a non-commutative binary operation with different operands (a - b -> b - a);
    - negate_condition: the test of ``if``/``while``/``x if c else y`` wrapped in ``not``.
    """
    sites: list[tuple[str, int]] = []
    int_ctx: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Compare, ast.Subscript)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
        ):
            int_ctx.update(id(n) for n in ast.walk(node))
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            sites.append(("flip_compare", i))
        elif isinstance(node, ast.Constant) and type(node.value) is int and id(node) in int_ctx:
            sites.append(("off_by_one", i))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _NONCOMMUTATIVE) and ast.dump(node.left) != ast.dump(node.right):
            sites.append(("swap_operands", i))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            sites.append(("negate_condition", i))
    return sites


def apply_mutation(tree: ast.AST, kind: str, index: int) -> ast.AST:
    """A mutated deep copy of ``tree``: mutation ``kind`` at node ``index`` (``ast.walk`` order)."""
    if kind not in MUTATIONS:
        raise ValueError(f"unknown mutation {kind!r}; choose one of {MUTATIONS}")
    new = copy.deepcopy(tree)
    node = list(ast.walk(new))[index]
    if kind == "flip_compare":
        assert isinstance(node, ast.Compare)
        node.ops = [_FLIP[type(node.ops[0])]()]
    elif kind == "off_by_one":
        assert isinstance(node, ast.Constant)
        node.value = node.value + 1
    elif kind == "swap_operands":
        assert isinstance(node, ast.BinOp)
        node.left, node.right = node.right, node.left
    else:
        assert isinstance(node, (ast.If, ast.While, ast.IfExp))
        t = node.test
        # not (not c) would only be a cosmetic change: unwrap instead
        node.test = t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) else ast.UnaryOp(op=ast.Not(), operand=t)
    return ast.fix_missing_locations(new)


def inject_bug(code: str, key: str) -> tuple[str, str] | None:
    """(buggy code, mutation kind) for ``code``; the site is chosen by a stable hash of ``key``.

    Returns None when no site exists or the mutation would not change the code text.
    """
    tree = ast.parse(code)
    sites = mutation_sites(tree)
    if not sites:
        return None
    kind, index = sites[_bucket(key) % len(sites)]
    buggy = ast.unparse(apply_mutation(tree, kind, index))
    if buggy == ast.unparse(tree):
        return None
    return buggy, kind


def bugfix_example(fn: FunctionRecord) -> TaskExample | None:
    """Buggy function (normalised code, docstring removed) -> the original function."""
    tree = ast.parse(fn.code)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    if _docstring_node(node) is not None and len(node.body) > 1:
        node.body = node.body[1:]  # shorter examples; the docstring is not what is being fixed
    code = ast.unparse(tree)
    res = inject_bug(code, fn.uid)
    if res is None:
        return None
    buggy, _kind = res
    return TaskExample(f"bugfix:{fn.uid}", "bugfix", buggy + "\n", code + "\n", fn.uid, fn.split)


# --------------------------------------------------------------------------------------
# Test generation (doctests that hold)
# --------------------------------------------------------------------------------------


def doctest_answer(docstring: str) -> str:
    """The doctest examples of a docstring, normalised: ``>>> src`` / ``... more`` / output lines."""
    parts = []
    for ex in doctest.DocTestParser().get_examples(docstring):
        src = ex.source.rstrip("\n").split("\n")
        parts.append("\n".join([">>> " + src[0], *("... " + s for s in src[1:])]) + "\n" + ex.want)
    return "".join(parts)


def _testgen_candidate(fn: FunctionRecord) -> TaskExample | None:
    if not fn.top_level:
        return None
    tree = ast.parse(fn.source)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    doc = _docstring_node(node)
    text = ast.get_docstring(node, clean=True) if doc is not None else None
    if doc is None or not text or ">>>" not in text:
        return None
    answer = doctest_answer(text)
    if not answer.strip():
        return None
    head = text[: text.index(">>>")].rstrip()
    if head:
        doc.value = ast.Constant(head)
    elif len(node.body) > 1:
        node.body = node.body[1:]
    else:
        return None
    prompt = ast.unparse(tree) + "\n"
    return TaskExample(f"testgen:{fn.uid}", "testgen", prompt, answer, fn.uid, fn.split, run_context(fn))


def module_name(path: str) -> str:
    """Import name of a corpus file: ``json/decoder.py`` -> ``json.decoder``."""
    mod = path[: -len(".py")] if path.endswith(".py") else path
    mod = mod.replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def run_context(fn: FunctionRecord) -> str:
    """Code that defines ``fn`` with its module's names in scope (for running its doctests).

    The module is imported by name when it can be (standard-library corpus), then the file's
    absolute imports run, then the function's own source: tests run against that source.
    """
    imports = textwrap.indent(fn.imports or "pass", "    ")
    return (
        f"try:\n    import importlib as _il\n    globals().update(vars(_il.import_module({module_name(fn.path)!r})))\n"
        "except Exception:\n    pass\n"
        f"try:\n{imports}\nexcept Exception:\n    pass\n\n{fn.source}"
    )


_RUNNER = '''
import doctest, json, signal, sys
def _alarm(*a):
    raise TimeoutError("doctest took too long")
signal.signal(signal.SIGALRM, _alarm)
results = []
for context, tests in json.loads(CASES):
    ok = False
    try:
        signal.alarm(2)
        g = {"__name__": "__codex_lab_testgen__"}
        exec(compile(context, "<function>", "exec"), g)
        test = doctest.DocTestParser().get_doctest(tests, g, "generated", None, 0)
        runner = doctest.DocTestRunner(verbose=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        res = runner.run(test, out=lambda s: None)
        ok = res.attempted > 0 and res.failed == 0
    except BaseException:
        ok = False
    finally:
        signal.alarm(0)
    results.append(ok)
print("RESULTS" + json.dumps(results))
'''


def run_doctests(cases: Sequence[tuple[str, str]], *, timeout_s: float = 60.0) -> list[bool]:
    """Run each (context code, doctest text) pair in one sandboxed child process.

    A case passes when at least one example ran and none failed (2 s limit per case).
    Returns one bool per case; all False if the child itself failed or timed out.
    """
    if not cases:
        return []
    code = "CASES = " + repr(json.dumps(list(cases))) + "\n" + _RUNNER
    res = run_python(code, timeout_s=timeout_s, memory_mb=1024)
    m = re.search(r"RESULTS(\[.*\])", res.stdout)
    if m is None:
        return [False] * len(cases)
    return [bool(x) for x in json.loads(m.group(1))]


# --------------------------------------------------------------------------------------
# Translation proxy: snake_case -> camelCase local names
# --------------------------------------------------------------------------------------


def camel(name: str) -> str:
    """snake_case -> camelCase (leading/trailing underscores kept): ``max_len`` -> ``maxLen``."""
    core = name.strip("_")
    if "_" not in core:
        return name
    lead = name[: len(name) - len(name.lstrip("_"))]
    trail = name[len(name.rstrip("_")) :]
    words = [w for w in core.split("_") if w]
    return lead + words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:]) + trail


def to_camel_case(code: str) -> str:
    """Rename the function's arguments and assigned local names to camelCase (AST rewrite).

    Attribute names, globals, keyword-argument names of calls and the function's own name
    are untouched, so the renamed function behaves exactly like the original.
    """
    tree = ast.parse(code)
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError("to_camel_case expects code that starts with a function definition")
    a = fn.args
    local = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
    for node in ast.walk(fn):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            local -= set(node.names)  # module-level names must keep their spelling
    rename = {n: camel(n) for n in local if camel(n) != n}
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | {x.arg for x in ast.walk(fn) if isinstance(x, ast.arg)}
    rename = {k: v for k, v in rename.items() if v not in taken}  # never collide with an existing name
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in rename:
            node.id = rename[node.id]
        elif isinstance(node, ast.arg) and node.arg in rename:
            node.arg = rename[node.arg]
    return ast.unparse(tree)


def translate_example(fn: FunctionRecord) -> TaskExample | None:
    """Normalised code (docstring removed) -> the same code with camelCase locals (a proxy task)."""
    tree = ast.parse(fn.code)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    if _docstring_node(node) is not None and len(node.body) > 1:
        node.body = node.body[1:]
    code = ast.unparse(tree)
    out = to_camel_case(code)
    if out == code:
        return None
    return TaskExample(f"translate:{fn.uid}", "translate", code + "\n", out + "\n", fn.uid, fn.split)


# --------------------------------------------------------------------------------------
# All tasks
# --------------------------------------------------------------------------------------

def task_files(corpus: Corpus, fraction: float = 1.0) -> list[SourceFile]:
    """Corpus files to build tasks from: no test folders; a stable ``fraction`` of the others
    (sha1 of the path), plus every file with doctest examples (the testgen source is scarce)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    out = []
    for f in corpus.files:
        parts = f.path.split("/")
        if any(p in ("test", "tests", "idle_test") for p in parts[:-1]):
            continue
        if _bucket("files:" + f.path) < round(fraction * 10_000) or ">>>" in f.text:
            out.append(f)
    return out


BUILDERS = {"completion": completion_example, "bugfix": bugfix_example, "docstring": docstring_example, "translate": translate_example}
# share of eligible functions each task keeps (stable hash): sizes differ like in the article
DEFAULT_SHARE = {"completion": 1.0, "bugfix": 0.35, "testgen": 1.0, "docstring": 0.35, "translate": 0.35}


@dataclass
class TaskSet:
    """Examples per task and split: ``examples[task]["train" | "val"]``."""

    examples: dict[str, dict[str, list[TaskExample]]] = field(default_factory=dict)

    def sizes(self) -> dict[str, dict[str, int]]:
        """Number of examples per task and split."""
        return {t: {s: len(v) for s, v in d.items()} for t, d in self.examples.items()}

    def split(self, name: str) -> dict[str, list[TaskExample]]:
        """Examples of one split, per task."""
        return {t: d[name] for t, d in self.examples.items()}


def build_tasks(
    corpus: Corpus | Sequence[SourceFile],
    tasks: Sequence[str] = TASKS,
    *,
    share: dict[str, float] | None = None,
    val_fraction: float = 0.15,
    verify_tests: bool = True,
    max_chars: int = 1200,
) -> TaskSet:
    """Build the examples of ``tasks`` from the corpus functions, deterministically.

    Args:
        corpus: a :class:`Corpus` or a list of its files.
        tasks: names from :data:`TASKS`.
        share: fraction of eligible functions per task (stable hash); default :data:`DEFAULT_SHARE`.
        val_fraction: share of functions (by hash of their code) held out for validation.
        verify_tests: run every testgen candidate's doctests in the sandbox and keep those that pass.
        max_chars: longest function source kept, in characters.
    """
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown tasks {bad}; choose from {list(TASKS)}")
    share = {**DEFAULT_SHARE, **(share or {})}
    files = corpus.files if isinstance(corpus, Corpus) else list(corpus)
    funcs = extract_functions(files, val_fraction=val_fraction, max_chars=max_chars)
    ts = TaskSet()
    for task in tasks:
        keep = [f for f in funcs if (_bucket(task + f.uid) < round(share[task] * 10_000))]
        builder = _testgen_candidate if task == "testgen" else BUILDERS[task]
        exs = [e for e in (builder(f) for f in keep) if e is not None]
        if task == "testgen" and verify_tests:
            ok = run_doctests([(e.context, e.answer) for e in exs])
            exs = [e for e, good in zip(exs, ok) if good]
        ts.examples[task] = {s: [e for e in exs if e.split == s] for s in ("train", "val")}
    return ts


# --------------------------------------------------------------------------------------
# Tokens and batches
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    """An example as token ids: ``prompt_ids`` (tag..<|answer|>) and ``answer_ids`` (..<|endoftext|>)."""

    prompt_ids: list[int]
    answer_ids: list[int]
    task: int
    id: str


def encode_example(tok: CodeTokenizer, ex: TaskExample, task_index: int) -> Encoded:
    """Token ids of one example; prompt and answer are encoded apart so the boundary is exact."""
    p = tok.encode(f"{TASK_TAGS[ex.task]}{ex.prompt}{ANSWER}")
    a = tok.encode(ex.answer) + [tok.eot_id]
    return Encoded(p, a, task_index, ex.id)


def encode_tasks(tok: CodeTokenizer, per_task: dict[str, list[TaskExample]], task_names: Sequence[str], max_len: int) -> dict[str, list[Encoded]]:
    """Encode each task's examples, dropping those longer than ``max_len`` tokens in all."""
    out: dict[str, list[Encoded]] = {}
    for name in task_names:
        k = list(task_names).index(name)
        enc = [encode_example(tok, e, k) for e in per_task.get(name, [])]
        out[name] = [e for e in enc if len(e.prompt_ids) + len(e.answer_ids) <= max_len]
    return out


@dataclass
class Batch:
    """x (B, T) inputs, y (B, T) next-token targets with -100 on prompt and padding,
    task (B,) task index of each row, valid (B,) loss-bearing tokens per row."""

    x: Tensor
    y: Tensor
    task: Tensor
    valid: Tensor


def collate(items: Sequence[Encoded], pad_id: int) -> Batch:
    """Right-pad a list of examples into one batch; only answer tokens carry targets.

    For the sequence s = prompt + answer (length n): x = s[:-1], y = s[1:], and
    y[t] = -100 wherever s[t + 1] is a prompt token or padding.
    """
    if not items:
        raise ValueError("collate needs at least one example")
    T = max(len(e.prompt_ids) + len(e.answer_ids) for e in items) - 1
    x = torch.full((len(items), T), pad_id, dtype=torch.long)  # (B, T)
    y = torch.full((len(items), T), -100, dtype=torch.long)  # (B, T)
    for i, e in enumerate(items):
        s = e.prompt_ids + e.answer_ids
        n, p = len(s), len(e.prompt_ids)
        x[i, : n - 1] = torch.tensor(s[:-1])
        # targets s[p:] (the answer) sit at positions p-1 .. n-2
        y[i, p - 1 : n - 1] = torch.tensor(s[p:])
    task = torch.tensor([e.task for e in items], dtype=torch.long)  # (B,)
    valid = (y != -100).sum(dim=1)  # (B,)
    return Batch(x, y, task, valid)
