"""Time-to-ready of `codex-lab serve`, cold and then warm (a restart over the compile cache).

Starts the server twice with the same compile cache folder (CODEX_LAB_COMPILE_CACHE): the first
run compiles every decode graph into an empty folder (cold), the second loads them from it
(warm: what a restart of the same model with the same torch pays). For each run it polls
GET /health and GET /ready and prints the seconds from the command to:

- live:    the first /health answer (200, phase "starting" or later),
- loaded:  the model loaded (phase "warming", or "ready" at once),
- ready:   GET /ready 200 (the compiled graphs serve),

with the graphs compiled and the load average at the start. A benchmark, not a test: run it on
a quiet machine (the goal: ready < 15 s warm on 2 quiet cores, docs/PERFORMANCE.md) and say the load.

    python scripts/restart_time.py [--cache DIR] [--runs cold,warm] [--json] [-- extra serve flags]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_ready(cache: str, extra: list[str], timeout_s: float) -> dict:
    """One server start over ``cache``: seconds to live / loaded / ready, and what /health said."""
    port = free_port()
    env = {**os.environ, "CODEX_LAB_COMPILE_CACHE": cache}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "codex_lab.cli", "serve", "--port", str(port), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, out = f"http://127.0.0.1:{port}", {"load_at_start": round(load, 2)}
    try:
        with httpx.Client(timeout=5) as client:
            while time.perf_counter() - t0 < timeout_s:
                if proc.poll() is not None:
                    out["error"] = f"the server exited ({proc.returncode}): {proc.stderr.read()[-2000:]}"
                    break
                try:
                    h = client.get(url + "/health").json()
                except httpx.HTTPError:
                    time.sleep(0.1)
                    continue
                now = round(time.perf_counter() - t0, 2)
                out.setdefault("live_s", now)
                if h["phase"] != "starting":
                    out.setdefault("loaded_s", now)
                cache = h["compile"]["cache"]  # its folder is left out: a temporary path is no record
                out.update(phase=h["phase"], graphs=f"{h['compile']['graphs_done']}/{h['compile']['graphs_total']}",
                           cache={k: v for k, v in cache.items() if k != "dir"})
                if h["phase"] == "degraded" or client.get(url + "/ready").status_code == 200:
                    out["ready_s"] = round(time.perf_counter() - t0, 2)
                    break
                time.sleep(0.2)
            else:
                out["error"] = f"not ready within {timeout_s} s"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default=None,
                   help="compile cache folder (default: a fresh temporary one, so the first run is cold; removed after)")
    p.add_argument("--runs", default="cold,warm", help="labels of the runs, in order, over the same folder")
    p.add_argument("--timeout-s", type=float, default=900.0, help="give up on a run after this many seconds")
    p.add_argument("--json", action="store_true", help="a JSON list of the runs (one record each) instead of the table")
    p.add_argument("serve_args", nargs="*", help="extra flags for codex-lab serve (after --)")
    args = p.parse_args(argv)
    cache = args.cache or tempfile.mkdtemp(prefix="codex_lab_restart_")
    rows = []
    try:
        for label in args.runs.split(","):
            row = {"scenario": "restart", "run": label, **time_to_ready(cache, args.serve_args, args.timeout_s)}
            rows.append(row)
            if not args.json:
                print(f"{label:>5}: live {row.get('live_s', '-')} s, loaded {row.get('loaded_s', '-')} s, "
                      f"ready {row.get('ready_s', '-')} s ({row.get('phase')}, graphs {row.get('graphs')}, "
                      f"load {row['load_at_start']} on {os.cpu_count()} cores)"
                      f"{'  ' + row['error'] if 'error' in row else ''}", flush=True)
    finally:
        if args.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
    if args.json:  # what update_figures.py --bench records
        print(json.dumps(rows, indent=1))
    return 0 if all("ready_s" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
