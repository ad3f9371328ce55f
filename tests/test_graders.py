"""Graders: every exercise passes against solutions/ and reports "not yet done" against
exercises/; partial credit per check case; forbidden package functions; the package's own
functions and lesson notebooks earn nothing; bulk grading (sandboxed) tells a solved, an
unsolved and a broken submission apart; Gradescope output."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codex_lab.course.checks import Exercise, case, load_all
from codex_lab.course.forbid import ForbiddenCall
from codex_lab.course.grade_runner import is_lesson_notebook, notebook_code, submission_text
from codex_lab.course.gradescope import results_json
from codex_lab.course.outcome import ERROR, FAILED, NOT_DONE, PARTIAL, PASSED, run_check
from codex_lab.course.grading import check, grade_folder, grade_in_process

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted({les for les, _ in load_all()})


def _path(folder: str, lesson: str) -> Path:
    matches = sorted((ROOT / folder).glob(f"{lesson}_*.py"))
    assert len(matches) == 1, f"expected one {folder}/{lesson}_*.py, found {matches}"
    return matches[0]


def _learner(src: str, name: str):
    """A function compiled as if from a learner's file (outside the package and the checks)."""
    ns: dict = {}
    exec(compile(src, "/submissions/learner_00_tour.py", "exec"), ns)
    return ns[name]


@pytest.mark.parametrize("lesson", LESSONS)
def test_solutions_pass_every_check(lesson):
    results = grade_in_process(_path("solutions", lesson))
    assert results and all(r.status == PASSED for r in results), [(r.name, r.status, r.message) for r in results]


@pytest.mark.parametrize("lesson", LESSONS)
def test_exercises_are_not_yet_done(lesson):
    results = grade_in_process(_path("exercises", lesson))
    assert results and all(r.status == NOT_DONE for r in results), [(r.name, r.status, r.message) for r in results]


def test_a_wrong_answer_fails(tmp_path):
    src = _path("solutions", "00").read_text().replace("return n_chars / n_tokens", "return n_tokens / n_chars")
    (tmp_path / "00_tour.py").write_text(src)
    by_name = {r.name: r for r in grade_in_process(tmp_path / "00_tour.py")}
    r = by_name["chars_per_token"]
    assert r.status == FAILED and "expected" in r.message and r.points == 0
    assert all(x.status == PASSED for n, x in by_name.items() if n != "chars_per_token")  # the others stay right


def _two_case_check(fn):
    with case(1, "zero"):
        assert fn(0) == 0, "f(0) must be 0"
    with case(2, "doubles"):
        assert fn(3) == 6, f"f(3) must be 6, got {fn(3)}"


def test_partial_credit_per_case():
    ex = Exercise("99", "double", _two_case_check, points=4)  # 1 + 2 in cases, 1 for an all-correct answer
    full = run_check(ex, lambda x: 2 * x)
    assert (full.status, full.points) == (PASSED, 4)
    half = run_check(ex, lambda x: x * x)  # f(0) = 0 passes, f(3) = 9 fails
    assert (half.status, half.points, half.max_points) == (PARTIAL, 1, 4) and "f(3) must be 6" in half.message
    none = run_check(ex, lambda x: x + 1)
    assert (none.status, none.points) == (FAILED, 0)
    flaky = run_check(ex, lambda x: 2 * x if x else 1 / x)  # crashes on 0 only: the second case still counts
    assert (flaky.status, flaky.points) == (PARTIAL, 2) and "ZeroDivisionError" in flaky.message
    todo = run_check(ex, _learner("def double(x):\n    raise NotImplementedError\n", "double"))
    assert (todo.status, todo.points) == (NOT_DONE, 0)


def test_case_points_over_the_maximum_is_a_check_defect():
    ex = Exercise("99", "double", _two_case_check, points=2)
    r = run_check(ex, lambda x: 2 * x)
    assert r.status == ERROR and "check defect" in r.message and r.points == 0


def test_sys_exit_in_a_learner_function_is_an_error_not_an_exit():
    ex = Exercise("99", "double", _two_case_check, points=3)
    r = run_check(ex, _learner("import sys\ndef double(x):\n    sys.exit(1)\n", "double"))
    assert r.status == ERROR and "sys.exit" in r.message


def _check_lesson_of(fn):
    from codex_lab.course.outcome import lesson_of

    expected = lesson_of("03_gqa.py")  # the check itself may call the forbidden function (its oracle)
    assert fn("03_gqa.py") == expected, f"expected {expected!r}"


FORBID = ("codex_lab.course.grading.lesson_of",)


@pytest.mark.parametrize("src", [
    "from codex_lab.course.grading import lesson_of\ndef lesson(p):\n    return lesson_of(p)\n",
    "import codex_lab.course.grading as g\ndef lesson(p, _f=g.lesson_of):\n    return _f(p)\n",  # an alias in a default
    "from codex_lab.course.grading import grade_in_process\ndef lesson(p):\n"  # through other package code
    "    import codex_lab.course.grading as g\n    return g.lesson_of(p)\n",
])
def test_forbidden_package_function_fails_with_write_it_yourself(src):
    ex = Exercise("99", "lesson", _check_lesson_of, points=1, forbid=FORBID)
    r = run_check(ex, _learner(src, "lesson"))
    assert r.status == FAILED and "write this one yourself" in r.message and r.points == 0, r
    from codex_lab.course.outcome import lesson_of

    assert lesson_of("05_x.py") == "05"  # restored after the check


def test_own_code_passes_a_forbidding_check():
    ex = Exercise("99", "lesson", _check_lesson_of, points=1, forbid=FORBID)
    r = run_check(ex, _learner("def lesson(p):\n    return p[:2]\n", "lesson"))
    assert r.status == PASSED, r


def test_the_package_function_itself_earns_nothing():
    from codex_lab.course.outcome import lesson_of

    ex = Exercise("99", "lesson_of", _check_lesson_of, points=2)
    import functools

    for answer in (lesson_of, functools.partial(lesson_of), functools.wraps(lesson_of)(lambda p: p[:2])):
        r = run_check(ex, answer)
        assert r.points == 0 and "write this one yourself" in r.message, (answer, r)
    assert issubclass(ForbiddenCall, AssertionError)


def test_notebook_submissions_and_lesson_notebooks():
    code = notebook_code((ROOT / "solutions" / "00_tour.ipynb").read_text())
    assert "def chars_per_token" in code and "### BEGIN SOLUTION" in code
    nb = sorted((ROOT / "notebooks").glob("00_*.py"))[0]
    assert is_lesson_notebook(submission_text(nb), "00")
    assert is_lesson_notebook(submission_text(nb.with_suffix(".ipynb")), "00")
    assert not is_lesson_notebook(_path("solutions", "00").read_text(), "00")
    with pytest.raises(ValueError):
        notebook_code('{"not": "a notebook"}')


def test_in_notebook_check_runs_in_process():
    fn = _learner("def chars_per_token(tok, texts):\n    raise NotImplementedError\n", "chars_per_token")
    assert check(fn).status == NOT_DONE
    with pytest.raises(AssertionError):
        check(_learner("def chars_per_token(tok, texts):\n    return 1.0\n", "chars_per_token"))


def test_gradescope_results_json():
    rows = [{"submission": "a/00_tour.py", "lesson": "00", "name": "f", "status": PASSED, "points": 2, "max_points": 2,
             "visibility": "public", "message": "ok"},
            {"submission": "a/00_tour.py", "lesson": "00", "name": "f", "status": PARTIAL, "points": 1, "max_points": 3,
             "visibility": "hidden", "message": "[x: 0/2] wrong"}]
    out = json.loads(results_json(rows))
    assert out["score"] == 3 and [t["max_score"] for t in out["tests"]] == [2, 3]
    assert [t["visibility"] for t in out["tests"]] == ["visible", "hidden"]
    assert "wrong" in out["tests"][1]["output"]


def test_bulk_grading_and_cli(tmp_path):
    for name, src in (("solved", "solutions"), ("unsolved", "exercises")):
        (tmp_path / name).mkdir()
        shutil.copy(_path(src, "00"), tmp_path / name / "00_tour.py")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "00_tour.py").write_text("def chars_per_token(:\n")
    rows = {r["submission"]: r for r in grade_folder(tmp_path)}
    assert rows["solved/00_tour.py"]["status"] == PASSED
    assert rows["unsolved/00_tour.py"]["status"] == NOT_DONE
    assert rows["broken/00_tour.py"]["status"] == ERROR
    out = tmp_path / "scores.json"
    proc = subprocess.run([sys.executable, "-m", "codex_lab.cli", "grade", str(tmp_path), "--json", str(out), "--csv", str(tmp_path / "s.csv")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    n_ex = sum(1 for lesson, _ in load_all() if lesson == "00")
    assert len(json.loads(out.read_text())) == 3 * n_ex  # one row per submission and exercise
    assert (tmp_path / "s.csv").read_text().splitlines()[0].startswith("submission,lesson,name,status,points,max_points")
    one = subprocess.run([sys.executable, "-m", "codex_lab.cli", "grade", str(tmp_path / "unsolved" / "00_tour.py")],
                         capture_output=True, text=True, timeout=900)
    assert one.returncode == 1 and "not yet done" in one.stdout and "all tests passed" not in one.stdout
