"""codex-lab report: the main job, one section per lesson, Markdown + PNG plots."""

from __future__ import annotations

import argparse

NAME = "report"
HELP = "run every lesson's measurements and write a Markdown report with plots"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="report folder (default reports/TIMESTAMP)")
    p.add_argument("--sections", default=None, help="comma-separated section module names, e.g. l00,l02")
    p.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")
    p.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    from codex_lab.course.report import run_report

    sections = args.sections.split(",") if args.sections else None
    path = run_report(args.out, sections=sections, corpus=args.corpus, progress=not args.no_progress)
    print(f"report written: {path}")
    print(f"folder: {path.parent}")
    return 0
