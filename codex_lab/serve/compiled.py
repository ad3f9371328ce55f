"""The engine `codex-lab serve` runs: continuous batching with the compiled decode step,
compiled in the background while the eager step serves (so the first answer does not wait)."""

from __future__ import annotations

from typing import Any


def compiled_engine(model: Any, tokenizer: Any, **kw: Any) -> Any:
    """An :class:`~codex_lab.infer.engine.Engine` with the compiled decode step. It serves at
    once: every bucket compiles in a background thread while steps run the same padded step
    eagerly (the same tokens), and all steps switch to the graphs when the last one is built
    (18-22 s after start on 2 quiet CPU cores with Inductor's cache warm, 2026-12-02; the first
    answer does not wait for it). Prints what it did on stderr (stdout stays the caller's: a
    bench's ``--json`` rows)."""
    import sys
    import time

    from codex_lab.infer.engine import Engine

    eng = Engine(model, tokenizer, compile=True, **kw)
    t0 = time.perf_counter()
    step = eng.fast_step

    def done(per: dict[int, float]) -> None:
        if step.compiled:
            print(f"compiled {len(per)} decode buckets in {time.perf_counter() - t0:.1f} s: "
                  "steps now run the compiled graphs", file=sys.stderr, flush=True)
        else:
            print(f"compiling failed, decoding eagerly: {step.compile_error}", file=sys.stderr, flush=True)

    if step.compiled:
        print("serving now with the eager decode step; compiling the fast one in the background "
              "(one graph per block bucket)...", file=sys.stderr, flush=True)
        step.warmup_background(done)
    else:
        done({})
    return eng
