"""Seconds from starting `codex-lab serve` to its first completion (README, "first answer").

    python scripts/first_answer.py [--port 8765] [--wait-compile 60]
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python scripts/first_answer.py   # a cold compiler cache

Starts the server, POSTs /v1/completions every 0.2 s until one answers 200, prints the
seconds, then (with --wait-compile) waits for the background compile and prints the
server's own lines, which say when the compiled graphs took over.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", default="8765")
    ap.add_argument("--wait-compile", type=float, default=0.0, help="seconds to keep the server up after the answer")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "codex_lab.cli", "serve", "--port", args.port]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    body = json.dumps({"model": "codex-lab-tiny", "prompt": "def add(a, b):\n", "max_tokens": 16}).encode()
    first = None
    try:
        while time.perf_counter() - t0 < 300 and proc.poll() is None:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    if r.status == 200:
                        first = time.perf_counter() - t0
                        break
            except OSError:
                time.sleep(0.2)
        print(f"first answer after {first:.1f} s" if first else "no answer within 300 s")
        time.sleep(args.wait_compile)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    print("\n".join(line for line in out.splitlines() if "INFO" not in line)[-1500:])
    return 0 if first else 1


if __name__ == "__main__":
    sys.exit(main())
