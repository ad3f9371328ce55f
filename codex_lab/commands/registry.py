"""codex-lab registry: list, add, promote and roll back model versions on disk."""

from __future__ import annotations

import argparse

NAME = "registry"
HELP = "model versions on disk: list | add CHECKPOINT | promote VERSION | rollback"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "add", "promote", "rollback", "verify"])
    p.add_argument("target", nargs="?", default=None, help="add: a checkpoint folder; promote/verify: a version")
    p.add_argument("--root", default="registry", help="registry folder (default ./registry)")
    p.add_argument("--note", default="", help="add: a note stored in the manifest")


def main(args: argparse.Namespace) -> int:
    from codex_lab.training.checkpoint import load_checkpoint
    from codex_lab.commands.bench import format_records
    from codex_lab.serve.registry import Registry

    reg = Registry(args.root)
    if args.action == "list":
        print(format_records(reg.table()))
    elif args.action == "add":
        if not args.target:
            raise ValueError("registry add needs a checkpoint folder")
        ck = load_checkpoint(args.target)
        print(f"added {reg.add(ck.model, ck.tokenizer, note=args.note, meta=ck.meta)} (not serving; promote it)")
    elif args.action in ("promote", "verify"):
        if not args.target:
            raise ValueError(f"registry {args.action} needs a version, e.g. v0002; see `codex-lab registry list`")
        if args.action == "promote":
            reg.promote(args.target)
            print(f"current: {reg.current()}")
        else:
            print(f"{args.target}: checksum ok ({reg.verify(args.target).sha256[:12]})")
    else:
        print(f"rolled back to {reg.rollback()}")
    return 0
