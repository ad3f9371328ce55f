"""Exercise pipeline: solutions/ holds the answers between solution markers; exercises/ is
generated from it (each answer replaced by a ``raise NotImplementedError`` naming the
exercise) and never edited by hand. ``codex-lab exercises --check`` fails on drift.
"""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

from codex_lab.course.parsing import compile_tree, parse

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(")
NOT_DONE = "not yet done"
HEADER = "# GENERATED from solutions/ by `codex-lab exercises generate`: do not edit by hand.\n"


def strip_solutions(source: str, filename: str = "<source>") -> str:
    """Replace every marked answer by ``raise NotImplementedError("exercise NAME: not yet done")``.

    NAME is the function that encloses the marker. Unbalanced or nested markers, or a
    marker outside any function, are errors naming the file and line.
    """
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == END:
            raise ValueError(f"{filename}:{i + 1}: '{END}' without a matching '{BEGIN}'")
        if line.strip() != BEGIN:
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        name = None
        for prev in reversed(out):
            m = _DEF.match(prev)
            if m and len(m.group(1)) < len(indent):
                name = m.group(2)
                break
        if name is None:
            raise ValueError(f"{filename}:{i + 1}: solution marker outside a function; put answers inside a def")
        j = i + 1
        while j < len(lines) and lines[j].strip() != END:
            if lines[j].strip() == BEGIN:
                raise ValueError(f"{filename}:{j + 1}: nested '{BEGIN}' (the one at line {i + 1} is not closed)")
            j += 1
        if j == len(lines):
            raise ValueError(f"{filename}:{i + 1}: '{BEGIN}' is never closed by '{END}'")
        out.append(f'{indent}raise NotImplementedError("exercise {name}: {NOT_DONE}")\n')
        i = j + 1
    return "".join(out)


def exercise_source(solution_source: str, filename: str = "<source>") -> str:
    """The learner's copy of a solution notebook source (jupytext percent text)."""
    body = strip_solutions(solution_source, filename)
    # keep the jupytext header first so the file stays a valid percent notebook
    if body.startswith("# ---\n"):
        end = body.index("# ---\n", 6) + len("# ---\n")
        return body[:end] + "\n" + HEADER + body[end:]
    return HEADER + body


def _py_to_ipynb(text: str) -> str:
    import jupytext

    nb = jupytext.reads(text, fmt="py:percent")
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"  # fixed ids: regeneration must be byte-for-byte stable
    return jupytext.writes(nb, fmt="ipynb")


def generate_exercises(solutions_dir: str | Path = "solutions", exercises_dir: str | Path = "exercises", check: bool = False) -> list[Path]:
    """Write exercises/NN_topic.py and .ipynb for every solutions/NN_topic.py.

    With ``check=True`` nothing is written; the paths that would change are returned
    (drift). Without it, the paths written are returned.
    """
    sol, exe = Path(solutions_dir), Path(exercises_dir)
    if not sol.is_dir():
        raise FileNotFoundError(f"no solutions folder at {str(sol)!r}")
    changed: list[Path] = []
    expected: set[str] = set()
    for src in sorted(sol.glob("*.py")):
        py_text = exercise_source(src.read_text(), str(src))
        files = {exe / src.name: py_text, exe / (src.stem + ".ipynb"): _py_to_ipynb(py_text)}
        for path, text in files.items():
            expected.add(path.name)
            if not path.is_file() or path.read_text() != text:
                changed.append(path)
                if not check:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
    if exe.is_dir():  # stale exercises whose solution was removed
        changed += [p for p in sorted(exe.glob("*")) if p.suffix in (".py", ".ipynb") and p.name not in expected]
    return changed


_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def load_definitions(path: str | Path) -> types.ModuleType:
    """Execute only the imports, functions and classes of a notebook's ``.py`` source.

    Cells that train, plot or print are skipped, so grading is fast and side-effect free.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook source at {str(path)!r}; grade the .py file of a lesson")
    tree = parse(path.read_text(), filename=str(path))  # under the AST lock: grading runs in threads
    tree.body = [n for n in tree.body if isinstance(n, _KEEP)]
    module = types.ModuleType(path.stem)
    module.__file__ = str(path)
    exec(compile_tree(tree, str(path)), module.__dict__)
    return module
