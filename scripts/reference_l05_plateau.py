"""Lesson 05's reference run of the claim as the article states it: one pretrained base,
fine-tuned as five single-task specialists, naive multi-task and two balanced arms, each arm to
its own plateau (``codex_lab.lessons.l05_multitask.pretrained``, ``setup_for("reference")``),
on one codebench 2 split; shipped as ``codex_lab/assets/reference/l05_plateau_<split>.json``.

    python scripts/reference_l05_plateau.py            # resumes: every finished arm is kept
    python scripts/reference_l05_plateau.py --split length
    python scripts/reference_l05_plateau.py --state F  # another state file
    python scripts/reference_l05_plateau.py --carry OLD  # keep the arms of a run made before `confirm`

``--carry``: an earlier state file of the same sizes, run before an arm the budget-extension
check finds still learning was sent back to training (``PlateauSetup.confirm``). Its arms whose
extension did not improve them by ``min_change`` (or that had none) would have run exactly as
they did, so they are kept, marked with the state file and commit they came from; any other arm
is trained again.

One arm (all its seeds, in lockstep) is one resumable unit (``codex_lab.reference.ResumableRun``),
stored as it finishes; two arms run at a time in worker processes, a freed worker taking the next. The base is pretrained once and cached.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codex_lab.lessons.l05_multitask import pretrained as pt  # noqa: E402
from codex_lab.lessons.l05_multitask import finetune_setup as fs
from codex_lab.parallel import run_units, unit_workers  # noqa: E402
from codex_lab.reference import ResumableRun, provenance, save_reference, shown_path  # noqa: E402
from codex_lab.runtime import use_compute_threads  # noqa: E402

SPLITS = ("iid", "length", "compose")
# the resumable state, in the repository: committed when a session ends mid-run so the next machine
# resumes it (a session's processes end with it, and a fresh machine has an empty home)
RUNS_DIR = ROOT / "scripts" / "reference_runs"


def summary(res: pt.PlateauResults) -> dict:
    """The verdicts and figures the report prints, computed by the lesson's own functions."""
    size, gain, verdict = res.size_claim()
    small = res.small_claim()
    mde = pt.detectable_effect(res.setup)
    return {"setup": res.setup.describe(), "split": res.setup.split, "primary_arm": res.primary,
            "states": {a: s.describe() for a, s in res.states().items()},
            "compute": res.compute_lines(),
            # None: no extension ran (an arm compared at its best checkpoint, or not trained)
            "extension_confirmed": {a: (None if not r["extension_steps"] else
                                        bool(math.isfinite(r["extension_change"])
                                             and r["extension_change"] < res.setup.min_change))
                                    for a, r in res.arms.items()},
            "size": {"describe": size.describe(), "verdict": verdict, "gain": gain,
                     "position": pt.size_position(gain), "diff": size.diff, "lo": size.lo, "hi": size.hi},
            "small": {"describe": small.describe(), "verdict": small.verdict, "diff": small.diff, "lo": small.lo,
                      "hi": small.hi},
            "detectable": mde}


def carry(run: ResumableRun, old_path: str, setup: fs.PlateauSetup) -> list[str]:
    """Store in ``run`` the arms of the state file ``old_path`` (same sizes, run without
    ``confirm``) that ``confirm`` would not have trained on; returns their names."""
    old = json.loads(Path(old_path).expanduser().read_text())
    have = dict(old["config"]["setup"])
    want = json.loads(json.dumps(dataclasses.asdict(setup)))
    if have.get("confirm", False) or {k: v for k, v in want.items() if k != "confirm"} != have:
        raise SystemExit(f"--carry {old_path}: that run had other sizes ({have}); only a run of these sizes "
                         "made before `confirm` can be carried")
    kept = []
    for arm, unit in old["units"].items():
        r = unit["result"]
        change = r.get("extension_change", math.nan)
        if arm in run.done or (r["extension_steps"] and math.isfinite(change) and change >= setup.min_change):
            continue  # confirm would have trained this arm on: it runs again
        src = str(Path(old_path).expanduser()).replace(str(Path.home()), "~", 1)
        run.store(arm, {**r, "false_stops": [], "carried_from": {"state": src, "commit": old.get("commit")}},
                  unit["seconds"])
        kept.append(arm)
    return kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="iid", choices=SPLITS, help="codebench 2 split (default: iid)")
    ap.add_argument("--state", default=None, help="state file (default: scripts/reference_runs/<name>_<base>.json)")
    ap.add_argument("--mode", default="reference", help="sizes (setup_for): reference (default; the shipped base), reference-corpus "
                    "(the small corpus base) or fast (a smoke run)")
    ap.add_argument("--carry", default=None, help="an earlier state file of these sizes, run before `confirm`: its arms "
                    "that confirm would not have trained on are kept (see the module docstring)")
    args = ap.parse_args()
    name = f"l05_plateau_{args.split}" + ("" if args.mode == "reference" else f"_{args.mode}")
    setup = fs.setup_for(args.mode, args.split)
    # the state file names the base: a run from another base never resumes this one
    # in the repository: committed when a session ends mid-run, so the next machine resumes it
    args.state = args.state or str(RUNS_DIR / f"{name}_{setup.base}.json")
    run = ResumableRun(args.state, {"setup": dataclasses.asdict(setup)})
    names = [f"single-task:{f}" for f in setup.families] + ["naive", *setup.balanced]
    if args.carry:
        print(f"carried from {args.carry}: {', '.join(carry(run, args.carry, setup)) or 'no arm'}", flush=True)
    print(f"smallest effect this design can detect: {pt.detectable_effect(setup)}", flush=True)
    with use_compute_threads():
        tok, ts = pt.tokenizer(setup), pt.sized_taskset(setup)
        pt.pretrain_base(setup, tok, log=lambda s: print(s, flush=True))
        jobs = unit_workers(2)
        pending = [a for a in names if a not in run.done]
        t0 = time.perf_counter()

        def store(i: int, o: dict) -> None:  # as each arm finishes: a worker that frees up takes the next arm
            run.store(pending[i], o, o["cpu_s"])
            print(f"{pending[i]}: {o['state']}; {o['steps']} steps, {o['cpu_s']:.0f} CPU s "
                  f"({time.perf_counter() - t0:.0f} s into this session)", flush=True)

        if pending:
            run_units(pt.run_arm, [(setup, a) for a in pending], common=dict(tok=tok, ts=ts), names=pending, jobs=jobs,
                      on_done=store)
        command = "python scripts/reference_l05_plateau.py" + ("" if args.split == "iid" else f" --split {args.split}")
        from codex_lab.reference import _commit

        # commit: the code that trained the units; verdicts_commit: the code that judged them now
        # (a rerun of this script over a finished state file re-judges without retraining)
        prov = provenance(command, run.seconds(), "reference", commit=run.commit, verdicts_commit=_commit(),
                          state_file=shown_path(args.state, ROOT), workers=jobs,
                          carried={a: run.done[a]["result"]["carried_from"] for a in names
                                   if "carried_from" in run.done[a]["result"]},
                          duration_note=("the shipped base is not counted" if setup.base == "shipped" else
                                         "the base's pretraining (cached) is not counted"))
    res = pt.PlateauResults(setup, {a: run.done[a]["result"] for a in names})
    data = {**summary(res), "arms": res.arms}
    path = save_reference(name, data, prov)
    print(*data["compute"], *data["states"].values(), data["size"]["describe"], data["size"]["verdict"],
          data["size"]["position"], data["small"]["describe"], sep="\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
