"""One exercise check run on one function: statuses, :class:`Result`, :func:`run_check`.

Shared by the in-notebook ``check``, the in-process grader and the sandboxed grader child
(:mod:`codex_lab.course.grade_runner`); see :mod:`codex_lab.course.grading` for the statuses.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from codex_lab.course.checks import PUBLIC, Exercise, recording
from codex_lab.course.forbid import ForbiddenCall, blocked, message, package_origin

PASSED, PARTIAL, NOT_DONE, FAILED, ERROR, MISSING = "passed", "partial", "not yet done", "failed", "error", "missing"
SUBMISSION_SUFFIXES = (".py", ".ipynb")


@dataclass
class Result:
    """Outcome of one exercise check (public or hidden) on one submission."""

    lesson: str
    name: str
    status: str
    message: str
    points: int
    max_points: int
    visibility: str = PUBLIC


def _where(exc: BaseException) -> str:
    remote = getattr(exc, "codex_lab_where", None)  # raised in the submission's process: its own line
    if remote is not None:
        return str(remote)
    tb = traceback.extract_tb(exc.__traceback__)
    return f" (line {tb[-1].lineno})" if tb else ""


def run_check(ex: Exercise, fn: Callable[..., Any] | None) -> Result:
    """Run one exercise's check on ``fn``: points from its ``case`` blocks, the forbidden
    package functions blocked for the learner's code, the package's own functions refused."""

    def res(status: str, msg: str, pts: int = 0) -> Result:
        return Result(ex.lesson, ex.name, status, msg, pts, ex.points, ex.visibility)

    if fn is None:
        return res(MISSING, f"no function named {ex.name!r}")
    origin = package_origin(fn)
    if origin is not None:
        return res(FAILED, message(origin))
    exc: BaseException | None = None
    with recording() as log:
        try:
            with blocked(ex.forbid, ex.check):
                ex.check(fn)
        except (Exception, SystemExit) as e:  # KeyboardInterrupt passes: the person at the keyboard wants out
            exc = e
    if log.declared > ex.points:
        return res(ERROR, f"check defect: its cases declare {log.declared} points, the exercise has {ex.points}")
    earned = log.earned + (ex.points - log.declared if exc is None and not log.failures else 0)
    notes = list(log.failures)
    status = PASSED
    if isinstance(exc, NotImplementedError):
        status = NOT_DONE
        notes.append("still raises NotImplementedError")
    elif isinstance(exc, ForbiddenCall):
        status = FAILED
        notes.append(str(exc))
    elif isinstance(exc, AssertionError):
        status = FAILED
        notes.append(str(exc) or "a check failed")
    elif isinstance(exc, SystemExit):
        status = ERROR
        notes.append(f"the function called sys.exit({exc.code!r})")
    elif exc is not None:
        status = ERROR
        notes.append(f"{type(exc).__name__}: {exc}{_where(exc)}")
    elif notes:
        status = FAILED
    if 0 < earned < ex.points:
        status = PARTIAL
    if earned == ex.points and exc is None and not notes:
        return res(PASSED, f"{ex.visibility} checks passed", earned)
    return res(status, "; ".join(notes), earned)


def lesson_of(path: str | Path) -> str:
    """Lesson number from a file name like ``03_gqa.py`` -> ``"03"``."""
    m = re.match(r"(\d\d)_", Path(path).name)
    if not m:
        raise ValueError(f"{str(path)!r} is not a lesson file; expected a name like 00_tour.py or 00_tour.ipynb")
    return m.group(1)
