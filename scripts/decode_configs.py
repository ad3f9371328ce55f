"""FastDecoder's tokens/s under four compile configurations (docs/PROFILE.md, "the weights
were never frozen"): what each of freezing and Inductor's C++ GEMM template is worth.

    python scripts/decode_configs.py [--threads 2] [--repeats 9]

Each configuration runs in its own process (freezing is a global flag while dynamo traces),
on the shipped model, 64-token prompt, 128 new tokens; prints the median tokens/s and
whether the tokens equal the eager step's. A quiet machine only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CONFIGS = {
    "inputs (freezing not on while tracing)": {"freezing": True, "cpp_wrapper": True},
    "frozen, ATen matmuls": {"freezing": True, "cpp_wrapper": True, "_trace_frozen": True},
    "frozen + C++ GEMM template (the default)": None,
    "frozen + C++ GEMM template, Python wrapper": {"freezing": True, "max_autotune": True,
                                                   "max_autotune_gemm_backends": "CPP", "autotune_fallback_to_aten": True},
}


def one(name: str, threads: int, repeats: int) -> dict:
    import torch

    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.training.checkpoint import load_pretrained

    torch.set_num_threads(threads)
    model = load_pretrained().model
    ids = torch.randint(0, model.cfg.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = FastDecoder(model, max_len=192, compile=False).generate(ids, 128)
    opts = CONFIGS[name]
    trace_frozen = bool(opts and opts.pop("_trace_frozen", False))  # freezing on while dynamo traces
    dec = FastDecoder(model, max_len=192, options=opts)
    if opts is not None and not trace_frozen and "max_autotune" not in opts:
        dec.options = {}  # _traced() then leaves the global flag off: the weights stay graph inputs
    t0 = time.perf_counter()
    same = dec.generate(ids, 128) == ref
    first = time.perf_counter() - t0
    for _ in range(3):
        dec.generate(ids, 128)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dec.generate(ids, 128)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"config": name, "tokens_per_s": 128 / ts[len(ts) // 2], "first_call_s": first, "same_tokens": same,
            "compile_error": dec.compile_error, "threads": threads}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.threads, args.repeats)))
        return 0
    for name in CONFIGS:
        out = subprocess.run([sys.executable, __file__, "--one", name, "--threads", str(args.threads),
                              "--repeats", str(args.repeats)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name}: failed\n{out.stderr[-800:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:46s} {r['tokens_per_s']:7.0f} tokens/s  first call {r['first_call_s']:5.1f} s  "
              f"same tokens {r['same_tokens']}  {r['compile_error'][:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
