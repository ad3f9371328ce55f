"""The engine `codex-lab serve` runs: continuous batching with the compiled decode step,
compiled in the background while the eager step serves (so the first answer does not wait)."""

from __future__ import annotations

from typing import Any


def compiled_engine(model: Any, tokenizer: Any, *, gemm_template: bool = True, mixed: bool = True,
                    inductor_options: dict[str, Any] | None = None, aot: bool = True, **kw: Any) -> Any:
    """An :class:`~codex_lab.infer.engine.loop.Engine` with the compiled decode step. It serves at
    once: every bucket compiles in a background thread while steps run the same padded step
    eagerly (the same tokens), and all steps switch to the graphs when the last one is built.
    The first answer does not wait for it. Prints what it did on stderr (stdout stays the
    caller's: a bench's ``--json`` rows).

    ``mixed``: arriving prompts ride in the compiled step as extra rows
    (:func:`~codex_lab.infer.engine.runner.options.served_step_options`); False prefills them eagerly beside it.

    ``gemm_template`` (default): compile with the weights frozen and Inductor's C++ GEMM template,
    as :class:`~codex_lab.infer.fast_decode.FastDecoder` does. Each shape is one graph symbolic
    in the table's length (three in all: the batch, the batch with arriving prompts, a request
    alone). Inductor's cache keeps no frozen graph, so with ``torch.compile`` they were built at
    every start (88 s in the background on 2 cores, 2026-12-03); ``aot`` keeps them. Through HTTP, 8 streams of 128 tokens went from 0.56x to 0.71x llama-server's
    tokens/s in the same run (885 and 1426 tokens/s; ``codex-lab bench --mode full serving
    --compiled --concurrency 1,8 --max-tokens 128 --peer llama.cpp``, quiet, 2026-12-03, two
    runs minutes apart; one stream, whose one-row graph had these options in both, 0.57x and
    0.55x). False:
    ATen's matmuls over unfrozen weights, one graph per block bucket, cached on disk (a restart
    has them in ~6 s); ``codex-lab serve --aten-matmuls``. The runs: ``git log -p -- docs/PROFILE.md``.

    ``aot`` (default, with ``gemm_template``, on a CPU): each of those frozen-weight graphs is an
    ahead-of-time package kept in the compile cache (:mod:`codex_lab.infer.engine.runner.aot_paged`):
    the first start builds them in a child interpreter, a restart loads them in milliseconds, so a
    restarted server is ready with its compiled step within seconds. False: ``torch.compile`` at
    every start, as before. Off when ``inductor_options`` are given (they are for ``torch.compile``).

    ``inductor_options``: more Inductor options for every graph, e.g.
    ``{"cpp.enable_kernel_profile": True}`` (each C++ kernel a profiler event: lesson 06's
    operator profile). They go with the graphs' options because the graphs compile in a thread
    of their own, and Inductor's config set in the caller's thread does not reach it.
    """
    import sys
    import time

    from codex_lab.infer.engine.loop import Engine
    from codex_lab.infer.compile_options import cpu_compile_options, decode_compile_options
    from codex_lab.infer.engine.runner.options import served_step_options

    device = next(model.parameters()).device
    kw.setdefault("step_options", served_step_options(kw.get("max_batch_size", 8), mixed=mixed))
    if aot and gemm_template and not inductor_options:
        kw["step_options"] = {**kw["step_options"], "aot": True}
    if inductor_options:  # the one-row graph's options (FastDecoder's, as by default) with these added
        solo = decode_compile_options(None, "inductor", None, device) or {}
        kw["step_options"] = {**kw["step_options"], "solo_options": {**solo, **inductor_options}}
    eng = Engine(model, tokenizer, compile=True, **kw)
    t0 = time.perf_counter()
    step = eng.fast_step
    if step.compiled:  # frozen weights, Inductor's C++ GEMM template (as FastDecoder); or ATen's matmuls
        make = decode_compile_options if gemm_template else cpu_compile_options
        opts = {**(make(None, "inductor", None, device) or {}), **(inductor_options or {})}
        if opts and (gemm_template or inductor_options):
            step.use_options(opts)

    def done(per: dict[int, float]) -> None:
        if step.compiled and step.packages:
            loaded = sum(step.aot_from_disk.values())
            print(f"{len(step.packages)} ahead-of-time graphs (one per shape, any table length; {loaded} loaded "
                  f"from the compile cache, {len(step.packages) - loaded} built) in {time.perf_counter() - t0:.1f} s: "
                  "steps now run them", file=sys.stderr, flush=True)
        elif step.compiled and step.dynamic_blocks:
            print(f"compiled {len(step.compile_plan())} graphs (one per shape, any table length) in "
                  f"{time.perf_counter() - t0:.1f} s: steps now run them", file=sys.stderr, flush=True)
        elif step.compiled:
            more = [f"{len(step.mixed_compile_s)} that also carry prompt tokens"] if step.mixed_compile_s else []
            more += [f"{len(step.solo_compile_s)} of one row, for a request alone"] if step.solo_compile_s else []
            mixed = f" (and {', '.join(more)})" if more else ""
            print(f"compiled {len(per)} decode buckets{mixed} in {time.perf_counter() - t0:.1f} s: "
                  "steps now run the compiled graphs", file=sys.stderr, flush=True)
        else:
            print(f"compiling failed, decoding eagerly: {step.compile_error}", file=sys.stderr, flush=True)

    if step.compiled:
        what = "one graph per shape, any table length" if step.dynamic_blocks else "one graph per block bucket"
        print(f"serving now with the eager decode step; compiling the fast one in the background ({what})...",
              file=sys.stderr, flush=True)
        step.warmup_background(done)
    else:
        done({})
    return eng
