"""The ``codex-lab`` command line: every sub-command lives in ``codex_lab/commands/``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from codex_lab import commands

# commands that run experiments: they take --mode (the global option works before any command too)
MODE_COMMANDS = ("report", "bench", "train", "finetune")
MODE_HELP = ("fast (minutes on a CPU; quality experiments too short to converge: CI's mode), standard (fast sizes, "
             "quality experiments sized to converge on a laptop) or full (the article's sizes, meant for a GPU); "
             "default: full on a CUDA GPU, standard otherwise, or CODEX_LAB_MODE=fast|standard|full")


def _add_mode(p: argparse.ArgumentParser) -> None:
    """Add --mode to a parser and to every nested sub-command parser (e.g. each bench)."""
    # SUPPRESS: a sub-parser must not overwrite a --mode given at an outer level with a default
    p.add_argument("--mode", choices=("fast", "standard", "full"), default=argparse.SUPPRESS, help=MODE_HELP)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _add_mode(child)


def build_parser() -> argparse.ArgumentParser:
    """Parser with one sub-parser per command module."""
    parser = argparse.ArgumentParser(prog="codex-lab", description="codex-lab: build and measure a fast, good code LLM.")
    parser.add_argument("--mode", choices=("fast", "standard", "full"), default=argparse.SUPPRESS, help=MODE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        if mod.NAME in MODE_COMMANDS:
            _add_mode(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one clear line and exit 2 instead of a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    if args.command in MODE_COMMANDS:
        from codex_lab.runtime.mode import resolve_mode

        # the one place a command's mode is decided: the flag, else the environment, else the device;
        # the command gets it as args.mode (a codex_lab.runtime.Mode) and passes it to what needs a size
        try:
            args.mode = resolve_mode(getattr(args, "mode", None))
        except ValueError as exc:
            print(f"codex-lab {args.command}: error: {exc}", file=sys.stderr)
            return 2
        if args.command != "report":  # the report prints its own header
            info = args.mode
            others = "/".join(m for m in ("fast", "standard", "full") if m != info.name)
            print(f"[codex-lab {args.command}] {info.name} mode: {info.reason} (--mode {others} for the others)",
                  file=sys.stderr, flush=True)
    from codex_lab.sandbox import SandboxUnavailable

    try:
        return int(args._main(args) or 0)
    except (FileNotFoundError, ValueError, KeyError, SandboxUnavailable) as exc:
        # one line naming the problem and the fix (a sandbox that cannot start here included)
        print(f"codex-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
