"""``codex-lab bench inference``: KV cache, Hugging Face generate, batching, speculative decoding.

Every ratio is taken within one run on one machine. Records (flat dicts) carry
``scenario``, ``impl``, ``tokens_per_s`` and, for the engine scenarios, TTFT/TBT p50/p95
in milliseconds. The measuring functions are reused by lesson 06 and the report.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np
import torch

from codex_lab.infer.generate import compiled_forward, generate_batch_cached, generate_ids_cached
from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.engine.scheduler import Finished
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.generate import generate_ids
from codex_lab.infer.engine.runner.options import freeze_long_lived, served_step_options
from codex_lab.nn.model import CodexModel
from codex_lab.runtime import Mode, progress, seed_everything
from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.measure.models import load_model_and_tokenizer  # the bench's one loader (--hf replaces it)

NAME = "inference"
HELP = "KV cache vs none, codex_lab vs HF generate, continuous vs static batching, speculative decoding"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenarios", default="cache,hf,batching,streams,speculative",
                   help="comma-separated subset of: cache, hf, batching, streams, speculative, compile, "
                        "decode (HF generate default and static+compile vs codex_lab's fast decode), "
                        "code_edit (prompt-lookup decoding on code edits), "
                        "llama_cpp (batch-1 prefill and decode against llama.cpp on the same GGUF; --peer llama.cpp), "
                        "llama_cpp_streams (8 streams at once: the serving engine vs llama.cpp's 8 parallel sequences), "
                        "single_stream (one stream: FastDecoder vs the serving engine, with and without its one-row shape), "
                        "token_profile (one stream's time per token split into matmuls, attention, sampling, the "
                        "compiled graph, other ops and Python, under torch.profiler), "
                        "native_profile (FastDecoder and llama.cpp's llama-bench under Linux perf: CPU time per "
                        "token by function, in the same categories, for both engines)")
    p.add_argument("--peer", default=None, choices=["llama.cpp"],
                   help="run only the peer comparisons: llama.cpp (npm's node-llama-cpp prebuilt binaries; "
                        "scripts/get_llama_cpp.sh installs them) against FastDecoder at batch 1 and against the "
                        "serving engine with 8 streams at once, interleaved rounds")
    p.add_argument("--peer-precision", default="f32", choices=["f32", "q8_0"],
                   help="the batch-1 peer comparison's weights: f32 on both, or q8_0: llama.cpp on the Q8_0 GGUF "
                        "export and FastDecoder on the weight-only int8 copy (codex_lab.quantize_int8)")
    p.add_argument("--no-hf-compile", action="store_true", help="decode scenario: skip HF generate static cache + torch.compile")
    p.add_argument("--slots", type=int, default=None,
                   help="batching scenario: engine slots (default 16 fast / 8 full)")
    p.add_argument("--requests", type=int, default=None, help="requests in the batching scenario (default 16 fast / 32 full)")
    p.add_argument("--no-compile", action="store_true",
                   help="batching scenario: leave out the engine with the compiled decode step (it compiles for seconds); "
                        "speculative scenario: leave out the compiled FastDecoder; decode scenario: leave out its two "
                        "variant FastDecoders (ATen's flash attention, the int8 copy)")
    p.add_argument("--random", action="store_true", help="use a random model of the shipped shape (no checkpoint needed)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice); 1 avoids thread-sync stalls on a busy machine")
    p.add_argument("--device", default="cpu",
                   help="where the model runs (default cpu; cuda for the GPU table: decode and code_edit scenarios)")


def code_prompts(tok: CodeTokenizer, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Prompts of the given token lengths cut from held-out standard-library files."""
    from codex_lab.data.corpus import load_corpus

    texts = [t for t in load_corpus(max_files=200).texts("val") if len(t) > 4000]
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = tok.encode(texts[int(rng.integers(len(texts)))])
        start = int(rng.integers(0, max(1, len(ids) - n)))
        out.append(ids[start : start + n])
    return out


def pct_ms(xs: list[float], q: float) -> float:
    """q-th percentile of seconds ``xs``, in milliseconds (nan when empty)."""
    return float(np.percentile(xs, q) * 1000.0) if xs else float("nan")


def latency_fields(done: list[Finished], t0: float | None = None) -> dict[str, float]:
    """TTFT (from arrival, or from ``t0`` when all requests arrived then) and TBT p50/p95 in ms."""
    ttft = [(f.first_token_time - (f.arrival if t0 is None else t0)) for f in done if f.first_token_time is not None]
    tbt = [x for f in done for x in f.tbt]
    return {"ttft_p50_ms": pct_ms(ttft, 50), "ttft_p95_ms": pct_ms(ttft, 95),
            "tbt_p50_ms": pct_ms(tbt, 50), "tbt_p95_ms": pct_ms(tbt, 95)}


# ----------------------------------------------------------------------------- scenarios
def bench_cache(model: CodexModel, prompt_lens: list[int], new_tokens: int, repeats: int = 2) -> list[dict[str, Any]]:
    """Decode tokens/s with no cache, the concatenating cache and the static cache, timed in
    ``repeats`` interleaved rounds (:func:`codex_lab.runtime.interleaved_times`) after one
    warm-up call each that also asserts the same tokens.

    Records (flat): tokens_per_s and ms_per_token of the median round, rounds, and
    for the cached impls vs_no_cache_median / _lo / _hi: the per-round speed-up over no cache.
    """
    from codex_lab.runtime import interleaved_times
    from codex_lab.stats import timing_ratio

    rows = []
    for n in prompt_lens:
        prompt = torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        impls = {
            "no_cache": lambda: generate_ids(model, prompt, max_new_tokens=new_tokens),
            "dynamic_cache": lambda: generate_ids_cached(model, prompt, max_new_tokens=new_tokens, cache="dynamic"),
            "static_cache": lambda: generate_ids_cached(model, prompt, max_new_tokens=new_tokens, cache="static"),
        }
        outs = {impl: fn()[0] for impl, fn in impls.items()}  # warm-up
        assert outs["static_cache"] == outs["no_cache"] == outs["dynamic_cache"], "cached != uncached tokens"
        wall, _ = interleaved_times(impls, max(2, repeats))
        for impl, ms in wall.items():
            med = float(np.median(ms))
            row = {"scenario": "cache", "impl": impl, "prompt_len": n, "new_tokens": new_tokens,
                   "tokens_per_s": new_tokens * 1000.0 / med, "ms_per_token": med / new_tokens, "rounds": len(ms)}
            if impl != "no_cache":
                rel = timing_ratio(wall["no_cache"], ms)
                row.update(vs_no_cache_median=rel.speedup, vs_no_cache_lo=rel.lo, vs_no_cache_hi=rel.hi)
            rows.append(row)
    return rows


def bench_hf(model: CodexModel, prompt_len: int, new_tokens: int) -> list[dict[str, Any]]:
    """codex_lab (static cache) vs Hugging Face ``generate`` on the same weights, batch 1, greedy."""
    from codex_lab.hf.llama import to_hf

    hf = to_hf(model).eval()
    prompt = torch.randint(0, model.cfg.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))

    def run_hf() -> list[int]:
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return out[0, prompt_len:].tolist()

    def run_ours() -> list[int]:
        return generate_ids_cached(model, prompt[0].tolist(), max_new_tokens=new_tokens)[0]

    rows, outs = [], {}
    for impl, fn in (("hf_generate", run_hf), ("codex_lab_static_cache", run_ours)):
        with torch.no_grad():
            fn()  # warm-up
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                outs[impl] = fn()
                times.append(time.perf_counter() - t0)
        dt = float(np.median(times))
        rows.append({"scenario": "hf", "impl": impl, "prompt_len": prompt_len, "new_tokens": new_tokens,
                     "tokens_per_s": new_tokens / dt})
    same = outs["hf_generate"] == outs["codex_lab_static_cache"]
    for r in rows:
        r["same_tokens"] = same
    return rows


def mixed_requests(tok: CodeTokenizer, n: int, seed: int = 0, max_prompt: int = 200, max_new: int = 64) -> list[tuple[list[int], int]]:
    """``n`` (prompt ids, max_tokens) pairs of mixed lengths (prompts 8..max_prompt, outputs 8..max_new)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(8, max_prompt + 1, n).tolist()
    outs = rng.integers(8, max_new + 1, n).tolist()
    return list(zip(code_prompts(tok, lens, seed), outs))


def run_engine(model: CodexModel, tok: CodeTokenizer, reqs: list[tuple[list[int], int]], *, max_batch_size: int,
               static: bool = False, compile: bool = False) -> tuple[list[Finished], float, Engine]:
    """Serve every request (all arriving at t0); return finished requests, wall seconds, engine.

    ``static``: admit ``max_batch_size`` requests, and the next group only when the whole
    group has finished (static batching; slots of early finishers idle). Greedy, no end-of-text
    stop (``max_tokens`` decides each length), so all impls generate the same tokens.
    ``compile``: the engine's compiled fixed-shape decode step, every bucket compiled before
    the clock starts (its seconds are in ``eng.fast_step.compile_s``), then
    :func:`~codex_lab.infer.engine.runner.options.freeze_long_lived`, as ``codex-lab serve`` does.
    """
    # the compiled step as `codex-lab serve` runs it (prompts as rows of the step, 48-token smallest bucket)
    eng = Engine(model, tok, max_batch_size=max_batch_size, compile=compile,
                 step_options=served_step_options(max_batch_size) if compile else None)
    if eng.fast_step is not None:
        eng.fast_step.warmup()
        # as `codex-lab serve` does once its graphs are built: the ~550k objects the compiler
        # left would otherwise cost a full garbage collection of ~0.4 s inside the timed run
        freeze_long_lived()
    done: list[Finished] = []
    t0 = eng.clock()
    if static:
        for i in range(0, len(reqs), max_batch_size):
            for p, m in reqs[i : i + max_batch_size]:
                eng.submit(p, SamplingParams(max_tokens=m, ignore_eos=True))
            done += eng.run_until_done()
    else:
        for p, m in reqs:
            eng.submit(p, SamplingParams(max_tokens=m, ignore_eos=True))
        done = eng.run_until_done()
    wall = eng.clock() - t0
    for f in done:  # all requests arrived at t0: queueing counts in TTFT
        f.arrival = t0
    return done, wall, eng


def bench_batching(model: CodexModel, tok: CodeTokenizer, n_requests: int, batch: int = 8, *, compile: bool = False,
                   rounds: int = 1) -> tuple[list[dict[str, Any]], dict[str, list[Finished]]]:
    """Continuous vs static batching vs one at a time on ``n_requests`` mixed-length requests;
    ``compile`` adds continuous batching with the engine's compiled decode step (same tokens).

    ``rounds``: each implementation runs once per round, the rounds interleaved and the order
    rotated from round to round, so a machine whose speed drifts moves all alike; ``tokens_per_s`` is the median round's, with the
    slowest and fastest (``tokens_per_s_lo`` / ``_hi``) and, for batching, the per-round ratio
    over one at a time (``vs_one_median`` / ``_lo`` / ``_hi``). Latencies are the last round's."""
    reqs = mixed_requests(tok, n_requests)
    impls: list[tuple[str, dict[str, Any]]] = [
        ("one_at_a_time", dict(max_batch_size=1)), ("static_batching", dict(max_batch_size=batch, static=True)),
        ("continuous_batching", dict(max_batch_size=batch))]
    if compile:
        impls.append(("continuous_batching_compiled", dict(max_batch_size=batch, compile=True)))
    speed: dict[str, list[float]] = {impl: [] for impl, _ in impls}
    rows_by: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[Finished]] = {}
    for r in range(rounds):
        # the order rotates from round to round: no implementation always runs first (a cold cache) or last
        for impl, kw in impls[r % len(impls):] + impls[: r % len(impls)]:
            done, wall, eng = run_engine(model, tok, reqs, **kw)
            n_tok = sum(len(f.output_ids) for f in done)
            speed[impl].append(n_tok / wall)
            row = {"scenario": "batching", "impl": impl, "requests": len(reqs), "max_batch_size": kw["max_batch_size"],
                   "wall_s": wall, "steps": eng.steps, **latency_fields(done)}
            if eng.fast_step is not None:
                fast = eng.fast_step
                first = rows_by.get(impl, {})  # the compile happened in the first round
                row.update(compiled=fast.compiled, buckets=sorted(fast.compile_s), mixed_buckets=sorted(fast.mixed_compile_s),
                           compile_s=first.get("compile_s", sum(fast.compile_s.values()) + sum(fast.mixed_compile_s.values())),
                           recompiles=fast.recompiles, compile_error=fast.compile_error)
            rows_by[impl], runs[impl] = row, done
    # per request, not as a set: request i's tokens must be one-at-a-time's request i's (a set would
    # let two requests' outputs swap unnoticed)
    ref = {f.rid: tuple(f.output_ids) for f in runs["one_at_a_time"]}
    rows = []
    for impl, _ in impls:
        got = {f.rid: tuple(f.output_ids) for f in runs[impl]}
        bad = sorted(r for r in ref if got.get(r) != ref[r])
        assert not bad and len(got) == len(ref), f"{impl}: requests {bad[:5]} differ from one-at-a-time"
        # ratio per round = tokens/s of this impl / tokens/s of one at a time in the same round
        ratio = [a / b for a, b in zip(speed[impl], speed["one_at_a_time"])]
        rows.append({**rows_by[impl], "rounds": rounds, "tokens_per_s": float(np.median(speed[impl])),
                     "tokens_per_s_lo": min(speed[impl]), "tokens_per_s_hi": max(speed[impl]),
                     "vs_one_median": float(np.median(ratio)), "vs_one_lo": min(ratio), "vs_one_hi": max(ratio),
                     "same_tokens": True})
        if impl == "continuous_batching_compiled":  # the same, over the eager engine
            eager = [a / b for a, b in zip(speed[impl], speed["continuous_batching"])]
            rows[-1].update(vs_eager_median=float(np.median(eager)), vs_eager_lo=min(eager), vs_eager_hi=max(eager))
    return rows, runs


def bench_streams(model: CodexModel, tok: CodeTokenizer, n_requests: int, streams: int = 4,
                  prompt_len: int = 128, new_tokens: int = 64, max_prefill_tokens: int | None = None,
                  ) -> tuple[list[dict[str, Any]], list[Finished]]:
    """``streams`` concurrent clients, each sending its next request when the last one ends
    (optionally with chunked prefill of ``max_prefill_tokens`` per step)."""
    reqs = [(p, new_tokens) for p in code_prompts(tok, [prompt_len] * n_requests, seed=3)]
    eng = Engine(model, tok, max_batch_size=streams, max_prefill_tokens=max_prefill_tokens)
    todo = list(reqs)
    for _ in range(min(streams, len(todo))):
        p, m = todo.pop(0)
        eng.submit(p, SamplingParams(max_tokens=m, ignore_eos=True))
    done: list[Finished] = []
    t0 = eng.clock()
    while eng.has_work():
        for f in eng.step():
            done.append(f)
            if todo:
                p, m = todo.pop(0)
                eng.submit(p, SamplingParams(max_tokens=m, ignore_eos=True))
    wall = eng.clock() - t0
    n_tok = sum(len(f.output_ids) for f in done)
    impl = "continuous_batching" + (f"_chunked{max_prefill_tokens}" if max_prefill_tokens else "")
    row = {"scenario": f"streams{streams}", "impl": impl, "requests": len(done), "prompt_len": prompt_len,
           "new_tokens": new_tokens, "tokens_per_s": n_tok / wall, **latency_fields(done)}
    return [row], done


def bench_speculative(model: CodexModel, tok: CodeTokenizer, n_per_type: int, new_tokens: int, *, rounds: int = 5,
                      fast_decoder: bool = True) -> list[dict[str, Any]]:
    """Speculative decoding with the shipped distilled draft (:func:`codex_lab.lessons.l06_inference.draft.load_draft`):
    acceptance per prompt type, the costs c and v, gamma chosen by the formula, and the measured
    speed ratio over plain eager decoding and the compiled FastDecoder in interleaved rounds
    (:func:`codex_lab.lessons.l06_inference.spec_scenarios.bench_speculative`)."""
    from codex_lab.lessons.l06_inference.draft import load_draft
    from codex_lab.lessons.l06_inference.spec_scenarios import bench_speculative as run_spec

    return run_spec(model, tok, load_draft(model), n_per_type=n_per_type, new_tokens=new_tokens, rounds=rounds,
                    fast_decoder=fast_decoder)


def bench_compile(model: CodexModel, batch: int = 4, prompt_len: int = 64, new_tokens: int = 32) -> list[dict[str, Any]]:
    """Eager vs ``torch.compile`` decode (opt-in: compiling takes tens of seconds on CPU)."""
    prompts = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(2))
    rows = []
    fwd = compiled_forward(model)
    for impl, f in (("eager", None), ("torch_compile", fwd)):
        t_first = time.perf_counter()
        ref = generate_batch_cached(model, prompts, max_new_tokens=new_tokens, forward=f)  # warm-up / compile
        t_first = time.perf_counter() - t_first
        t0 = time.perf_counter()
        out = generate_batch_cached(model, prompts, max_new_tokens=new_tokens, forward=f)
        dt = time.perf_counter() - t0
        rows.append({"scenario": "compile", "impl": impl, "batch": batch, "tokens_per_s": batch * new_tokens / dt,
                     "first_call_s": t_first, "same_tokens": bool(torch.equal(out, ref))})
    return rows


def _peer(model: CodexModel, tok: CodeTokenizer, threads: int | None, mode: Mode,
          precision: str = "f32") -> list[dict[str, Any]]:
    from codex_lab.measure.peer_llamacpp import bench_llama_cpp

    # 128- and 512-token prompts, 128 new tokens; rounds interleaved (5 fast, 11 full)
    return bench_llama_cpp(model, tok, prompt_lens=(128, 512), new_tokens=128, rounds=mode.pick(fast=5, full=11),
                           threads=threads, precision=precision)


def _single_stream(model: CodexModel, tok: CodeTokenizer, compile: bool, mode: Mode) -> list[dict[str, Any]]:
    from codex_lab.measure.single_stream import bench_single_stream

    return bench_single_stream(model, tok, slots=8, new_tokens=128, rounds=mode.pick(fast=5, full=11), compile=compile)


def _peer_streams(model: CodexModel, tok: CodeTokenizer, threads: int | None, mode: Mode) -> list[dict[str, Any]]:
    from codex_lab.measure.peer_llamacpp import bench_llama_cpp_streams

    # 8 streams of 128-token prompts, 128 new tokens each; rounds interleaved (5 fast, 11 full)
    return bench_llama_cpp_streams(model, tok, streams=8, prompt_len=128, new_tokens=128,
                                   rounds=mode.pick(fast=5, full=11), threads=threads)


def _token_profile(model: CodexModel, tok: CodeTokenizer, compile: bool, mode: Mode) -> list[dict[str, Any]]:
    from codex_lab.measure.token_profile import bench_token_profile

    return bench_token_profile(model, tok, new_tokens=mode.pick(fast=64, full=128), slots=8, compile=compile,
                               rounds=mode.pick(fast=3, full=5))


def _native_profile(model: CodexModel, tok: CodeTokenizer, random: bool, mode: Mode) -> list[dict[str, Any]]:
    from codex_lab.measure.native_profile import bench_native_profile

    # 40 x 128 tokens after a 128-token prompt per run, 2 interleaved runs of each engine (3 full)
    return bench_native_profile(model, tok, prompt_len=128, new_tokens=128, reps=40, rounds=mode.pick(fast=2, full=3),
                                random=random)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    seed_everything(0)
    torch.set_grad_enabled(False)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(getattr(args, "random", False))
    model = model.to(getattr(args, "device", None) or "cpu")
    wanted = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    if getattr(args, "peer", None) == "llama.cpp":
        wanted = {"llama_cpp", "llama_cpp_streams"}
    known = {"cache", "hf", "batching", "streams", "speculative", "compile", "decode", "code_edit", "llama_cpp",
             "llama_cpp_streams", "single_stream", "token_profile", "native_profile"}
    from codex_lab.lessons.l06_inference.fast_scenarios import bench_code_edit, bench_decode

    if wanted - known:
        raise ValueError(f"unknown scenarios {sorted(wanted - known)}; choose from {sorted(known)}")
    scenarios: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "cache": lambda: bench_cache(model, args.mode.pick(fast=[32, 256], full=[32, 256, 768]), args.mode.pick(fast=32, full=128)),
        "hf": lambda: bench_hf(model, 64, args.mode.pick(fast=32, full=128)),
        "batching": lambda: bench_batching(model, tok, args.requests or args.mode.pick(fast=16, full=32),
                                           batch=getattr(args, "slots", None) or args.mode.pick(fast=16, full=8),
                                           compile=not getattr(args, "no_compile", False),
                                           rounds=args.mode.pick(fast=3, full=5))[0],
        "streams": lambda: [r for chunk in (None, 32)
                            for r in bench_streams(model, tok, args.mode.pick(fast=8, full=32), max_prefill_tokens=chunk)[0]],
        "speculative": lambda: bench_speculative(model, tok, args.mode.pick(fast=2, standard=3, full=8), args.mode.pick(fast=32, standard=48, full=96),
                                                 rounds=args.mode.pick(fast=3, standard=5, full=11),
                                                 fast_decoder=not getattr(args, "no_compile", False)),
        "compile": lambda: bench_compile(model),
        # 11 interleaved rounds in full mode: the median ratio holds on a machine whose speed drifts
        "decode": lambda: bench_decode(model, 64, args.mode.pick(fast=64, full=128), hf_compile=not getattr(args, "no_hf_compile", False),
                                       repeats=args.mode.pick(fast=5, full=11), variants=not getattr(args, "no_compile", False)),
        # prompts built to be copied (a renamed copy) and held-out files continued (not built to be copied)
        "code_edit": lambda: [r for kind in ("edit", "continuation")
                              for r in bench_code_edit(model, tok, args.mode.pick(fast=4, full=12),
                                                       args.mode.pick(fast=64, full=128),
                                                       rounds=args.mode.pick(fast=2, full=5), kind=kind,
                                                       compiled=not getattr(args, "no_compile", False))],
        "llama_cpp": lambda: _peer(model, tok, getattr(args, "threads", None), args.mode,
                                   getattr(args, "peer_precision", "f32")),
        "llama_cpp_streams": lambda: _peer_streams(model, tok, getattr(args, "threads", None), args.mode),
        # one stream: FastDecoder vs the serving engine with and without its one-row shape (5 rounds, 11 full)
        "single_stream": lambda: _single_stream(model, tok, compile=not getattr(args, "no_compile", False), mode=args.mode),
        # one stream under torch.profiler: where a token's time goes (64 tokens, 3 unprofiled rounds)
        "token_profile": lambda: _token_profile(model, tok, compile=not getattr(args, "no_compile", False), mode=args.mode),
        # both engines under Linux perf, one thread each: CPU time per token by function
        "native_profile": lambda: _native_profile(model, tok, getattr(args, "random", False), args.mode),
    }
    rows: list[dict[str, Any]] = []
    bar = progress([s for s in scenarios if s in wanted], desc="inference bench", unit="scenario")
    for name in bar:
        bar.set_postfix_str(name)
        rows += scenarios[name]()
    for r in rows:
        r["threads"] = torch.get_num_threads()
    return rows
