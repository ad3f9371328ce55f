"""codex-lab report: the main job, one section per lesson, Markdown + PNG plots."""

from __future__ import annotations

import argparse

NAME = "report"
HELP = "run every lesson's measurements and write a Markdown report with plots"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="report folder (default reports/TIMESTAMP)")
    p.add_argument("--sections", default=None,
                   help="comma-separated lessons to run, e.g. 02,05 (also l02 or 2, or a name fragment such as moe)")
    p.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (logs, CI)")


def main(args: argparse.Namespace) -> int:
    from codex_lab.course.report import ReportInterrupted, run_report

    sections = [s for s in args.sections.split(",") if s.strip()] if args.sections else None
    try:
        path = run_report(args.out, mode=args.mode, sections=sections, corpus=args.corpus, progress=not args.no_progress)
    except ReportInterrupted as stop:
        print(f"\ninterrupted: partial report written: {stop.path} (it lists the sections that did not run)")
        return 130
    print(f"report written: {path}")
    print(f"folder: {path.parent}")
    return 0
