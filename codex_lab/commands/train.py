"""codex-lab train: pre-train a code model on the corpus (runs under torchrun too)."""

from __future__ import annotations

import argparse

NAME = "train"
HELP = "pre-train a model from a preset (tiny: CPU, small: one GPU); works under torchrun"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="tiny (CPU, the shipped recipe) or small (one GPU)")
    p.add_argument("--out", default=None, help="run folder (default runs/PRESET); the checkpoint goes in OUT/checkpoint")
    p.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--grad-accum", type=int, default=None, help="micro-batches of --batch-size summed into one step (default 1)")
    p.add_argument("--n-kv-head", type=int, default=None, help="key/value heads (GQA); default = n_head")
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--tokenizer", default=None, metavar="FILE",
                   help="reuse this tokenizer.json instead of training one (e.g. the shipped model's, so losses compare)")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--max-files", type=int, default=None, help="read only the first N corpus files")
    p.add_argument("--max-file-bytes", type=int, default=None,
                   help="skip (and count) corpus files larger than this many bytes (default 1000000)")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    from codex_lab.training.pretrain import preset_config, train

    tc = preset_config(
        args.preset, mode=args.mode.name, out=args.out, corpus=args.corpus, steps=args.steps, batch_size=args.batch_size,
        seq_len=args.seq_len, lr=args.lr, grad_accum=args.grad_accum, n_kv_head=args.n_kv_head, vocab_size=args.vocab_size,
        eval_every=args.eval_every, max_files=args.max_files, device=args.device, seed=args.seed,
        max_file_bytes=args.max_file_bytes, tokenizer=args.tokenizer,
    )
    r = train(tc, resume=args.resume, progress=not args.no_progress)
    import os

    if os.environ.get("RANK", "0") == "0":
        print(f"checkpoint: {r.out}")
        print(f"validation loss: {r.val_loss:.4f} nats/token  params: {r.n_params:,}  time: {r.train_time_s:.1f} s")
    return 0
