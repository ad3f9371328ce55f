"""Rewrite the figures the README and the notebook headers state from the one record
(codex_lab/assets/timings.json), after re-timing (scripts/time_notebooks.py --json, a report's
timings.json) or a full test run.

    python scripts/update_figures.py                      # rewrite from the record, re-pair notebooks
    python scripts/update_figures.py --suite --ci-seconds 900   # also count the tests (pytest --collect-only)
    python scripts/update_figures.py --check              # list disagreements and hand-typed figures, exit 1 if any
    python scripts/update_figures.py --bench decode runs/decode.json \
        --command "codex-lab bench --mode full inference --scenarios decode --json" --conditions "quiet, one run"
                                                          # record a bench's --json rows, rewrite its figures

Performance figures come from codex_lab/assets/bench_records.json (see codex_lab/course/bench_figures.py).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codex_lab.course import bench_figures, figure_audit, figures  # noqa: E402


def count_tests() -> int:
    """Tests the README's test command runs (pytest's own count, nbval cells included)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    m = re.search(r"(\d+) tests? collected", out) or re.search(r"^(\d+) tests?", out, re.M)
    if m is None:
        raise SystemExit(f"could not read pytest's count from:\n{out[-2000:]}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only list disagreements (exit 1 if any)")
    ap.add_argument("--suite", action="store_true", help="count the tests and record the count")
    ap.add_argument("--ci-seconds", type=float, default=None, help="record the duration of a CI run")
    ap.add_argument("--bench", nargs=2, metavar=("KEY", "FILE"), help="record FILE (a bench's --json output) as KEY")
    ap.add_argument("--command", default="", help="with --bench: the command that printed FILE")
    ap.add_argument("--conditions", default="", help="with --bench: quiet or under load, one run or more")
    args = ap.parse_args()
    if args.bench:
        key, file = args.bench
        keys = sorted({f.key for f in bench_figures.BENCH_FIGURES})
        if key not in keys:
            raise SystemExit(f"unknown bench key {key!r}: the README's figures read {', '.join(keys)}")
        if not args.command or not args.conditions:
            raise SystemExit("--bench needs --command (what printed the file) and --conditions (quiet or under load)")
        rows = json.loads(Path(file).read_text(encoding="utf-8"))
        bench_figures.record_bench(key, rows, args.command, args.conditions, date.today().isoformat())
    if args.check:
        bad = figures.mismatches()
        loose = [f"not read from any record: {u}" for u in figure_audit.unchecked()]
        print("\n".join(bad + loose) or "every figure agrees with the record; none is hand-typed")
        return 1 if bad or loose else 0
    rec = figures.record()
    if args.suite or args.ci_seconds is not None:
        suite = rec.setdefault("suite", {})
        if args.suite:
            suite["tests"] = count_tests()
        if args.ci_seconds is not None:
            suite["ci_s"] = round(args.ci_seconds)
        suite["measured"] = date.today().isoformat()
        figures.RECORD.write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
    changed = figures.apply(rec)
    for rel in changed:
        if rel.endswith(".py") and rel.startswith("notebooks/"):
            subprocess.run([sys.executable, "-m", "jupytext", "--sync", str(ROOT / rel)], check=True,
                           capture_output=True)
    print("rewrote: " + (", ".join(changed) or "nothing (already in agreement)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
