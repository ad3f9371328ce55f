"""codex-lab exercises: generate exercises/ from solutions/, or check it has not drifted."""

from __future__ import annotations

import argparse

NAME = "exercises"
HELP = "regenerate exercises/ from solutions/ (or --check for drift, as CI does)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", default="generate", choices=["generate"], help="generate (default)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    p.add_argument("--solutions", default="solutions")
    p.add_argument("--exercises", default="exercises")


def main(args: argparse.Namespace) -> int:
    from codex_lab.course.exercises import generate_exercises

    changed = generate_exercises(args.solutions, args.exercises, check=args.check)
    if args.check:
        if changed:
            print("exercises/ is out of date with solutions/; run `codex-lab exercises generate`:")
            for p in changed:
                print(f"  {p}")
            return 1
        print("exercises/ is up to date")
        return 0
    print(f"wrote {len(changed)} file(s)" + "".join(f"\n  {p}" for p in changed))
    return 0
