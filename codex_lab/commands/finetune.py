"""codex-lab finetune: multi-task fine-tuning from a checkpoint with a loss-balancing strategy."""

from __future__ import annotations

import argparse

NAME = "finetune"
HELP = "multi-task fine-tuning (completion, bugfix, testgen, docstring, translate) with balanced losses"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", default="completion,bugfix,testgen", help="comma-separated task names")
    p.add_argument("--balance", default="coba", help="sample, token, task_token, focal, dwa, uncertainty or coba")
    p.add_argument("--checkpoint", default=None, help="checkpoint folder to start from (default: the shipped tiny model)")
    p.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")
    p.add_argument("--max-file-bytes", type=int, default=1_000_000,
                   help="skip (and count) corpus files larger than this many bytes (default 1000000)")
    p.add_argument("--files-fraction", type=float, default=None, help="stable share of corpus files to build tasks from")
    p.add_argument("--val-fraction", type=float, default=0.15, help="share of functions held out for validation")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--max-len", type=int, default=None, help="longest example in tokens")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--mix", default="size", help="size (pool all examples) or uniform (task first)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generate", type=int, default=None, help="held-out examples per task to generate and score at the end (0: none)")
    p.add_argument("--out", default=None, help="folder for the fine-tuned checkpoint and results.json")
    p.add_argument("--device", default=None)
    p.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from codex_lab.training.balancing import STRATEGIES
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained, save_checkpoint
    from codex_lab.data.corpus import load_corpus
    from codex_lab.training.finetune import FinetuneConfig, finetune
    from codex_lab.infer.task_metrics import evaluate_generation
    from codex_lab.runtime import get_device
    from codex_lab.data.tasks import TASKS, build_tasks, task_files

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown tasks {bad}; choose from {','.join(TASKS)}")
    if args.balance not in STRATEGIES:
        raise ValueError(f"unknown --balance {args.balance!r}; choose one of {', '.join(sorted(STRATEGIES))}")
    device = get_device(args.device)
    pick = args.mode.pick  # the run's mode, resolved by the command line
    ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
    corpus = load_corpus(args.corpus, max_file_bytes=args.max_file_bytes)
    fraction = args.files_fraction if args.files_fraction is not None else pick(fast=0.05, full=1.0)
    taskset = build_tasks(task_files(corpus, fraction), tasks, val_fraction=args.val_fraction, max_chars=pick(fast=600, full=1200))
    print("examples per task:", json.dumps(taskset.sizes()))
    cfg = FinetuneConfig(
        tasks=tasks, balance=args.balance, mix=args.mix, seed=args.seed,
        steps=args.steps or pick(fast=20, full=600), batch_size=args.batch_size or pick(fast=8, full=16),
        lr=args.lr or pick(fast=1e-3, full=3e-4), max_len=args.max_len or pick(fast=192, full=384),
        eval_every=args.eval_every or pick(fast=5, full=25), val_per_task=pick(fast=8, full=32),
    )
    res = finetune(ck.model, ck.tokenizer, taskset, cfg, progress=not args.no_progress)
    print(res.table())
    n_gen = args.generate if args.generate is not None else pick(fast=0, full=16)
    gen = evaluate_generation(ck.model.eval(), ck.tokenizer, taskset.split("val"), n_per_task=n_gen) if n_gen > 0 else {}
    for task, metrics in gen.items():
        print(f"{task:<11} " + "  ".join(f"{k}={v:.3f}" for k, v in metrics.items()))
    if args.out:
        out = Path(args.out)
        save_checkpoint(out / "checkpoint", ck.model, ck.tokenizer, {"finetune": res.to_dict(), "generation": gen})
        (out / "results.json").write_text(json.dumps({**res.to_dict(), "generation": gen}, indent=2) + "\n")
        print(f"checkpoint and results in {out}")
    return 0
