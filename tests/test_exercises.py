"""The exercise pipeline: marker stripping, definition loading, and errors."""

from pathlib import Path

import pytest

from codex_lab.course.exercises import exercise_source, generate_exercises, load_definitions, strip_solutions

SRC = '''def add(a, b):
    """Add."""
    ### BEGIN SOLUTION
    return a + b
    ### END SOLUTION


class K:
    def m(self):
        ### BEGIN SOLUTION
        return 1
        ### END SOLUTION
'''


def test_strip_replaces_answers_with_named_not_implemented():
    out = strip_solutions(SRC)
    assert "return a + b" not in out and "return 1" not in out
    assert '    raise NotImplementedError("exercise add: not yet done")' in out
    assert '        raise NotImplementedError("exercise m: not yet done")' in out
    compile(out, "x", "exec")


@pytest.mark.parametrize("bad, msg", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "never closed"),
    ("def f():\n    return 1\n    ### END SOLUTION\n", "without a matching"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "outside a function"),
    ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    ### END SOLUTION\n", "nested"),
])
def test_bad_markers_are_errors_with_line_numbers(bad, msg):
    with pytest.raises(ValueError, match=msg):
        strip_solutions(bad, "lesson.py")


def test_generated_copy_keeps_jupytext_header_first():
    src = "# ---\n# jupyter:\n#   jupytext:\n# ---\n\n# %%\n" + SRC
    out = exercise_source(src)
    assert out.startswith("# ---\n") and "GENERATED from solutions/" in out


def test_generate_and_check_drift(tmp_path: Path):
    sol, exe = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    (sol / "09_x.py").write_text("# %%\n" + SRC)
    written = generate_exercises(sol, exe)
    assert sorted(p.name for p in written) == ["09_x.ipynb", "09_x.py"]
    assert generate_exercises(sol, exe, check=True) == []
    (exe / "09_x.py").write_text("edited by hand\n")
    assert [p.name for p in generate_exercises(sol, exe, check=True)] == ["09_x.py"]
    (exe / "99_stale.py").write_text("x = 1\n")
    assert "99_stale.py" in [p.name for p in generate_exercises(sol, exe, check=True)]


def test_load_definitions_skips_side_effect_cells(tmp_path: Path):
    p = tmp_path / "00_x.py"
    p.write_text("import math\nraise SystemExit('a training cell')\n\ndef f(x):\n    return math.sqrt(x)\n")
    mod = load_definitions(p)
    assert mod.f(9) == 3.0


def test_ci_runs_the_unsolved_exercise_notebooks():
    """pytest collects exercises/ (nbval runs every unsolved notebook top to bottom) while its
    generated .py copies are never collected as test modules."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "exercises" in cfg["testpaths"] and "--nbval-lax" in cfg["addopts"]
    assert cfg["python_files"] == ["test_*.py"], "exercises/NN_topic.py must not match python_files"
    assert not list((root / "exercises").glob("test_*.py"))


def test_unsolved_cells_are_guarded():
    """In every solutions/ notebook, a code cell that calls an exercise function outside its
    own definition runs only after that exercise's check passed (so the generated, unsolved
    copy runs clean under nbval: 'not yet done', then 'skipped')."""
    import ast

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "solutions").glob("[0-9][0-9]_*.py")):
        tree = ast.parse(path.read_text())
        answers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and "### BEGIN SOLUTION" in ast.get_source_segment(path.read_text(), n)}
        flags: set[str] = set()  # names bound to a check's outcome, e.g. done_1 = check(f).status == "passed"
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Assign) and "check(" in ast.unparse(node.value):
                flags |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                continue
            test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
            guarded = "check(" in test or any(n.id in flags for n in ast.walk(node.test) if isinstance(n, ast.Name)) if test else False
            called = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            used = called & answers
            if used and not guarded:
                # a bare `check(fn)` statement is fine: it reports "not yet done" without raising
                bare_check = isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "check"
                assert bare_check, f"{path.name}:{node.lineno}: calls {sorted(used)} outside an `if check(...)...` guard"
