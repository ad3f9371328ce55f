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

from dataclasses import dataclass, field
from typing import Sequence

from codex_lab.data.corpus import Corpus, SourceFile
from codex_lab.data.bugs import bugfix_example
from codex_lab.data.doctests import _testgen_candidate, run_doctests
from codex_lab.data.functions import TaskExample, _bucket, extract_functions
from codex_lab.data.task_builders import completion_example, docstring_example, translate_example

TASKS: tuple[str, ...] = ("completion", "bugfix", "testgen", "docstring", "translate")


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
