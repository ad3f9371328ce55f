"""Grading builds ASTs in threads (grade_folder), and CPython 3.11's AST constructor keeps its
recursion depth in state the threads share (python/cpython#106905: "SystemError: AST constructor
recursion depth mismatch", which cost whole submissions in a loaded suite run). The grading
modules therefore build ASTs only through codex_lab.course.parsing, under one lock."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from codex_lab.course import parsing

COURSE = Path(__file__).parents[1] / "codex_lab" / "course"


def _unlocked_ast_calls(path: Path) -> list[str]:
    """Calls in ``path`` that build or convert an AST without the lock: ``ast.parse(...)``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"):
            out.append(f"{path.name}:{node.lineno}")
    return out


def test_grading_modules_parse_only_under_the_lock():
    found = [hit for p in sorted(COURSE.glob("*.py")) if p.name != "parsing.py" for hit in _unlocked_ast_calls(p)]
    assert not found, f"ast.parse outside codex_lab.course.parsing (use parsing.parse): {found}"


def test_the_scan_sees_an_unlocked_parse(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ast\n\ndef f(src):\n    return ast.parse(src)\n")
    assert _unlocked_ast_calls(bad) == ["bad.py:4"]


def test_threads_parse_the_same_tree_through_the_lock():
    src = (COURSE / "learner_view.py").read_text()  # a real module, a few hundred lines of nesting
    want = ast.dump(ast.parse(src))
    got: list[str] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                got.append(ast.dump(parsing.parse(src, "learner_view.py")))
                parsing.compile_tree(parsing.parse(src), "learner_view.py")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 30 and all(g == want for g in got)
