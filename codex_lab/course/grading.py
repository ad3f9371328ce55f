"""Grading exercises: per-exercise status for one notebook, a folder of submissions, or a
single function from inside a notebook (``check``).

Statuses: ``passed`` (the public checks passed), ``not yet done`` (the function still
raises NotImplementedError), ``failed`` (a check's assertion failed), ``error`` (the
function raised something else), ``missing`` (no function of that name).
Wording is honest: passing means the *public checks* passed, nothing more.
"""

from __future__ import annotations

import csv
import io
import json
import re
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from codex_lab.course.checks import Exercise, exercises_for, load_all
from codex_lab.course.exercises import load_definitions

PASSED, NOT_DONE, FAILED, ERROR, MISSING = "passed", "not yet done", "failed", "error", "missing"


@dataclass
class Result:
    """Outcome of one exercise."""

    lesson: str
    name: str
    status: str
    message: str
    points: int
    max_points: int


def run_check(ex: Exercise, fn: Callable[..., Any] | None) -> Result:
    """Run one exercise's check on ``fn`` and classify the outcome."""
    if fn is None:
        return Result(ex.lesson, ex.name, MISSING, f"no function named {ex.name!r}", 0, ex.points)
    try:
        ex.check(fn)
    except NotImplementedError:
        return Result(ex.lesson, ex.name, NOT_DONE, "still raises NotImplementedError", 0, ex.points)
    except AssertionError as exc:
        return Result(ex.lesson, ex.name, FAILED, str(exc) or "a check failed", 0, ex.points)
    except Exception as exc:  # the learner's code crashed: show where
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return Result(ex.lesson, ex.name, ERROR, f"{type(exc).__name__}: {exc} (line {tb.lineno})", 0, ex.points)
    return Result(ex.lesson, ex.name, PASSED, "public checks passed", ex.points, ex.points)


def lesson_of(path: str | Path) -> str:
    """Lesson number from a file name like ``03_gqa.py`` -> ``"03"``."""
    m = re.match(r"(\d\d)_", Path(path).name)
    if not m:
        raise ValueError(f"{str(path)!r} is not a lesson file; expected a name like 00_tour.py")
    return m.group(1)


def grade_file(path: str | Path) -> list[Result]:
    """Grade every exercise of the lesson that ``path`` (a notebook ``.py``) belongs to.

    A file that does not even load (syntax error, failing import) gets ``error`` for each
    exercise instead of crashing the grader.
    """
    lesson = lesson_of(path)
    exercises = exercises_for(lesson)
    if not exercises:
        raise ValueError(f"lesson {lesson} has no graded exercises")
    try:
        module = load_definitions(path)
    except Exception as exc:  # broken submission
        msg = f"could not load {Path(path).name}: {type(exc).__name__}: {exc}"
        return [Result(e.lesson, e.name, ERROR, msg, 0, e.points) for e in exercises]
    return [run_check(e, getattr(module, e.name, None)) for e in exercises]


def grade_folder(folder: str | Path) -> list[dict[str, Any]]:
    """Grade every ``NN_*.py`` below ``folder`` (one submission per file, any depth).

    Returns flat records: submission (relative path), lesson, name, status, points,
    max_points, message.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder at {str(folder)!r}")
    load_all()
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.rglob("[0-9][0-9]_*.py")):
        if not exercises_for(lesson_of(path)):
            continue
        for r in grade_file(path):
            rows.append({"submission": path.relative_to(folder).as_posix(), **asdict(r)})
    return rows


def format_table(results: list[Result]) -> str:
    """Plain-text table plus a score line that never claims more than public checks."""
    w = max([len(r.name) for r in results] + [8])
    lines = [f"{'exercise':<{w}}  {'status':<13} detail", "-" * (w + 40)]
    for r in results:
        lines.append(f"{r.name:<{w}}  {r.status:<13} {r.message}")
    got, total = sum(r.points for r in results), sum(r.max_points for r in results)
    done = sum(r.status == PASSED for r in results)
    lines.append(f"score {got}/{total}: public checks passed for {done} of {len(results)} exercises")
    return "\n".join(lines)


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """CSV text of :func:`grade_folder` records."""
    buf = io.StringIO()
    fields = ["submission", "lesson", "name", "status", "points", "max_points", "message"]
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def rows_to_json(rows: list[dict[str, Any]]) -> str:
    """JSON text of :func:`grade_folder` records."""
    return json.dumps(rows, indent=2)


def check(fn: Callable[..., Any], lesson: str | None = None) -> Result:
    """In-notebook self-check: run the public checks for ``fn`` (found by its name).

    Prints one line; raises AssertionError when a check fails (so a broken solution
    stops the notebook), but only reports "not yet done" for an unfinished exercise.
    """
    matches = [e for (les, name), e in load_all().items() if name == fn.__name__ and (lesson is None or les == lesson)]
    if not matches:
        raise KeyError(f"no exercise named {fn.__name__!r}; check the function name")
    if len(matches) > 1:
        raise KeyError(f"{fn.__name__!r} is an exercise of lessons {[m.lesson for m in matches]}; pass lesson=")
    r = run_check(matches[0], fn)
    print(f"[{r.lesson}] {r.name}: {r.status}" + ("" if r.status == PASSED else f" ({r.message})"))
    if r.status in (FAILED, ERROR):
        raise AssertionError(f"{r.name}: {r.message}")
    return r
