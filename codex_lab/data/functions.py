"""Functions of the corpus as records, and the task example type built from them (lesson 05).

Each function gets a split (train / val) from a stable hash of its normalised source, so no
function, nor an identical copy of it in another file, feeds both splits.
"""

from __future__ import annotations

import ast
import hashlib
import textwrap
from dataclasses import dataclass
from typing import Iterable

from codex_lab.data.corpus import SourceFile
from codex_lab.data.tokenizer import ANSWER, EOT, TASK_TAGS


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

    def input_text(self) -> str:
        """What the model reads before the answer: ``<|task|> prompt <|answer|>``. A task with
        no tag (``fim`` of codebench) formats its own prompt (the FIM tokens) and reads it as is."""
        tag = TASK_TAGS.get(self.task)
        return self.prompt if tag is None else f"{tag}{self.prompt}{ANSWER}"

    def text(self) -> str:
        """The full training text: tag, prompt, answer separator, answer, end of text."""
        return f"{self.input_text()}{self.answer}{EOT}"


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
