"""llama.cpp as a peer: the same model, exported to GGUF, decoded by llama.cpp and by codex_lab's
FastDecoder in one run with interleaved rounds (``codex-lab bench inference --peer llama.cpp``).

llama.cpp comes from the prebuilt binaries that npm's ``node-llama-cpp`` ships
(``scripts/get_llama_cpp.sh``: minutes, into ``~/.cache/codex_lab/llama.cpp``); nothing here
downloads. A small Node.js program (``PEER_JS``, written next to the install) loads the GGUF
once and answers one JSON job per line on stdin: prefill a prompt of token ids, or prefill it
and decode ``n`` tokens greedily (temperature 0), timing both inside the process
(``process.hrtime``), so the pipe costs nothing measured.

What is timed, the same way on both sides (batch 1, float32 weights, the same math threads):
- prefill: the whole prompt in one call, seconds -> prompt tokens / s;
- generation: prefill then ``n`` greedy tokens; decode tokens / s = (n - 1) / (generation -
  prefill): the ``n - 1`` one-token forwards after the first token (which the prefill's
  logits give on both sides).
The token ids are compared: ``same_tokens`` and the length of the common prefix (float32 on
two code bases: an argmax between two nearly equal logits can differ).

The prebuilt binaries are generic builds. Where ``scripts/build_llama_cpp.sh`` has built
llama.cpp from source for this CPU, its ``llama-bench`` runs in the same rounds too (row
``llama_cpp_native``): prefill of the prompt from an empty cache (``-p L -n 0``), and ``n``
greedy tokens after the prompt's ``L`` tokens in the cache (``-p 0 -n n -d L``), each once per
round after its own warm-up (finding and running the native binaries:
:mod:`~codex_lab.measure.llama_native`). It prints speeds, not tokens (``same_tokens`` None); on
2026-12-03 it decoded 2-3x faster than the prebuilt build on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.nn.int8 import quantize_int8
from codex_lab.nn.model import CodexModel
from codex_lab.runtime.timing import round_order
from codex_lab.measure.llama_native import find_llama_bench, home_relative, install_dir, llama_bench

INSTALL_HINT = ("llama.cpp is not installed: run `bash scripts/get_llama_cpp.sh` (npm's node-llama-cpp prebuilt "
                "binaries into ~/.cache/codex_lab/llama.cpp, a few minutes; needs Node.js >= 18 and npm)")

# each engine's KV-cache precision as the peer bench runs it: codex_lab's caches hold the model's
# float32; llama.cpp's contexts keep an f16 cache unless told otherwise (llama-bench's rows read
# theirs from its own JSON record, type_k / type_v); the weights are float32 on both (the F32 GGUF)
# the weights' format per --precision: (codex_lab's, llama.cpp's)
PRECISIONS = {"f32": ("f32", "f32"), "q8_0": ("int8, a scale per output row", "Q8_0, a scale per 32 weights")}
KV_CACHE = {"llama_cpp": "f16 (node-llama-cpp's default)", "llama_cpp_native": "f16 (llama-bench's default)"}

PEER_JS = r"""
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {createInterface} from "node:readline";
const [modelPath, threads, contextSize, sequences = "1"] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
// contextSize is per sequence (node-llama-cpp gives each of the context's sequences its own cells)
const ctx = await model.createContext({contextSize: Number(contextSize), batchSize: Number(contextSize),
                                       threads: Number(threads), sequences: Number(sequences)});
const seqs = Array.from({length: Number(sequences)}, () => ctx.getSequence());
const seq = seqs[0];
async function greedy(s, p, n) {  // prefill all but the last prompt token, then n greedy tokens
  await s.evaluateWithoutGeneratingNewTokens(p.slice(0, -1));
  const tokens = [];
  for await (const t of s.evaluate([p[p.length - 1]], {temperature: 0})) {
    tokens.push(t);
    if (tokens.length >= n) break;
  }
  return tokens;
}
const secs = (t0) => Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({ready: true, llama_cpp_release: llama.llamaCppRelease?.release ?? null,
                            build_type: llama.buildType ?? null, gpu: llama.gpu, threads: ctx.currentThreads ?? Number(threads)}));
for await (const line of createInterface({input: process.stdin})) {
  const job = JSON.parse(line);
  if (job.prompts) {  // one stream per sequence, all at once: node-llama-cpp batches their tokens
    await Promise.all(seqs.map((s) => s.clearHistory()));
    const t0 = process.hrtime.bigint();
    const tokens = await Promise.all(job.prompts.map((p, i) => greedy(seqs[i], p, job.new_tokens)));
    console.log(JSON.stringify({streams_s: secs(t0), tokens}));
    continue;
  }
  await seq.clearHistory();
  const p = job.prompt;
  if (!job.new_tokens) {
    const t0 = process.hrtime.bigint();
    await seq.evaluateWithoutGeneratingNewTokens(p);
    console.log(JSON.stringify({prefill_s: secs(t0)}));
    continue;
  }
  const t0 = process.hrtime.bigint();
  const tokens = await greedy(seq, p, job.new_tokens);
  console.log(JSON.stringify({generate_s: secs(t0), tokens}));
}
"""


def find_node_llama_cpp() -> Path | None:
    """The installed ``node-llama-cpp`` package folder, or None (then :data:`INSTALL_HINT`)."""
    pkg = install_dir() / "node_modules" / "node-llama-cpp" / "package.json"
    return pkg.parent if pkg.is_file() and shutil.which("node") else None


class LlamaCppPeer:
    """One Node.js process holding ``gguf`` in llama.cpp; :meth:`prefill`, :meth:`generate` and
    :meth:`streams` send one job each. ``context``: tokens per sequence; ``sequences``: how many
    streams one context serves at once (llama.cpp's parallel slots). Use as a context manager
    (the process ends on exit)."""

    def __init__(self, gguf: str | Path, *, threads: int, context: int, sequences: int = 1) -> None:
        if sequences < 1:
            raise ValueError(f"sequences must be >= 1, got {sequences}")
        self.sequences = sequences
        root = find_node_llama_cpp()
        if root is None:
            raise FileNotFoundError(INSTALL_HINT)
        script = install_dir() / "codex_lab_peer.mjs"  # beside node_modules, so `import "node-llama-cpp"` resolves
        if not script.is_file() or script.read_text() != PEER_JS:
            script.write_text(PEER_JS)
        self.proc = subprocess.Popen(["node", str(script), str(gguf), str(threads), str(context), str(sequences)],
                                     text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, "NODE_LLAMA_CPP_SKIP_DOWNLOAD": "true"})
        self.info = self._read()
        self.info["node_llama_cpp"] = json.loads((root / "package.json").read_text())["version"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"the llama.cpp peer stopped: {err.strip()[-800:]}")
        return json.loads(line)

    def _job(self, **job: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def prefill(self, prompt: Sequence[int]) -> float:
        """Seconds to evaluate ``prompt`` (token ids) from an empty cache."""
        return float(self._job(prompt=list(prompt))["prefill_s"])

    def generate(self, prompt: Sequence[int], new_tokens: int) -> tuple[list[int], float]:
        """(greedy new ids, seconds for prefill + ``new_tokens`` tokens) from an empty cache."""
        r = self._job(prompt=list(prompt), new_tokens=new_tokens)
        return [int(t) for t in r["tokens"]], float(r["generate_s"])

    def streams(self, prompts: Sequence[Sequence[int]], new_tokens: int) -> tuple[list[list[int]], float]:
        """(greedy new ids per prompt, seconds): every prompt on its own sequence at once, from
        empty caches; the seconds span all prefills and all ``new_tokens`` tokens of every stream."""
        if not 1 <= len(prompts) <= self.sequences:
            raise ValueError(f"{len(prompts)} prompts for a context of {self.sequences} sequences; "
                             f"give 1 to {self.sequences} (or start the peer with sequences={len(prompts)})")
        r = self._job(prompts=[list(p) for p in prompts], new_tokens=new_tokens)
        return [[int(t) for t in out] for out in r["tokens"]], float(r["streams_s"])

    def __enter__(self) -> "LlamaCppPeer":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def corpus_prompts(tok: CodeTokenizer, lengths: Sequence[int]) -> dict[int, list[int]]:
    """One prompt per length: the first ``L`` tokens of held-out corpus code (the longest files first)."""
    from codex_lab.data.corpus import load_corpus

    text = "\n".join(load_corpus(max_files=40).texts("val"))
    ids = tok.encode(text)
    if len(ids) < max(lengths):
        raise ValueError(f"the held-out text has {len(ids)} tokens, fewer than {max(lengths)}")
    return {L: ids[:L] for L in lengths}


def _ours(dec: FastDecoder, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    t0 = time.perf_counter()
    dec.generate(prompt, 1)  # prefill + the first token (its logits' argmax)
    t1 = time.perf_counter()
    out = dec.generate(prompt, n)[0]
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def bench_llama_cpp(model: CodexModel, tok: CodeTokenizer, *, prompt_lens: Sequence[int] = (128, 512),
                    new_tokens: int = 128, rounds: int = 5, threads: int | None = None,
                    compile: bool | str = "aot", precision: str = "f32") -> list[dict[str, Any]]:
    """Interleaved rounds (module docstring): in every round, for every prompt length, codex_lab's
    FastDecoder (compiled) then llama.cpp. Rows per engine and length: prefill and decode tokens/s
    (median, min, max over rounds), ``same_tokens``, ``common_prefix``, and llama.cpp's release.
    ``precision``: ``"f32"`` (both engines on float32 weights), or ``"q8_0"``: llama.cpp on the
    model's Q8_0 GGUF export and FastDecoder on its weight-only int8 copy
    (:func:`~codex_lab.nn.int8.quantize_int8`): two 8-bit formats (Q8_0: a scale per 32 weights;
    ours: a scale per output row), so their tokens are compared but need not agree.
    ``compile``: FastDecoder's (default ``"aot"``: the step compiled ahead of time, no interpreter
    work inside a step, as llama.cpp's C++ loop; each row's ``step`` says which ran).
    Without llama.cpp: one row that says how to install it."""
    from codex_lab.hf.gguf_export import export_gguf
    from codex_lab.runtime import compute_threads

    if find_node_llama_cpp() is None:
        return [{"scenario": "llama_cpp", "skipped": INSTALL_HINT}]
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    threads = threads or compute_threads()
    torch.set_num_threads(threads)
    model = model.eval()
    ours_model = quantize_int8(model)[0] if precision == "q8_0" else model
    prompts = corpus_prompts(tok, prompt_lens)
    # every engine's cache holds the run's tokens, prompt + new (llama-bench sizes its context so:
    # n_prompt + n_gen + n_depth): one decoder and one llama.cpp context per prompt length. A cache
    # of the longest run's size for every length made FastDecoder's attention read 640 slots where
    # llama-bench's read 256 after a 128-token prompt (the record of 2026-12-03 was measured so)
    decs = {L: FastDecoder(ours_model, max_len=L + new_tokens, compile=compile) for L in prompts}
    times: dict[tuple[str, int], dict[str, list[float]]] = {}
    toks: dict[tuple[str, int], list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), contextlib.ExitStack() as stack:
        gguf = Path(tmp) / f"model-{precision}.gguf"
        export_gguf(model, tok, gguf, gguf_type=precision)
        peers = {L: stack.enter_context(LlamaCppPeer(gguf, threads=threads, context=L + new_tokens)) for L in prompts}
        native = find_llama_bench()
        for L, p in prompts.items():  # warm-up (and compilation) outside the timed rounds
            _ours(decs[L], p, new_tokens)
            peers[L].generate(p, new_tokens)
        native_info: dict[str, Any] = {}
        for rnd in range(rounds):
            for L, p in prompts.items():
                dec, peer = decs[L], peers[L]

                def ours() -> None:
                    out, pre, gen = _ours(dec, p, new_tokens)
                    t = times.setdefault(("codex_lab_fast_decode", L), {"prefill": [], "decode": []})
                    t["prefill"].append(L / pre)
                    t["decode"].append((new_tokens - 1) / max(gen - pre, 1e-9))
                    toks[("codex_lab_fast_decode", L)] = out

                def theirs() -> None:
                    pre_l = peer.prefill(p)
                    out_l, gen_l = peer.generate(p, new_tokens)
                    t = times.setdefault(("llama_cpp", L), {"prefill": [], "decode": []})
                    t["prefill"].append(L / pre_l)
                    t["decode"].append((new_tokens - 1) / max(gen_l - pre_l, 1e-9))
                    toks[("llama_cpp", L)] = out_l

                def native_bench() -> None:  # llama.cpp built from source for this CPU: speed only, no tokens
                    nonlocal native_info
                    pp = llama_bench(native, gguf, prompt=L, gen=0, depth=0, threads=threads)
                    tg = llama_bench(native, gguf, prompt=0, gen=new_tokens, depth=L, threads=threads)
                    t = times.setdefault(("llama_cpp_native", L), {"prefill": [], "decode": []})
                    t["prefill"].append(float(pp["avg_ts"]))
                    t["decode"].append(float(tg["avg_ts"]))
                    native_info = {"build_commit": tg.get("build_commit"), "cpu_info": tg.get("cpu_info"),
                                   "binary": home_relative(native), "type_k": tg.get("type_k"),
                                   "type_v": tg.get("type_v")}

                # the order rotates from round to round: no engine always runs first (a cold cache) or last
                for fn in round_order([ours, theirs] + ([native_bench] if native is not None else []), rnd):
                    fn()
        info = dict(peers[max(prompts)].info)
    rows = []
    for (impl, L), t in times.items():
        ref, mine = toks[("codex_lab_fast_decode", L)], toks.get((impl, L))
        prefix = _prefix(ref, mine) if mine is not None else None
        row: dict[str, Any] = {
            "scenario": "llama_cpp", "impl": impl, "batch": 1, "prompt_len": L, "new_tokens": new_tokens,
            "precision": PRECISIONS[precision][impl != "codex_lab_fast_decode"], "kv_cache": KV_CACHE.get(impl, "f32"),
            "rounds": rounds, "threads": threads,
            "decode_tokens_per_s": statistics.median(t["decode"]), "decode_min": min(t["decode"]),
            "decode_max": max(t["decode"]), "prefill_tokens_per_s": statistics.median(t["prefill"]),
            "prefill_min": min(t["prefill"]), "prefill_max": max(t["prefill"]),
            # every round kept, in the order run, beside the median and range
            "decode_rounds": list(t["decode"]), "prefill_rounds": list(t["prefill"]),
            "same_tokens": mine == ref if mine is not None else None, "common_prefix": prefix}
        if impl == "llama_cpp":
            row.update({f"llama_{k}": v for k, v in info.items() if k != "ready"})
        elif impl == "llama_cpp_native":  # llama-bench prints no tokens (same_tokens None)
            row.update({f"llama_{k}": v for k, v in native_info.items()}, build_type="source")
            if native_info.get("type_k"):  # llama-bench's own record of its cache's types
                row["kv_cache"] = f"k {native_info['type_k']}, v {native_info['type_v']}"
        else:
            row["compiled"] = decs[L].compiled
            row["step"] = "ahead of time" if decs[L].aot else "torch.compile" if decs[L].compiled else "eager"
            row["cache_slots"] = decs[L].max_len
        rows.append(row)
    by = {(r["impl"], r["prompt_len"]): r for r in rows}
    for r in rows:  # codex_lab / llama.cpp, per length (> 1: codex_lab faster)
        for suffix, impl in (("llama_cpp", "llama_cpp"), ("llama_native", "llama_cpp_native")):
            peer_row = by.get((impl, r["prompt_len"]))
            if peer_row is not None:
                r[f"decode_ratio_vs_{suffix}"] = r["decode_tokens_per_s"] / peer_row["decode_tokens_per_s"]
                r[f"prefill_ratio_vs_{suffix}"] = r["prefill_tokens_per_s"] / peer_row["prefill_tokens_per_s"]
    return rows


def stream_prompts(tok: CodeTokenizer, streams: int, length: int) -> list[list[int]]:
    """``streams`` different prompts of ``length`` tokens: consecutive slices of held-out corpus code."""
    p = corpus_prompts(tok, [streams * length])[streams * length]
    return [p[i * length:(i + 1) * length] for i in range(streams)]


def _prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def bench_llama_cpp_streams(model: CodexModel, tok: CodeTokenizer, *, streams: int = 8, prompt_len: int = 128,
                            new_tokens: int = 128, rounds: int = 3, threads: int | None = None,
                            compile: bool = True) -> list[dict[str, Any]]:
    """Batched decode, ``streams`` at once, in interleaved rounds: codex_lab's continuous-batching
    engine (``codex_lab.serve.compiled.compiled_engine``, what ``codex-lab serve`` runs, called in
    process) against llama.cpp with one context of ``streams`` sequences (its parallel slots,
    batched by node-llama-cpp), the same F32 GGUF, the same math threads, no HTTP on either side.

    Per round each side gets ``streams`` different held-out prompts of ``prompt_len`` tokens at
    once and generates ``new_tokens`` greedy tokens for each (end-of-text ignored);
    throughput = streams x new_tokens / wall seconds, prefill included. Rows per engine:
    median, min and max over rounds, the number of streams whose tokens equal the other
    engine's, and the shortest common prefix. Without llama.cpp: one row saying how to install it."""
    from codex_lab.hf.gguf_export import export_gguf
    from codex_lab.infer.sampling import SamplingParams
    from codex_lab.runtime import compute_threads
    from codex_lab.serve.compiled import compiled_engine

    if find_node_llama_cpp() is None:
        return [{"scenario": "llama_cpp_streams", "skipped": INSTALL_HINT}]
    threads = threads or compute_threads()
    torch.set_num_threads(threads)
    model = model.eval()
    prompts = stream_prompts(tok, streams, prompt_len)
    if compile:
        eng = compiled_engine(model, tok, max_batch_size=streams)
    else:
        from codex_lab.infer.engine.loop import Engine

        eng = Engine(model, tok, max_batch_size=streams)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)

    def ours() -> tuple[list[list[int]], float]:
        t0 = time.perf_counter()
        rids = [eng.submit(p, params) for p in prompts]
        done = {f.rid: f for f in eng.run_until_done()}
        wall = time.perf_counter() - t0
        bad = [done[r].finish_reason for r in rids if done[r].finish_reason != "length"]
        if bad:
            raise RuntimeError(f"the engine ended streams with {bad}; every stream should run to max_tokens")
        return [list(done[r].output_ids) for r in rids], wall

    rates: dict[str, list[float]] = {"codex_lab_engine": [], "llama_cpp": []}
    out: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        gguf = Path(tmp) / "model-f32.gguf"
        export_gguf(model, tok, gguf, gguf_type="f32")
        with LlamaCppPeer(gguf, threads=threads, context=prompt_len + new_tokens, sequences=streams) as peer:
            ours()  # warm-up outside the timed rounds: the compiled step's buckets, llama.cpp's buffers
            if eng.fast_step is not None and not eng.fast_step.ready.wait(600):
                raise RuntimeError("the engine's decode step took over 600 s to compile")
            ours()
            peer.streams(prompts, new_tokens)
            runners = {"codex_lab_engine": ours, "llama_cpp": lambda: peer.streams(prompts, new_tokens)}
            for rnd in range(rounds):
                # the order alternates from round to round: neither engine always runs first
                for impl in round_order(list(runners), rnd):
                    toks, wall = runners[impl]()
                    rates[impl].append(streams * new_tokens / wall)
                    out[impl] = toks
            info = dict(peer.info)
    same = sum(a == b for a, b in zip(out["codex_lab_engine"], out["llama_cpp"]))
    prefix = min(_prefix(a, b) for a, b in zip(out["codex_lab_engine"], out["llama_cpp"]))
    rows = []
    for impl, r in rates.items():
        row: dict[str, Any] = {
            "scenario": "llama_cpp_streams", "impl": impl, "streams": streams, "prompt_len": prompt_len,
            "new_tokens": new_tokens, "precision": "f32", "kv_cache": KV_CACHE.get(impl, "f32"), "rounds": rounds,
            "threads": threads, "tokens_per_s": statistics.median(r), "tokens_per_s_min": min(r),
            "tokens_per_s_max": max(r), "tokens_per_s_rounds": list(r),
            "same_streams": same, "shortest_common_prefix": prefix}
        if impl == "llama_cpp":
            row.update({f"llama_{k}": v for k, v in info.items() if k != "ready"})
        else:
            row["compiled"] = bool(eng.fast_step is not None and eng.fast_step.serving_graphs)
        rows.append(row)
    for row in rows:  # codex_lab / llama.cpp (> 1: codex_lab faster)
        row["ratio_vs_llama_cpp"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    return rows


__all__ = ["INSTALL_HINT", "LlamaCppPeer", "PEER_JS", "bench_llama_cpp", "bench_llama_cpp_streams",
    "corpus_prompts", "find_node_llama_cpp", "stream_prompts"]
