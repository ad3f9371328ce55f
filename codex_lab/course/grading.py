"""Grading exercises: per-exercise status and points for one submission, a folder of
submissions, or a single function from inside a notebook (``check``).

Statuses: ``passed`` (every check case passed: full points), ``partial`` (some case points
earned), ``not yet done`` (the function still raises NotImplementedError), ``failed`` (a
check's assertion failed), ``error`` (the function or the file crashed, timed out, ended
the process or printed too much), ``missing`` (no function of that name).
Wording is honest: passing means the *checks* passed, nothing more.

``grade_file`` / ``grade_folder`` grade every submission in its own sandboxed run in which
the checks and the learner's code are two processes that exchange only data
(:mod:`codex_lab.course.grade_runner`; docs/INSTRUCTORS.md states the threat model); ``check``
runs in the caller's own process (the learner's notebook kernel: a self-check, not a grade).
"""

from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from codex_lab.course.checks import load_all
from codex_lab.course.outcome import ERROR, FAILED, PARTIAL, PASSED, Result, lesson_of, run_check

def grade_file(path: str | Path, hidden: str | Path | None = None, timeout_s: float = 30.0,
               folder: str | Path | None = None) -> list[Result]:
    """Grade every exercise (public, and hidden ones from ``hidden``) of the lesson that
    ``path`` (a ``.py`` percent source or an ``.ipynb``) belongs to, in a sandboxed run where
    the checks and the learner's code are two processes (see :mod:`codex_lab.course.grade_runner`).

    A file that does not even load gets ``error`` for each exercise; code that hangs, exits
    or crashes costs that exercise alone. ``timeout_s`` is the learner's time per exercise.
    ``folder``: the submissions' root in a folder run (the file must lie inside it).
    """
    from codex_lab.course.grade_runner import grade_isolated

    return grade_isolated(Path(path), hidden=hidden, timeout_s=timeout_s,
                          folder=Path(folder) if folder is not None else None)


def grade_in_process(path: str | Path) -> list[Result]:
    """Grade ``path``'s public checks in *this* process, without a sandbox: only for trusted
    files (CI holding solutions/ and exercises/ to their checks). Use :func:`grade_file` for submissions."""
    from codex_lab.course.checks import exercises_for
    from codex_lab.course.exercises import load_definitions

    exs = exercises_for(lesson_of(path))
    if not exs:
        raise ValueError(f"lesson {lesson_of(path)} has no graded exercises")
    try:
        module = load_definitions(path)
    except Exception as exc:  # broken file
        msg = f"could not load {Path(path).name}: {type(exc).__name__}: {exc}"
        return [Result(e.lesson, e.name, ERROR, msg, 0, e.points, e.visibility) for e in exs]
    return [run_check(e, getattr(module, e.name, None)) for e in exs]


def grade_folder(folder: str | Path, hidden: str | Path | None = None, timeout_s: float = 30.0,
                 jobs: int | None = None) -> list[dict[str, Any]]:
    """Grade every ``NN_*.py`` / ``NN_*.ipynb`` below ``folder`` (one submission per file, any depth).

    Returns flat records: submission (relative path), lesson, name, status, points,
    max_points, visibility, message. Submissions are graded ``jobs`` at a time.

    Isolation between submissions: each run gets a copy of its own submission's text and
    nothing else (the folder is hidden; no other run's files are mounted in its sandbox),
    so no submission can read a sibling or another student's output. That needs the
    namespace sandbox: where only plain mode is available (no boundary: every file of the
    user is readable), a folder run is refused unless ``CODEX_LAB_SANDBOX=plain`` accepts
    that explicitly, and then runs one submission at a time.
    """
    import os

    from codex_lab.course.grade_runner import exercises_of, submissions_in
    from codex_lab.sandbox import isolation_mode

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder at {str(folder)!r}")
    if isolation_mode() == "plain":
        if os.environ.get("CODEX_LAB_SANDBOX") != "plain":
            raise RuntimeError("grading a folder of submissions needs the namespace sandbox (root, or unprivileged user "
                               "namespaces): without it every submission can read every other one. Set "
                               "CODEX_LAB_SANDBOX=plain to grade anyway, one at a time, without that isolation")
        jobs = 1
    load_all()
    paths = [p for p in submissions_in(folder) if exercises_of(lesson_of(p), hidden)]
    if jobs is None:
        jobs = max(1, min(4, os.cpu_count() or 1))
    from codex_lab.course.grade_runner import exercises_of as _exs

    def one(p: Path) -> list[Result]:
        try:
            return grade_file(p, hidden=hidden, timeout_s=timeout_s, folder=folder)
        except Exception as exc:  # noqa: BLE001 - one broken submission never stops the run: it gets error rows
            msg = f"not graded: {type(exc).__name__}: {exc}"[:500]
            return [Result(e.lesson, e.name, ERROR, msg, 0, e.points, e.visibility) for e in _exs(lesson_of(p), hidden)]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        graded = list(pool.map(one, paths))
    rows: list[dict[str, Any]] = []
    for path, results in zip(paths, graded):
        for r in results:
            rows.append({"submission": path.relative_to(folder).as_posix(), **asdict(r)})
    return rows


def summary(results: list[Result]) -> str:
    """``score 5/7 (public 4/5, hidden 1/2)``: points and their maximum, split by visibility."""
    got, total = sum(r.points for r in results), sum(r.max_points for r in results)
    parts = []
    for vis in ("public", "hidden"):
        rs = [r for r in results if r.visibility == vis]
        if rs:
            parts.append(f"{vis} {sum(r.points for r in rs)}/{sum(r.max_points for r in rs)}")
    return f"score {got}/{total} ({', '.join(parts)})"


def format_table(results: list[Result]) -> str:
    """Plain-text table with points, plus a score line that never claims more than the checks."""
    w = max([len(r.name) for r in results] + [8])
    lines = [f"{'exercise':<{w}}  {'check':<6} {'points':>6}  {'status':<13} detail", "-" * (w + 50)]
    for r in results:
        lines.append(f"{r.name:<{w}}  {r.visibility:<6} {f'{r.points}/{r.max_points}':>6}  {r.status:<13} {r.message}")
    done = sum(r.status == PASSED for r in results)
    lines.append(f"{summary(results)}: checks passed for {done} of {len(results)} exercise checks")
    return "\n".join(lines)


FIELDS = ["submission", "lesson", "name", "status", "points", "max_points", "visibility", "message"]


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """CSV text of :func:`grade_folder` records."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
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
    pts = f" {r.points}/{r.max_points} points"
    print(f"[{r.lesson}] {r.name}: {r.status}{pts}" + ("" if r.status == PASSED else f" ({r.message})"))
    if r.status in (FAILED, ERROR, PARTIAL):
        raise AssertionError(f"{r.name}: {r.message}")
    return r
