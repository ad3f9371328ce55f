"""The package's layers import only downward, with no cycles (deferred imports included).

nn <- data <- training / infer <- serve; hf converts checkpoints; lessons/ holds what one
lesson owns; measure/ holds peers and profilers (below the lessons that read them); course/ runs
grading, exercises and the report. The graph is read from the
code's own import statements (every ``import`` / ``from`` anywhere in a module, including
those inside functions), so a lazy import cannot hide an upward edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "codex_lab"

# layer -> layers it must never import (directly or through a deferred import)
FORBIDDEN: dict[str, set[str]] = {
    "nn": {"data", "training", "infer", "serve", "hf", "lessons", "course", "commands", "cli"},
    "data": {"training", "infer", "serve", "hf", "lessons", "course", "commands", "cli"},
    "training": {"infer", "serve", "hf", "lessons", "course", "commands", "cli"},
    "infer": {"training", "serve", "hf", "lessons", "course", "commands", "cli"},
    "serve": {"hf", "lessons", "course", "commands", "cli"},
    "hf": {"training", "infer", "serve", "lessons", "course", "commands", "cli"},
    "measure": {"lessons", "course", "commands", "cli"},  # peers and profilers: below the lessons that read them
    "lessons": {"commands", "cli"},
    "course": {"commands", "cli"},
    # base utilities every layer may use
    "runtime": {"nn", "data", "training", "infer", "serve", "hf", "lessons", "course", "commands", "cli"},
    "stats": {"nn", "data", "training", "infer", "serve", "hf", "lessons", "course", "commands", "cli"},
    "parallel": {"nn", "data", "training", "infer", "serve", "hf", "lessons", "course", "commands", "cli"},
    "sandbox": {"nn", "data", "training", "infer", "serve", "hf", "lessons", "course", "commands", "cli"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        if "assets" in p.parts:
            continue
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        is_pkg = p.name == "__init__.py"
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = m if is_pkg else m.rsplit(".", 1)[0]
                if node.level:
                    parts = base.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)])
                    mod = f"{base}.{node.module}" if node.module else base
                else:
                    mod = node.module or ""
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in names:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                # the package root re-exports everything lazily; it is not a dependency
                if t and t != m and t != "codex_lab" and m != "codex_lab" and not t.startswith(m + "."):
                    edges[m].add(t)
    return edges


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_graph_sees_deferred_imports() -> None:
    """The reader must see imports inside functions, or the other tests prove nothing."""
    edges = _edges(_modules())
    # course/report.py imports the shipped checkpoint loader inside a method
    assert "codex_lab.training.checkpoint" in edges["codex_lab.course.report"]


def test_no_upward_imports() -> None:
    edges = _edges(_modules())
    upward = [f"{m} -> {t}" for m, ts in edges.items() for t in ts if _layer(t) in FORBIDDEN.get(_layer(m), set())]
    assert not upward, "imports against the layering (see docs/CONTRIBUTING.md):\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    edges = _edges(_modules())
    # depth-first search for a back edge
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(edges):
        if v not in state:
            cycle = visit(v)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


# One concept per module is a review rule, not a line count: a module past REVIEW_LINES gets a warning in
# the test report (read it and split by concept if it holds two), and one past MAX_LINES fails, since
# no single concept of this course needs that many lines (the largest today is ~430).
REVIEW_LINES, MAX_LINES = 420, 600


def test_long_modules_are_flagged_for_review() -> None:
    import warnings

    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in _modules().items()}
    long = {m: n for m, n in sizes.items() if n > REVIEW_LINES}
    if long:
        warnings.warn(f"modules over {REVIEW_LINES} lines, check each holds one concept: {long}", stacklevel=1)
    huge = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not huge, f"modules over {MAX_LINES} lines hold more than one concept, split them: {huge}"


def test_every_public_name_is_exported_from_the_module_that_defines_it() -> None:
    """``codex_lab.X`` loads from the module of its concept, not through a re-export of another."""
    import importlib

    import codex_lab

    moved = []
    for mod, names in codex_lab._EXPORTS.items():
        m = importlib.import_module(f"codex_lab.{mod}")
        for n in names:
            home = getattr(getattr(m, n), "__module__", None)
            if isinstance(home, str) and home.startswith("codex_lab.") and home != f"codex_lab.{mod}":
                moved.append(f"{n}: listed under {mod}, defined in {home}")
    assert not moved, moved


def test_every_lesson_folder_is_a_package() -> None:
    lessons = [p for p in (ROOT / "lessons").iterdir() if p.is_dir() and p.name.startswith("l")]
    assert len(lessons) >= 9
    for p in lessons:
        assert (p / "__init__.py").is_file(), f"{p} needs an __init__.py"
