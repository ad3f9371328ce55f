"""codex-lab grade: score a lesson's exercises, or a whole folder of submissions.

Exit status: 0 file mode every exercise passed / folder mode every submission graded;
1 file mode: graded, not every exercise passed; 2 bad input (no such file or folder, no
gradable NN_topic file, a bad --hidden folder).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

NAME = "grade"
HELP = "grade exercises: one submission (NN_topic.py or .ipynb) or a folder of submissions, each in a sandbox"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a submission (NN_topic.py or NN_topic.ipynb), or a folder graded in bulk")
    p.add_argument("--csv", default=None, help="write the scores as CSV here (one row per submission and check)")
    p.add_argument("--json", default=None, help="write the scores as JSON here")
    p.add_argument("--gradescope", default=None, help="write Gradescope's autograder results.json here")
    p.add_argument("--hidden", default=None, help="folder of the instructor's hidden checks (*.py, same @exercise API)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per exercise check (default 30)")
    p.add_argument("--jobs", type=int, default=None, help="submissions graded at once (default: CPU count, at most 4)")


def _write(path: str, text: str) -> None:
    """Atomic write: a reader never sees half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, target)


def main(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from codex_lab.course.gradescope import results_json
    from codex_lab.course.outcome import PASSED
    from codex_lab.course.grading import format_table, grade_file, grade_folder, rows_to_csv, rows_to_json
    from codex_lab.errors import InputError

    if args.timeout <= 0 or args.timeout != args.timeout:
        raise InputError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.jobs is not None and args.jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {args.jobs}")
    if args.hidden is not None and not Path(args.hidden).is_dir():
        raise InputError(f"no hidden-check folder at {args.hidden!r}; pass a folder of *.py checks")
    path = Path(args.path)
    if path.is_dir():
        rows = grade_folder(path, hidden=args.hidden, timeout_s=args.timeout, jobs=args.jobs)
        if not rows:
            raise InputError(f"no gradable NN_topic.py or NN_topic.ipynb files under {str(path)!r}")
        by_sub: dict[str, list[dict]] = {}
        for r in rows:
            by_sub.setdefault(r["submission"], []).append(r)
        for sub, rs in by_sub.items():
            got, tot = sum(r["points"] for r in rs), sum(r["max_points"] for r in rs)
            print(f"{sub}: {got}/{tot}  " + ", ".join(
                f"{r['name']}{'(hidden)' if r['visibility'] == 'hidden' else ''}={r['status']} {r['points']}/{r['max_points']}"
                for r in rs))
        code = 0
    elif path.is_file():
        results = grade_file(path, hidden=args.hidden, timeout_s=args.timeout)
        print(format_table(results))
        rows = [{"submission": path.name, **asdict(r)} for r in results]
        code = 0 if all(r.status == PASSED for r in results) else 1
    else:
        raise InputError(f"no file or folder at {str(path)!r}")
    if args.csv:
        _write(args.csv, rows_to_csv(rows))
    if args.json:
        _write(args.json, rows_to_json(rows))
    if args.gradescope:
        _write(args.gradescope, results_json(rows))
    return code
