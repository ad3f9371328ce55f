"""Where one decoded token's time goes: the operator profile of a lone stream
(``codex-lab bench inference --scenarios token_profile``).

Each path decodes the same greedy tokens after the same prompt under ``torch.profiler``
(CPU activity); every operator's *self* time (its own time, children excluded, so nothing is
counted twice) is put in one category by its name (:func:`category`):

- ``matmul``: the projections and the output head (``aten::mm``, ``addmm``, ``bmm``, ... and
  the compiled graph's GEMM kernels, with the norms or activations Inductor fused into them);
- ``attention``: scaled dot-product attention, its softmax, and the paged K/V gather (compiled,
  FastDecoder's one-query attention is one fused kernel named for its softmax);
- ``sampling``: picking the token from the logits (``argmax``, ``topk``, ``sort``, ...);
- ``compiled graph``: a ``torch.compile``d region's own code outside the kernels the profiler
  names (its C++ wrapper: buffer allocation and the calls between kernels);
- ``other ops``: norms, rotary embedding, element-wise ops, cache writes, copies.

The scenario compiles with Inductor's kernel profiling on (``cpp.enable_kernel_profile``), so
each C++ kernel of a compiled graph is a profiler event of its own (``graph_0_gemm_m1n4096k256_...``,
``graph_0_cpp_fused_...``) and falls in the categories above by what it computes; without it
(:func:`op_split` on a graph compiled elsewhere) a graph is one opaque ``compiled graph`` call.

``python`` is the wall time left over: the interpreter, the framework's dispatch between
operators and the profiler's own bookkeeping, so it is inflated by profiling, and the
profiled wall time is longer than an unprofiled run's (``unprofiled_ms_per_token`` gives that
too, measured in the same run). The shares, not the absolute times, are the result. A path's
time includes its prompt's prefill (eager on FastDecoder, the ``aten::mm`` calls there), spread
over the generated tokens.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.nn.model import CodexModel

CATEGORIES = ("matmul", "attention", "sampling", "compiled graph", "other ops")
_MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_weight_int8pack_mm", "aten::mv",
           "aten::dot", "mkldnn::", "aten::_mkldnn")
_ATTENTION = ("scaled_dot_product", "aten::_softmax", "aten::softmax", "aten::index_select", "aten::gather",
              "aten::index", "attention")
_SAMPLING = ("aten::argmax", "aten::topk", "aten::sort", "aten::multinomial", "aten::cumsum", "aten::max",
             "aten::exponential_", "aten::argsort")
_COMPILED = ("Torch-Compiled Region", "CompiledFunction", "inductor", "CompiledFxGraph", "## Call CompiledFxGraph")


def category(name: str) -> str:
    """The category of an operator (or recorded region) by its profiler name; Dynamo's guard
    checks before a compiled call count as ``python`` (framework overhead, not an operator)."""
    if name.startswith("TorchDynamo"):
        return "python"
    if name.startswith("aoti_torch_cpu_"):  # an ATen op called from a compiled graph's C++ wrapper
        name = "aten::" + name[len("aoti_torch_cpu_"):]
    if name.startswith("graph_") and "_cpp_" in name:  # one C++ kernel of a compiled graph (kernel profiling)
        if "gemm" in name:
            return "matmul"
        if any(k in name for k in ("argmax", "topk", "sort")):
            return "sampling"
        if any(k in name for k in ("softmax", "attention")):
            return "attention"
        return "other ops"
    if any(k in name for k in _COMPILED):
        return "compiled graph"
    if name.startswith(_MATMUL):
        return "matmul"
    if name.startswith("aten::index_put"):  # the K/V cache write, not attention
        return "other ops"
    if any(k in name for k in _ATTENTION):
        return "attention"
    if name.startswith(_SAMPLING):
        return "sampling"
    return "other ops"


def op_split(run: Callable[[], int], tokens: int) -> dict[str, Any]:
    """Profile ``run()`` (which decodes ``tokens`` tokens and returns how many it made) and split
    its wall time per token (ms) into :data:`CATEGORIES` by operator self time, plus ``python``
    (the rest of the wall time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        made = run()
        wall = time.perf_counter() - t0
    if made != tokens:
        raise RuntimeError(f"the profiled run made {made} tokens, expected {tokens}")
    ms = {c: 0.0 for c in (*CATEGORIES, "python")}
    names: dict[str, float] = {}
    for ev in prof.key_averages():
        # self time excludes children: each microsecond is counted once, in the innermost operator
        self_ms = ev.self_cpu_time_total / 1000.0
        ms[category(ev.key)] += self_ms
        names[ev.key] = names.get(ev.key, 0.0) + self_ms
    per = {c: v / tokens for c, v in ms.items() if c != "python"}
    # python = wall - every operator's self time (+ Dynamo's guards): interpreter, dispatch, profiler bookkeeping
    python = max(0.0, 1000.0 * wall / tokens - sum(per.values()))
    top = sorted(names.items(), key=lambda kv: -kv[1])[:5]
    return {"profiled_ms_per_token": 1000.0 * wall / tokens, "ms_per_token": {**per, "python": python},
            "top_ops": [[k, v / tokens] for k, v in top]}


def bench_token_profile(model: CodexModel, tok: CodeTokenizer, *, new_tokens: int = 64, prompt_len: int = 128,
                        slots: int = 8, compile: bool = True, rounds: int = 3) -> list[dict[str, Any]]:
    """Rows ``fast_decode_eager``, ``fast_decode`` (compiled) and ``engine_solo`` (the serving
    engine's one-row compiled step, what ``codex-lab serve`` runs for a lone request): the
    profiled split per token (:func:`op_split`) and the unprofiled ms per token (median of
    ``rounds``, in the same run). ``compile=False`` runs every path eagerly (tests). Graphs are
    compiled with their usual options plus Inductor's kernel profiling, so the split sees inside
    them (each kernel records itself: one check per kernel call when no profiler runs, in the
    unprofiled rounds too)."""
    from codex_lab.infer.engine.loop import Engine
    from codex_lab.infer.compile_options import decode_compile_options
    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.infer.engine.runner.options import served_step_options
    from codex_lab.infer.sampling import SamplingParams
    from codex_lab.measure.peer_llamacpp import corpus_prompts
    from codex_lab.serve.compiled import compiled_engine

    model = model.eval()
    prompt = corpus_prompts(tok, [prompt_len])[prompt_len]
    n = new_tokens
    eager = FastDecoder(model, max_len=prompt_len + n, compile=False)
    # FastDecoder's options (frozen weights, the C++ GEMM template) and each kernel a profiler event
    profiled = {"cpp.enable_kernel_profile": True}
    device = next(model.parameters()).device
    options = {**(decode_compile_options(None, "inductor", None, device) or {}), **profiled}
    fast = FastDecoder(model, max_len=prompt_len + n, compile=compile, options=options if compile else None)
    if compile:
        eng = compiled_engine(model, tok, max_batch_size=slots, inductor_options=profiled)
    else:
        eng = Engine(model, tok, max_batch_size=slots, compile=True, compile_backend="eager",
                     step_options={**served_step_options(slots), "solo": True})
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    def engine_run() -> int:
        eng.submit(prompt, params)
        return len(eng.run_until_done()[0].output_ids)

    paths: dict[str, Callable[[], int]] = {
        "fast_decode_eager": lambda: len(eager.generate(prompt, n)[0]),
        "fast_decode": lambda: len(fast.generate(prompt, n)[0]),
        "engine_solo": engine_run,
    }
    rows = []
    with torch.no_grad():
        ref = eager.generate(prompt, n)[0]
        same = list(fast.generate(prompt, n)[0]) == list(ref)
        engine_run()  # warm-up: compiles, then waits for the background compile of every bucket
        if compile and eng.fast_step is not None and not eng.fast_step.ready.wait(900):
            raise RuntimeError("the engine's step took over 900 s to compile")
        eng.submit(prompt, params)
        same &= list(eng.run_until_done()[0].output_ids) == list(ref)
        plain: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(rounds):  # interleaved: load from other processes falls on every path alike
            for k, fn in paths.items():
                t0 = time.perf_counter()
                fn()
                plain[k].append(1000.0 * (time.perf_counter() - t0) / n)
        for k, fn in paths.items():
            split = op_split(fn, n)
            rows.append({"scenario": "token_profile", "impl": k, "prompt_len": prompt_len, "new_tokens": n,
                         "rounds": rounds, "unprofiled_ms_per_token": statistics.median(plain[k]),
                         "same_tokens": same, **split,
                         # flat copies, for the README's recorded figures
                         "matmul_ms_per_token": split["ms_per_token"]["matmul"],
                         "attention_ms_per_token": split["ms_per_token"]["attention"],
                         "graph_ms_per_token": split["ms_per_token"]["compiled graph"],
                         "python_ms_per_token": split["ms_per_token"]["python"]})
    return rows


def profile_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of the split per token (ms and share of the profiled time)."""
    names = {"fast_decode_eager": "FastDecoder, eager", "fast_decode": "FastDecoder, compiled",
             "engine_solo": "serving engine, one-row compiled step"}
    cols = (*CATEGORIES, "python")
    out = ["| path | unprofiled ms/token | profiled ms/token | " + " | ".join(cols) + " |",
           "|---" * (len(cols) + 3) + "|"]
    for r in rows:
        tot = r["profiled_ms_per_token"]
        cells = [f"{r['ms_per_token'][c]:.2f} ({r['ms_per_token'][c] / tot:.0%})" for c in cols]
        out.append(f"| {names.get(r['impl'], r['impl'])} | {r['unprofiled_ms_per_token']:.2f} | {tot:.2f} | "
                   + " | ".join(cells) + " |")
    out.append("")
    for r in rows:  # the largest single entries (hashed graph names shortened)
        tops = ", ".join(f"`{name.split(' ##')[0][:40]}` {ms:.2f} ms" for name, ms in r.get("top_ops", [])[:3])
        out.append(f"- top operators, {names.get(r['impl'], r['impl'])}: {tops} per token")
    return out


__all__ = ["CATEGORIES", "bench_token_profile", "category", "op_split", "profile_lines"]
