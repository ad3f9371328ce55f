"""The ``codex-lab`` command line: every sub-command lives in ``codex_lab/commands/``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from codex_lab import commands


def build_parser() -> argparse.ArgumentParser:
    """Parser with one sub-parser per command module."""
    parser = argparse.ArgumentParser(prog="codex-lab", description="codex-lab: build and measure a fast, good code LLM.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one clear line and exit 2 instead of a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"codex-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
