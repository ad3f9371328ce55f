"""Execute every lesson notebook top to bottom (as a learner would) and print its wall time.

    CODEX_LAB_FAST=1 python scripts/time_notebooks.py            # fast mode, CPU
    CODEX_LAB_FAST=0 python scripts/time_notebooks.py --json t.json  # full mode (a GPU)

The README's lesson table quotes these numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    ap.add_argument("--json", default=None, help="write {notebook: seconds} here")
    ap.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds")
    args = ap.parse_args()
    paths = [Path(p) for p in args.notebooks] or sorted(Path("notebooks").glob("*.ipynb"))
    os.environ.setdefault("MPLBACKEND", "Agg")
    times: dict[str, float] = {}
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=args.timeout, resources={"metadata": {"path": str(p.parent)}}).execute()
        times[p.name] = round(time.perf_counter() - t0, 1)
        print(f"{p.name}: {times[p.name]:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=2) + "\n")


if __name__ == "__main__":
    main()
