"""Lesson 05's reference run at the converging sizes (``protocol_setup("converge")``: a 2-layer
width-64 model, 2,500 steps per pooled arm, 3 seeds), on one split of codebench 2 (``iid`` by
default; ``length`` and ``compose`` hold out program structure), shipped as
``codex_lab/assets/reference/l05_converge_<split>.json`` with its provenance.

    python scripts/reference_l05.py            # resumes: every finished seed is kept in the state file
    python scripts/reference_l05.py --split length
    python scripts/reference_l05.py --state F  # another state file (default scripts/reference_runs/)

One seed is one resumable unit (``codex_lab.reference.ResumableRun``): a stopped run (a session
that ends) restarts at the first unfinished seed. Within a seed the specialists and the pooled arms
run in worker processes (``codex_lab.parallel``). About 20 min of wall time on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codex_lab.lessons.l05_multitask import experiments as ex  # noqa: E402
from codex_lab.reference import ResumableRun, provenance, save_reference, shown_path  # noqa: E402
from codex_lab.parallel import unit_workers  # noqa: E402
from codex_lab.runtime import use_compute_threads  # noqa: E402

SPLITS = ("iid", "length", "compose")


def run_seed(setup: ex.Setup, seed: int) -> dict:
    """One seed of every arm: pass per problem, held-out curves, final validation losses (JSON)."""
    res = ex.run_experiment(dataclasses.replace(setup, seeds=(seed,)))
    return {"scores": {a: v[0] for a, v in res.scores.items()},
            "curves": {a: [list(p) for p in v[0]] for a, v in res.curves.items()},
            "final_val": {a: v[0] for a, v in res.final_val.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="iid", choices=SPLITS, help="codebench 2 split (default: iid)")
    ap.add_argument("--state", default=None, help="state file (default: scripts/reference_runs/<name>.json)")
    args = ap.parse_args()
    name = f"l05_converge_{args.split}"
    args.state = args.state or str(ROOT / "scripts" / "reference_runs" / f"{name}.json")
    setup = ex.protocol_setup("converge", args.split)
    run = ResumableRun(args.state, {"setup": dataclasses.asdict(setup)})
    with use_compute_threads():
        units = [run.run(f"seed {s}", lambda s=s: run_seed(setup, s)) for s in setup.seeds]
        print(f"seeds done: {len(units)} ({run.seconds():.0f} s of wall time in all sessions)", flush=True)
        # the machine line names the math threads of each worker process (read inside this block)
        command = "python scripts/reference_l05.py" + ("" if args.split == "iid" else f" --split {args.split}")
        prov = provenance(command, run.seconds(), "converge", commit=run.commit,
                          state_file=shown_path(args.state, ROOT),  # no home path shipped
                          workers=unit_workers(2 + len(setup.families)))
    res = ex.Results(setup)
    arms = list(units[0]["scores"])
    res.scores = {a: [u["scores"][a] for u in units] for a in arms}
    res.curves = {a: [[tuple(p) for p in u["curves"][a]] for u in units] for a in arms}
    res.final_val = {a: [u["final_val"][a] for u in units] for a in arms}
    res.problems = [ex.test_problems(setup, s) for s in setup.seeds]
    balanced = [a for a in arms if a not in ("single-task", "naive")]
    res.primary = min(balanced, key=lambda a: statistics.fmean(res.final_val[a]))
    states = res.states()
    prim = res.primary_comparison()
    data = {"setup": setup.describe(), "split": setup.split, "primary_arm": res.primary,
            "table": res.table(), "audit": res.audit_line(),
            "states": {a: s.describe() for a, s in states.items()},
            "trained": {a: s.trained for a, s in states.items()},
            "primary": {"describe": prim.describe(), "verdict": prim.verdict, "diff": prim.diff, "lo": prim.lo,
                        "hi": prim.hi},
            "secondary": [c.describe() for c in res.secondary()],
            "naive_vs_primary": res.comparison("naive", res.primary, "all").describe(),
            "curves": {a: [[list(p) for p in c] for c in cs] for a, cs in res.curves.items()}}
    path = save_reference(name, data, prov)
    print(data["table"], data["audit"], *data["states"].values(), "primary: " + data["primary"]["describe"], sep="\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
