"""The shipped model fine-tuned on codebench 2 and scored by execution (lesson 05's calibration).

The shipped model (4.2M parameters) fine-tuned on every family of ``--split``'s training
part pooled (valid-token loss, ``mix=size``; lesson 05's naive arm), then greedy pass@1 on
``--n`` test problems per family with the 95% bootstrap interval over problems and the
near-duplicate audit. One thread; about 1.9 CPU seconds per step on a 2-core laptop, so the
default 600 steps take ~20 CPU minutes:

    nice -n 10 python scripts/l05_calibrate_shipped.py --steps 600 --n 48 --json out.json

``--save DIR`` also writes the fine-tuned weights in float16 (half the bytes of the shipped
float32 model; the architecture and tokenizer are the shipped model's) with the run's scores
and provenance: ``--save codex_lab/assets/cb2_tuned`` makes the release baseline of lesson 07's
functional gate (:func:`codex_lab.training.checkpoint.load_codebench2_tuned`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="iid")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--n", type=int, default=48, help="test problems per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    ap.add_argument("--save", default="", help="folder for the fine-tuned float16 weights and their provenance")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import codex_lab as cl
    from codex_lab.evals import codebench2 as cb2
    from codex_lab.lessons.l05_multitask.experiments import score_model, tune_shipped_on_codebench2

    ck = cl.load_pretrained()
    t0 = time.process_time()
    problems = cb2.load_problems(args.split, "all", n=args.n, seed=args.seed)
    before = score_model(ck.model, ck.tokenizer, problems, 160)
    m = tune_shipped_on_codebench2(ck.model, ck.tokenizer, split=args.split, steps=args.steps,
                                   batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    after = score_model(m, ck.tokenizer, problems, 160)
    out = {"split": args.split, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "n": args.n,
           "seed": args.seed, "cpu_s": round(time.process_time() - t0, 1), "families": {}}
    for fam in cb2.FAMILIES:
        lo, hi = cb2.bootstrap_interval(after[fam])
        out["families"][fam] = {"untuned": sum(before[fam]) / len(before[fam]),
                                "tuned": sum(after[fam]) / len(after[fam]), "lo": lo, "hi": hi}
        print(f"{args.split} {fam:<10} untuned {out['families'][fam]['untuned']:.3f}  fine-tuned "
              f"{out['families'][fam]['tuned']:.3f} [{lo:.3f}, {hi:.3f}] ({args.n} problems)")
    out["audit"] = cb2.split_audit(args.split, problems).line()
    print(out["audit"], f"\nCPU {out['cpu_s']} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.save:
        from codex_lab.reference import provenance
        from codex_lab.training.checkpoint import save_tuned_weights

        cmd = (f"python scripts/l05_calibrate_shipped.py --split {args.split} --steps {args.steps} --batch-size "
               f"{args.batch_size} --lr {args.lr:g} --n {args.n} --seed {args.seed} --save {args.save}")
        meta = {**out, "provenance": provenance(cmd, out["cpu_s"], "calibration (CPU seconds, one thread)")}
        print("written:", save_tuned_weights(args.save, m, meta))


if __name__ == "__main__":
    main()
