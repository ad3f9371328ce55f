"""Execute every lesson notebook top to bottom (as a learner would) and print its wall time;
optionally record the times in the package's table of expected times.

    CODEX_LAB_FAST=1 python scripts/time_notebooks.py                   # fast mode, CPU
    CODEX_LAB_FAST=0 python scripts/time_notebooks.py --json t.json     # full mode (a GPU)
    python scripts/time_notebooks.py --record                          # also write them to
                                                                       # codex_lab/assets/timings.json
    python scripts/time_notebooks.py --record-report reports/X/timings.json   # a report's section times

``codex_lab/assets/timings.json`` is what ``lesson_header`` and ``codex-lab report`` scale (by a
matmul calibration) into the expected times they print. Record on an idle machine: the
calibration of the recording machine is stored with the times. The README's lesson table
quotes the notebook numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

TIMINGS = Path(__file__).resolve().parents[1] / "codex_lab" / "assets" / "timings.json"


def record(kind: str, mode: str, device: str, seconds: dict[str, float], source: str, matmul_ms: float) -> None:
    """Merge ``seconds`` (lesson key -> s) into the shipped table under ``kind`` and ``mode/device``.

    CPU times are stored relative to the reference machine: seconds x (reference matmul ms /
    this machine's), so one reference calibration serves every row."""
    table: dict[str, Any] = json.loads(TIMINGS.read_text())
    key = f"{mode}/{'cuda' if device == 'cuda' else 'cpu'}"
    if device != "cuda":
        # stored = measured x reference_matmul / this machine's matmul (the inverse of runtime.speed_factor)
        f = table["reference"]["matmul_ms"] / matmul_ms
        seconds = {k: v * f for k, v in seconds.items()}
    row = table[kind].setdefault(key, {})
    row.update({k: round(v, 1) for k, v in seconds.items()})
    table[kind][key] = dict(sorted(row.items()))
    table["provenance"][f"{kind} {key}"] = source
    tmp = TIMINGS.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(tmp, TIMINGS)
    print(f"recorded {kind} {key}: {row} in {TIMINGS}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    ap.add_argument("--json", default=None, help="write {notebook: seconds} here")
    ap.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds")
    ap.add_argument("--record", action="store_true", help="write the times into codex_lab/assets/timings.json")
    ap.add_argument("--record-report", default=None, metavar="TIMINGS_JSON",
                    help="record a report folder's timings.json (section seconds) instead of timing notebooks")
    args = ap.parse_args()

    from codex_lab.runtime import calibrate_ms, resolve_mode

    if args.record_report:
        rep = json.loads(Path(args.record_report).read_text())
        by_mode: dict[str, dict[str, float]] = {}
        for key, s in rep["sections"].items():
            by_mode.setdefault(s["mode"], {})[key] = s["seconds"]
        for mode, secs in by_mode.items():
            record("report", mode, rep["device"], secs, f"measured by codex-lab report on {rep['device']} "
                   f"({time.strftime('%Y-%m-%d')})", rep["matmul_ms"])
        return

    import nbformat
    from nbclient import NotebookClient

    paths = [Path(p) for p in args.notebooks] or sorted(Path("notebooks").glob("*.ipynb"))
    os.environ.setdefault("MPLBACKEND", "Agg")
    info = resolve_mode()  # the kernels resolve the same mode from the same environment
    print(f"{info.name} mode ({info.reason})", flush=True)
    times: dict[str, float] = {}
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=args.timeout, resources={"metadata": {"path": str(p.parent)}}).execute()
        times[p.name] = round(time.perf_counter() - t0, 1)
        print(f"{p.name}: {times[p.name]:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=2) + "\n")
    if args.record:
        record("lesson", info.name, info.device, {name[:2]: s for name, s in times.items()},
               f"measured with scripts/time_notebooks.py ({time.strftime('%Y-%m-%d')})", calibrate_ms())


if __name__ == "__main__":
    main()
