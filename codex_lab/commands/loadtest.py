"""codex-lab loadtest: concurrent streaming clients against a local server (loopback only)."""

from __future__ import annotations

import argparse
import json

NAME = "loadtest"
HELP = "load a local server with streaming clients: TTFT/TBT p50/p95/p99, SLO shares, throughput, errors"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server URL (loopback only)")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent streaming clients")
    p.add_argument("--requests", type=int, default=32, help="most requests in total")
    p.add_argument("--duration", type=float, default=30.0, help="most seconds of issuing requests")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--disconnect-prob", type=float, default=0.0, help="share of streams closed early by the client")
    p.add_argument("--malformed", type=int, default=0, help="also send this many malformed requests afterwards")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    from codex_lab.serve.loadtest import check_url, malformed_storm, run_load

    url = check_url(args.url)
    rep = run_load(url, concurrency=args.concurrency, requests=args.requests, duration_s=args.duration,
                   max_tokens=args.max_tokens, disconnect_prob=args.disconnect_prob, seed=args.seed)
    s = rep.summary()
    if args.malformed:
        s["malformed"] = malformed_storm(url, args.malformed)
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        for k, v in s.items():
            print(f"{k:>24}: {v}")
    return 0
