"""What calling an ahead-of-time package costs in Python: the shipped model's FastDecoder step
called through ``torch._inductor``'s own wrapper (which reads its call specs back and flattens the
arguments on every call) against :class:`codex_lab.infer.aot_step.DirectRunner` (the tensors
straight to the loader), on the same inputs, in interleaved rounds.

    python scripts/aot_call_overhead.py [--rounds 31] [--calls 20] [--threads 1]

Prints each path's median milliseconds per call and the ratio. Interleaving the two paths round by
round keeps a machine's drift out of the ratio; run it with nothing else running. The first run
builds the package (a minute or two on 2 cores); later runs load it from the compile cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    ap.add_argument("--calls", type=int, default=20, help="calls of each path per round (default 20)")
    ap.add_argument("--threads", type=int, default=1, help="math threads (default 1)")
    args = ap.parse_args()
    if args.rounds < 1 or args.calls < 1 or args.threads < 1:
        ap.error("--rounds, --calls and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    from codex_lab.infer.aot_step import DirectRunner
    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.measure.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer()
    dec = FastDecoder(model.eval(), max_len=256, compile="aot")
    dec.prepare()
    runner = dec._aot.runner if dec._aot is not None else None
    if not isinstance(runner, DirectRunner):
        print(f"no direct runner here ({dec.compile_error or type(runner).__name__}): nothing to compare")
        return 1
    # one decode step of one token at slot 100 of the cache (the step writes that slot: idempotent)
    call = (torch.tensor([[5]]), torch.tensor([100]), *dec.k, *dec.v)
    paths = {"direct": runner, "wrapper": runner.compiled}
    times: dict[str, list[float]] = {k: [] for k in paths}
    with torch.no_grad():
        for fn in paths.values():  # warm-up
            for _ in range(args.calls):
                fn(*call)
        for _ in range(args.rounds):
            for name, fn in paths.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn(*call)
                times[name].append((time.perf_counter() - t0) / args.calls)
    med = {k: statistics.median(v) for k, v in times.items()}
    # ratio per round = wrapper time / direct time (> 1: the direct call is faster)
    per_round = statistics.median(w / d for w, d in zip(times["wrapper"], times["direct"]))
    print(f"{args.rounds} interleaved rounds of {args.calls} calls, {args.threads} math thread(s):")
    print(f"  direct to the loader: {1e3 * med['direct']:.4f} ms per call")
    print(f"  the package's wrapper: {1e3 * med['wrapper']:.4f} ms per call")
    print(f"  saved {1e6 * (med['wrapper'] - med['direct']):.1f} us per call; the wrapper takes {per_round:.3f}x "
          "the direct call's time (median of the per-round ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
