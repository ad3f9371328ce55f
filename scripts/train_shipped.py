"""Train the shipped tiny model's successor: the same 4.2M-parameter shape (so the same
~17 MB on disk), warm-started from the shipped weights and tokenizer, with a 1024-token
context (RoPE has no learned positions, so the context grows without new parameters) and
fill-in-the-middle training at rate 0.5 (codex_lab.data.fim: PSM and SPM, half each).

    OMP_NUM_THREADS=2 nice -n 10 python scripts/train_shipped.py --out runs/tiny_fim --threads 2
    OMP_NUM_THREADS=2 nice -n 10 python scripts/train_shipped.py --out runs/tiny_fim --threads 2 --resume   # after a stop
    codex-lab eval heldout runs/tiny_fim/checkpoint        # compare with the shipped model
    python scripts/ship_checkpoint.py runs/tiny_fim/checkpoint --prompts 32 --command "..."

The source checkpoint is copied to ``OUT/init`` first, so a later re-ship of the assets does
not change what a resumed run started from.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from codex_lab.training.checkpoint import pretrained_path
from codex_lab.training.pretrain import preset_config, train

# 1600 steps of 8 x 1024 tokens (13.1M tokens, ~2.7x what the shipped model saw): what 2 CPU cores
# give in about 75 minutes at nice 10 (2.7 s/step quiet); a third of the from-scratch peak (3e-3), since the weights start
# trained, decaying to a third of the shipped run's floor
RECIPE = dict(seq_len=1024, batch_size=8, steps=1600, lr=1e-3, min_lr=1e-4, warmup=50, eval_every=100,
              eval_batches=4, fim_rate=0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/tiny_fim", help="run folder; the checkpoint goes in OUT/checkpoint")
    ap.add_argument("--init-from", default=None, help="checkpoint folder to warm-start from (default: the shipped one)")
    ap.add_argument("--steps", type=int, default=RECIPE["steps"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared machine)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    init = out / "init"
    if not args.resume and not init.exists():
        shutil.copytree(Path(args.init_from) if args.init_from else pretrained_path(), init)
    tc = preset_config("tiny", mode="full", out=str(out), init_from=str(init), **{**RECIPE, "steps": args.steps})
    r = train(tc, resume=args.resume, progress=True)
    print(f"checkpoint: {r.out}  validation loss {r.val_loss:.4f} nats/token at seq_len {tc.seq_len}  "
          f"time {r.train_time_s:.0f} s")


if __name__ == "__main__":
    main()
