"""codex-lab grade: score a lesson's exercises, or a whole folder of submissions."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "grade"
HELP = "grade exercises: one notebook source (exercises/NN_topic.py) or a folder of submissions"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a lesson's .py source, or a folder graded in bulk")
    p.add_argument("--csv", default=None, help="folder mode: write the scores as CSV here")
    p.add_argument("--json", default=None, help="folder mode: write the scores as JSON here")


def main(args: argparse.Namespace) -> int:
    from codex_lab.course.grading import PASSED, format_table, grade_file, grade_folder, rows_to_csv, rows_to_json

    path = Path(args.path)
    if path.is_dir():
        rows = grade_folder(path)
        if not rows:
            raise ValueError(f"no gradable NN_topic.py files under {str(path)!r}")
        by_sub: dict[str, list[dict]] = {}
        for r in rows:
            by_sub.setdefault(r["submission"], []).append(r)
        for sub, rs in by_sub.items():
            got, tot = sum(r["points"] for r in rs), sum(r["max_points"] for r in rs)
            print(f"{sub}: {got}/{tot}  " + ", ".join(f"{r['name']}={r['status']}" for r in rs))
        if args.csv:
            Path(args.csv).write_text(rows_to_csv(rows))
        if args.json:
            Path(args.json).write_text(rows_to_json(rows))
        return 0
    results = grade_file(path)
    print(format_table(results))
    return 0 if all(r.status == PASSED for r in results) else 1
