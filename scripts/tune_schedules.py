"""The pre-registration check of lessons 02, 03 and 04: their standard-mode sizes and schedules
run on the *tuning* seeds (never the verdict's), and every arm's training state printed.

A quality verdict is read only on arms at a plateau, and the schedule that gets them there is
chosen before the verdict's seeds run. This script is that choice's evidence: it trains every arm
of a lesson's standard-mode protocol exactly as `codex-lab report` does, on the seeds the sizes
declare as tuning seeds, and prints the training-state rule's answer for each arm (with the
learning rate at each evaluation, so a tail at a decayed rate is not called a plateau). A
schedule is kept only when every arm is trained here.

    python scripts/tune_schedules.py --section 04        # 02, 03 or 04; --json FILE to keep the states
    python scripts/tune_schedules.py --section 04 --set lr=3e-3 --set steps=6000   # a candidate's sizes

It takes what the lesson's standard section takes on the same number of seeds (minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any


def overridden(sizes: Any, sets: list[str]) -> Any:
    """``sizes`` with each ``key=value`` of ``sets`` replaced (the value parsed as the field's
    current type: int, float or a tuple of ints); an unknown key is refused with the known ones."""
    changes: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not hasattr(sizes, key):
            known = ", ".join(f.name for f in dataclasses.fields(sizes))
            raise SystemExit(f"--set {item!r}: give key=value with a key of {type(sizes).__name__} ({known})")
        if key in ("seeds", "tuning_seeds"):
            raise SystemExit(f"--set {key}: this script runs the tuning seeds only (a verdict seed tuned would "
                             "no longer be pre-registered); change the sizes' tuning_seeds in the package instead")
        cur = getattr(sizes, key)
        if isinstance(cur, tuple):
            changes[key] = tuple(int(x) for x in text.split(",") if x)
        elif isinstance(cur, bool) or not isinstance(cur, (int, float)):
            raise SystemExit(f"--set {key}: only numbers and tuples of ints can be set here")
        else:
            changes[key] = type(cur)(float(text)) if isinstance(cur, int) else float(text)
    return dataclasses.replace(sizes, **changes)


def states_02(corpus: Any, sets: list[str]) -> tuple[str, dict[str, Any]]:
    from codex_lab.lessons.l02_sparse_attention import experiments as lr
    from codex_lab.lessons.l02_sparse_attention.geometry import arms_for, config_for

    std = config_for("standard")
    cfg = overridden(dataclasses.replace(std, seeds=std.tuning_seeds, tuning_seeds=()), sets)
    res = lr.run_arms(arms_for("standard", cfg=cfg), cfg)
    loop = lr.recall_loop(cfg)
    return (f"{cfg.steps} steps of {cfg.batch}, lr {loop.lr:g} after {loop.warmup} warm-up steps, cosine to "
            f"{loop.min_lr:g}; {len(cfg.seeds)} seeds", lr.arm_states(res, cfg))


def states_03(corpus: Any, sets: list[str]) -> tuple[str, dict[str, Any]]:
    from codex_lab.lessons.l03_gqa import experiments as gqa
    from codex_lab.lessons.l03_gqa.sizes import protocol_sizes
    from codex_lab.parallel import run_units

    std = protocol_sizes("standard")
    sizes = overridden(dataclasses.replace(std, seeds=std.tuning_seeds, tuning_seeds=()), sets)
    train, val, vocab = gqa.protocol_data(corpus, sizes)
    runs = run_units(gqa.run_protocol_seed, [(seed,) for seed in sizes.seeds],
                     common=dict(train_tokens=train, val_tokens=val, vocab_size=vocab, sizes=sizes),
                     names=[f"seed {seed}" for seed in sizes.seeds])
    return sizes.describe(), gqa.protocol_states(runs, sizes=sizes)


def states_04(corpus: Any, sets: list[str]) -> tuple[str, dict[str, Any]]:
    from codex_lab.lessons.l04_moe import protocol as p4
    from codex_lab.training_state import training_state

    std = p4.protocol_plan("standard")
    plan = overridden(dataclasses.replace(std, seeds=std.tuning_seeds, tuning_seeds=()), sets)
    tok, train, val = p4.protocol_data(corpus.files, plan)
    configs = p4.arm_configs(tok.vocab_size, d_model=plan.d_model, n_layer=plan.n_layer, n_head=plan.n_head,
                             n_experts=plan.n_experts, top_k=plan.top_k, expert_hidden=plan.expert_hidden,
                             max_seq_len=plan.seq_len)
    arms = (*p4.QUALITY_ARMS, *p4.BALANCE_ARMS)
    runs = p4.train_arms(configs, arms, plan.seeds, train, val, steps=plan.steps, eval_every=plan.eval_every,
                         batch_size=plan.batch_size, seq_len=plan.seq_len, lr=plan.lr, min_lr=plan.min_lr,
                         eval_batches=plan.eval_batches, eval_batch_size=plan.eval_batch_size,
                         bias_update_rate=plan.bias_update_rate, warmup=plan.warmup, flat_share=plan.flat_share)
    curves = {a: [p4.held_out_curve(r) for r in runs[a]] for a in arms}
    rates = p4.plan_rates(plan, [s for s, _ in curves[arms[0]][0]])
    return plan.describe(), {a: training_state(curves[a], higher_is_better=False, min_change=p4.MIN_CHANGE, arm=a,
                                               rates=rates) for a in arms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", required=True, choices=("02", "03", "04"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="change one of the standard sizes (repeatable): a candidate to try on the tuning seeds")
    ap.add_argument("--json", metavar="FILE", help="also write the states (and the command's duration) to FILE")
    args = ap.parse_args()
    from codex_lab.data.corpus import load_corpus

    t0 = time.perf_counter()
    geometry, states = {"02": states_02, "03": states_03, "04": states_04}[args.section](load_corpus(), args.set)
    took = time.perf_counter() - t0
    changed = f" with {', '.join(args.set)}" if args.set else ""
    print(f"lesson {args.section}, standard sizes{changed} on the tuning seeds: {geometry}")
    for st in states.values():
        print(" ", st.describe())
    trained = all(st.trained for st in states.values())
    print(f"every arm trained: {trained} ({took:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"section": args.section, "set": args.set, "geometry": geometry, "seconds": round(took, 1), "all_trained": trained,
                       "states": {k: st.describe() for k, st in states.items()}}, f, indent=1)
    return 0 if trained else 1


if __name__ == "__main__":
    sys.exit(main())
