"""How long `codex-lab report --mode full` takes on this CPU: an extrapolation, stated as one.

For each section whose full mode trains models (02, 03, 04, 05, 08), one model of the section's
full-mode geometry takes ``--steps`` timed AdamW steps (forward, backward, update) on batches of
its full-mode shape, one math thread (what each worker process gets); seconds per step x the
training steps its full plan declares (every arm, seed and split), divided by the worker
processes that run side by side (``codex_lab.parallel.unit_workers``). Evaluation, generation,
data preparation and compilation are not counted, so each figure is a lower bound.

    python scripts/estimate_full_cpu.py [--steps 3] [--json] [--write]

``--write`` stores the figures, scaled to the reference machine by the matmul calibration, as
``report`` ``full/cpu`` in codex_lab/assets/timings.json with their provenance; the sections
without full-mode training (00, 01, 06, 07) keep their recorded figures.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path
from typing import Any

TIMINGS = Path(__file__).resolve().parents[1] / "codex_lab" / "assets" / "timings.json"


def plans() -> dict[str, dict[str, Any]]:
    """Per section: the model config of its full mode, the batch shape, and the training steps of its plan."""
    from codex_lab.lessons.l02_sparse_attention.geometry import arms_for, config_for
    from codex_lab.lessons.l03_gqa.sizes import PROTOCOL_SIZES
    from codex_lab.lessons.l04_moe import protocol as l04
    from codex_lab.lessons.l05_multitask import experiments as l05
    from codex_lab.lessons.l08_capstone import trade as l08
    from codex_lab.nn.config import ModelConfig

    out: dict[str, dict[str, Any]] = {}
    c2 = config_for("full")
    arms2 = arms_for("full")
    out["02"] = {"config": ModelConfig(vocab_size=512, d_model=c2.d_model, n_layer=c2.n_layer, n_head=c2.n_head,
                                       ffn_hidden=c2.ffn_hidden, max_seq_len=c2.task.seq_len),
                 "batch": (c2.batch, c2.task.seq_len),
                 "steps": len(arms2) * len(c2.seeds) * c2.steps,
                 "plan": f"{len(arms2)} arms x {len(c2.seeds)} seeds x {c2.steps} steps"}
    s3 = PROTOCOL_SIZES["full"]
    groups = (1, 2, 4, 8)
    per3 = s3.pretrain_steps + len(groups) * s3.uptrain_steps + (len(groups) - 1) * s3.pretrain_steps
    out["03"] = {"config": ModelConfig(vocab_size=s3.vocab_size, d_model=s3.d_model, n_layer=s3.n_layer,
                                       n_head=s3.n_head, max_seq_len=s3.seq_len),
                 "batch": (s3.batch_size, s3.seq_len), "steps": len(s3.seeds) * per3,
                 "plan": f"{len(s3.seeds)} seeds x (pre-training {s3.pretrain_steps} + {len(groups)} uptrainings of "
                         f"{s3.uptrain_steps} + {len(groups) - 1} from-scratch runs of {s3.pretrain_steps})"}
    p4 = l04.protocol_plan("full")
    cfg4 = l04.arm_configs(p4.vocab, d_model=p4.d_model, n_layer=p4.n_layer, n_head=p4.n_head, n_experts=p4.n_experts,
                           top_k=p4.top_k, expert_hidden=p4.expert_hidden, max_seq_len=p4.seq_len)["moe"]
    n4 = (len(l04.QUALITY_ARMS) + 2) * len(p4.seeds) * p4.steps
    out["04"] = {"config": cfg4, "batch": (p4.batch_size, p4.seq_len), "steps": n4,
                 "plan": f"{len(l04.QUALITY_ARMS)} arms x {len(p4.seeds)} seeds x {p4.steps} steps + 2 balance arms x "
                         f"{len(p4.seeds)} seeds x {p4.steps} (every arm timed as the MoE one)"}
    splits = l05.protocol_splits("full")
    st5 = l05.protocol_setup("full", split=splits[0])
    pooled = len(l05._arms(st5))
    out["05"] = {"config": ModelConfig(vocab_size=st5.vocab, d_model=st5.d_model, n_layer=st5.n_layer,
                                       n_head=st5.n_head, max_seq_len=st5.max_len),
                 "batch": (st5.batch_size, st5.max_len),
                 "steps": len(splits) * len(st5.seeds) * (1 + pooled) * st5.steps,
                 "plan": f"{len(splits)} splits x {len(st5.seeds)} seeds x (the specialists' {st5.steps} + {pooled} "
                         f"pooled arms x {st5.steps}) steps; generation-based scoring not counted"}
    s8 = l08.trade_sizes("full")
    out["08"] = {"config": ModelConfig(vocab_size=s8.vocab_size, d_model=s8.d_model, n_layer=s8.n_layer,
                                       n_head=s8.n_head, max_seq_len=s8.seq_len),
                 "batch": (s8.batch_size, s8.seq_len),
                 # the caps: the training-state rule stops each arm at its plateau, at most here (extension not counted)
                 "steps": len(s8.seeds) * (s8.pretrain_steps + len(l08.KINDS) * s8.max_steps),
                 "plan": f"{len(s8.seeds)} seeds x (pre-training {s8.pretrain_steps} + {len(l08.KINDS)} designs x "
                         f"up to {s8.max_steps}: the cap; the rule stops each arm at its plateau)"}
    return out


def seconds_per_step(cfg: Any, batch: tuple[int, int], steps: int) -> float:
    """Mean seconds of ``steps`` AdamW steps after one warm-up step (one math thread)."""
    import torch

    from codex_lab.nn.model import CodexModel

    torch.manual_seed(0)
    model = CodexModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B, T = batch
    x = torch.randint(0, cfg.vocab_size, (B, T + 1))

    def step() -> None:
        out = model(x[:, :-1], x[:, 1:])  # next-token cross-entropy over every position (ModelOutput.loss)
        loss = out.loss + out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per section (after one warm-up step)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="store the figures in codex_lab/assets/timings.json")
    args = ap.parse_args()

    import torch

    from codex_lab.parallel import unit_workers
    from codex_lab.runtime import format_seconds, speed_factor

    torch.set_num_threads(1)
    workers = unit_workers(16)
    rows = {}
    for key, p in plans().items():
        sps = seconds_per_step(p["config"], p["batch"], args.steps)
        total = sps * p["steps"] / workers
        rows[key] = {"seconds_per_step": round(sps, 4), "steps": p["steps"], "workers": workers,
                     "seconds": round(total), "plan": p["plan"], "batch": list(p["batch"])}
        if not args.json:
            print(f"{key}: {sps:.3f} s per step of {p['batch'][0]} x {p['batch'][1]} tokens x {p['steps']:,} steps "
                  f"({p['plan']}) / {workers} workers = {format_seconds(total)} (a lower bound)")
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.write:
        d = json.loads(TIMINGS.read_text())
        factor = speed_factor()  # this machine's seconds per reference-machine second
        full = d["report"]["full/cpu"]
        for key, r in rows.items():
            full[key] = round(r["seconds"] / factor)
        d["provenance"]["report full/cpu"] = (
            f"sections 02, 03, 04, 05, 08 extrapolated {date.today().isoformat()} by scripts/estimate_full_cpu.py "
            f"(seconds per AdamW step of the section's full-mode geometry, {args.steps} timed steps, one math thread, "
            f"x the training steps its full plan declares, / {workers} worker processes; evaluation, generation, "
            f"data and compilation not counted: lower bounds), scaled to the reference machine by the matmul "
            f"calibration (x{1 / factor:.2f}); 00, 01, 06, 07 estimated from size ratios, not measured")
        TIMINGS.write_text(json.dumps(d, indent=2) + "\n")
        print(f"wrote {TIMINGS}")


if __name__ == "__main__":
    main()
