"""codex-lab bench NAME: run a benchmark; --json prints flat records for other tools."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "bench"
HELP = "run a benchmark (attention, moe, inference, ...) and print a table or --json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from codex_lab.course.benches import add_bench_arguments, discover

    sub = p.add_subparsers(dest="bench", metavar="NAME")
    for name, mod in sorted(discover().items()):
        bp = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        add_bench_arguments(bp, mod)
        bp.set_defaults(_bench=mod)


def format_records(rows: list[dict]) -> str:
    """Records as an aligned text table."""
    if not rows:
        return "(no records)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    widths = {c: max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(fmt(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    mod = getattr(args, "_bench", None)
    if mod is None:
        from codex_lab.course.benches import discover

        print("choose a benchmark: " + ", ".join(sorted(discover())), file=sys.stderr)
        return 2
    if getattr(args, "hf", None):
        from codex_lab.hf.folder import load_hf_folder

        ck = load_hf_folder(args.hf)
        mod.load_model_and_tokenizer = lambda *a, **k: (ck.model, ck.tokenizer)  # the bench's one loader
    rows = mod.run(args)
    text = json.dumps(rows, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text if args.json else format_records(rows))
    return 0
