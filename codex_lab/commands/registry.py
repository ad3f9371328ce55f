"""codex-lab registry: list, add, promote, roll back, verify and repair model versions on disk."""

from __future__ import annotations

import argparse

NAME = "registry"
HELP = "model versions on disk: list | add CHECKPOINT | promote VERSION | rollback | verify VERSION | repair"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "add", "promote", "rollback", "verify", "repair"])
    p.add_argument("target", nargs="?", default=None, help="add: a checkpoint folder; promote/verify: a version")
    p.add_argument("--root", default="registry", help="registry folder (default ./registry)")
    p.add_argument("--note", default="", help="add: a note stored in the manifest")


def main(args: argparse.Namespace) -> int:
    from codex_lab.training.checkpoint import load_checkpoint
    from codex_lab.commands.bench import format_records
    from codex_lab.errors import InputError
    from codex_lab.serve.registry_files import check_version
    from codex_lab.serve.registry import Registry

    reg = Registry(args.root)
    if args.action == "list":
        print(format_records(reg.table()))
    elif args.action == "add":
        if not args.target:
            raise InputError("registry add needs a checkpoint folder, e.g. `codex-lab registry add runs/x/checkpoint`")
        ck = load_checkpoint(args.target)  # validates every file: one line naming a broken one
        print(f"added {reg.add(ck.model, ck.tokenizer, note=args.note, meta=ck.meta)} (not serving; promote it)")
    elif args.action in ("promote", "verify"):
        if not args.target:
            raise InputError(f"registry {args.action} needs a version, e.g. v0002; see `codex-lab registry list`")
        check_version(args.target)
        if args.action == "promote":
            reg.promote(args.target)
            print(f"current: {reg.current()}")
        else:
            print(f"{args.target}: checksum ok ({reg.verify(args.target).sha256[:12]})")
    elif args.action == "repair":
        st = reg.repair()
        print(f"state rebuilt: current {st['current']}, history {st['history']}")
    else:
        print(f"rolled back to {reg.rollback()}")
    return 0
