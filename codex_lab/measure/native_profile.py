"""Both engines under one sampling profiler: where a decoded token's time goes in llama.cpp and
in codex-lab (``codex-lab bench inference --scenarios native_profile``).

``torch.profiler`` (:mod:`~codex_lab.measure.token_profile`) sees only torch's
operators, so it cannot say what llama.cpp does in the same time. Linux ``perf`` samples any
process alike: every ``1/freq`` s of CPU time it records the call chain running (unwound from
a copy of the stack: neither MKL nor llama.cpp's release build keeps frame pointers). Each side
decodes the same greedy tokens under it, one math thread each, from the same weights (the F32
GGUF export of the checkpoint), and only the decode steps count:

- llama.cpp: ``llama-bench -p 0 -n N -d L -r R`` (built from source by
  ``scripts/build_llama_cpp.sh``): an L-token prompt put in the cache (once; the other R-1
  times its saved state is restored), then N greedy tokens, R times; less a second run that only
  prefills the same prompt once (``-p L -n 0 -r 1``), function by function, so what is left is
  the decode (sampling noise makes a small category uncertain by a few samples);
- codex-lab: a child Python process holding FastDecoder compiled ahead of time (``compile="aot"``), R
  times: the prompt's prefill (:meth:`FastDecoder.prefill`) unsampled, then its decode steps
  sampled (``perf record --control``: sampling is switched on and off by the child), each token
  checked against ``generate``'s.

Each sample is put in one category (:func:`chain_category`): ``matmul``, ``attention`` (a call
inside an attention kernel counts as attention: ATen's flash attention hands its one-query
products to MKL's matrix-vector routine, llama.cpp's to its f16 dot product), ``sampling``,
``other ops`` (norms, rotary, element-wise, copies), ``runtime`` (the code between kernels:
llama.cpp's graph scheduling, torch's dispatcher and allocator, the compiled graph's wrapper,
malloc), ``python`` (the interpreter), ``os`` (the kernel: page faults, system calls),
``unresolved`` (code perf has no symbol for). A sample is 1/freq s of one thread's CPU time, so
the split is CPU time, not wall time (the two agree for one busy thread; ``wall_ms_per_token``
is the decode's wall time each side measured itself, under the profiler, whose stack copies
slow both).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CATEGORIES = ("matmul", "attention", "sampling", "other ops", "runtime", "python", "os", "unresolved")
PERF_HINT = ("Linux perf is not installed: `apt-get install linux-perf` (Debian; `linux-tools-$(uname -r)` on "
             "Ubuntu), or set CODEX_LAB_PERF to a perf binary; it needs /proc/sys/kernel/perf_event_paranoid <= 2 "
             "or root")

# substrings of a function's (demangled) name, checked in this order: the first match decides
_MATMUL = ("gemm", "gemv", "vec_dot", "mul_mat", "sgemm", "tinyblas", "mkl_blas", "dnnl", "brgemm", "matmul",
           "_mm_", "addmm", "linear")
_ATTENTION = ("flash_attn", "flash_attention", "soft_max", "softmax", "scaled_dot_product", "attention")
_SAMPLING = ("argmax", "topk", "sort")
# llama.cpp's / ggml's per-operator kernels and torch's element-wise loops: the "other ops"
_OPS = ("ggml_compute_forward", "ggml_vec_", "rms_norm", "rope", "cpp_fused", "vectorized_loop", "cpu_kernel",
        "at::vec", "memcpy", "memmove", "memset", "copy_", "cat_", "index_put", "silu", "get_rows")


def find_perf() -> Path | None:
    """``perf``: ``CODEX_LAB_PERF``, else one on PATH that runs; None when there is none (:data:`PERF_HINT`)."""
    cand = os.environ.get("CODEX_LAB_PERF") or shutil.which("perf")
    if not cand:
        return None
    try:
        ok = subprocess.run([cand, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return Path(cand) if ok else None


def native_category(dso: str, symbol: str) -> str:
    """The category (:data:`CATEGORIES`) of one sampled function, by its binary ``dso`` and name."""
    low = symbol.lower()
    if dso.startswith("libpython") or dso.startswith("python"):
        return "python"
    if dso.startswith("[kernel") or dso.startswith("[vdso"):  # the operating system's own code
        return "os"
    # no name to read: an address, perf's "[unknown]" (a library without symbols, such as an
    # ahead-of-time package's kernels), or code with no file behind it
    if symbol.startswith(("0x", "[unknown]")) or dso in ("[unknown]", "[anon]", "[JIT]") or dso.startswith("[JIT"):
        return "unresolved"
    if any(k in low for k in _ATTENTION):
        return "attention"
    if any(k in low for k in _MATMUL):
        return "matmul"
    if any(k in low for k in _SAMPLING):
        return "sampling"
    if any(k in low for k in _OPS) or dso.startswith("libm."):  # libm: expf, sincosf of softmax, SiLU, rotary
        return "other ops"
    return "runtime"


def parse_script(text: str) -> list[list[tuple[str, str]]]:
    """``perf script --no-inline -F comm,ip,sym,dso`` of a run recorded with call graphs -> one
    call chain per sample, leaf first, each frame (binary file name, function)."""
    chains: list[list[tuple[str, str]]] = []
    cur: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a sample's header (the command's name): a new chain
            cur = []
            chains.append(cur)
            continue
        # a frame: "<address> <function> (<binary's path>)"
        m = re.match(r"\s*[0-9a-fA-F]+\s+(.*?)\s+\(([^()]*)\)\s*$", line)
        if m is None or cur is None:
            continue
        cur.append((os.path.basename(m.group(2)) or m.group(2), m.group(1)))
    return [c for c in chains if c]


def chain_category(chain: list[tuple[str, str]]) -> str:
    """The category of one sample from its call chain (leaf first): the interpreter, the kernel and
    unresolved code by the function running; otherwise inside an attention call (an ancestor is
    attention: MKL's matrix-vector product called by ATen's flash attention, ggml's f16 dot product
    called by its flash attention) attention, inside a sampling call sampling, else by the leaf."""
    leaf = native_category(*chain[0])
    if leaf in ("python", "os", "unresolved", "attention", "sampling"):
        return leaf
    above = [native_category(dso, sym) for dso, sym in chain[1:]]
    for cat in ("attention", "sampling"):
        if cat in above:
            return cat
    return leaf


def _chains(perf: Path, data: Path) -> list[list[tuple[str, str]]]:
    # --no-inline: perf resolves no inlined frames (addr2line over libtorch would take minutes)
    proc = subprocess.run([str(perf), "script", "--no-inline", "-i", str(data), "-F", "comm,ip,sym,dso"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"perf script failed (code {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return parse_script(proc.stdout)


def tally(chains: list[list[tuple[str, str]]]) -> dict[tuple[str, str, str], int]:
    """Samples per (category, binary, leaf function)."""
    out: dict[tuple[str, str, str], int] = {}
    for c in chains:
        key = (chain_category(c), *c[0])
        out[key] = out.get(key, 0) + 1
    return out


def split(counts: dict[tuple[str, str, str], int], *, freq: int, tokens: int,
          minus: dict[tuple[str, str, str], int] | None = None, top: int = 8) -> dict[str, Any]:
    """Samples per (category, binary, function) -> CPU ms per generated token per category, and the
    ``top`` functions. ``minus``: samples of a run that did only the part to leave out (the prompt's
    prefill), taken away function by function (a category below zero by sampling noise shows as 0)."""
    # one sample = 1/freq s of one thread's CPU time: ms per token = samples * 1000 / (freq * tokens)
    per = 1000.0 / (freq * tokens)
    net = dict(counts)
    for k, n in (minus or {}).items():
        net[k] = net.get(k, 0) - n
    ms = {c: 0.0 for c in CATEGORIES}
    for (cat, _dso, _sym), n in net.items():
        ms[cat] += n * per
    ms = {c: max(0.0, v) for c, v in ms.items()}
    best = sorted(net.items(), key=lambda kv: -kv[1])[:top]
    return {"cpu_ms_per_token": sum(ms.values()), "ms_per_token": ms, "samples": sum(counts.values()),
            "top_functions": [[f"{dso}: {sym}"[:120], n * per, cat] for (cat, dso, sym), n in best]}


# perf record's options for both engines: call graphs unwound from 4 KB of stack copied per sample
# (DWARF: libtorch's MKL and llama.cpp's release build keep no frame pointers). perf's copying runs on
# the other core and streams through the shared cache that holds the weights: at 2999 Hz and 8 KB a
# sample it slowed llama.cpp's f32 dot product by half (2026-12-06), so sample less often, for longer
_RECORD = ["record", "-q", "--call-graph", "dwarf,4096"]


def profile_llama_bench(perf: Path, bench: Path, gguf: str | Path, *, prompt_len: int, new_tokens: int, reps: int,
                        freq: int, threads: int = 1) -> dict[str, Any]:
    """``llama-bench`` decoding ``reps`` x ``new_tokens`` after a ``prompt_len`` prompt under ``perf record``,
    less a run that only prefills the same prompt once (``-p prompt_len -n 0 -r 1``): llama-bench
    prefills the prompt at the first repetition and restores the cache's saved state at the others,
    so what is left is the decode and those restores (a copy of the prompt's keys and values)."""
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, test in (("decode", ["-p", "0", "-n", str(new_tokens), "-d", str(prompt_len)]),
                           ("prefill", ["-p", str(prompt_len), "-n", "0"])):
            r = reps if name == "decode" else 1
            data = Path(tmp) / f"{name}.data"
            cmd = [str(perf), *_RECORD, "-F", str(freq), "-o", str(data), "--", str(bench), "-m", str(gguf), *test,
                   "-t", str(threads), "-r", str(r), "--no-warmup", "-o", "json"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            try:
                rec = json.loads(proc.stdout)[0]
            except (json.JSONDecodeError, IndexError):
                raise RuntimeError(f"llama-bench under perf failed (code {proc.returncode}): "
                                   f"{proc.stderr.strip()[-300:]}") from None
            runs[name] = (tally(_chains(perf, data)), rec)
    out = split(runs["decode"][0], freq=freq, tokens=reps * new_tokens, minus=runs["prefill"][0])
    ts = float(runs["decode"][1]["avg_ts"])  # llama-bench's own decode tokens/s (its timer starts after the prompt)
    out.update(impl="llama_cpp_native", tokens_per_s=ts, wall_ms_per_token=1000.0 / ts,
               build_commit=runs["decode"][1].get("build_commit"))
    return out


# the child process: load, compile, warm up; then per repetition the prompt's prefill unsampled and
# its decode steps sampled (FastDecoder.generate's loop, each greedy token checked against it)
_WORKER = r"""
import json, os, sys, time, torch
ctl, ack, L, N, R, random = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
torch.set_num_threads(1)
torch.set_grad_enabled(False)
from codex_lab.measure.models import load_model_and_tokenizer
from codex_lab.measure.peer_llamacpp import corpus_prompts
from codex_lab.infer.fast_decode import FastDecoder
model, tok = load_model_and_tokenizer(random)
prompt = corpus_prompts(tok, [L])[L]
dec = FastDecoder(model, max_len=L + N, compile="aot")  # compiled ahead of time: no dynamo inside a step
ref = dec.generate(prompt, N)[0]
c, a = os.open(ctl, os.O_RDWR), os.open(ack, os.O_RDWR)
def say(word):
    os.write(c, word.encode() + b"\n")
    os.read(a, 16)  # perf acknowledges: sampling is on (off) from here
prompts, same, wall = torch.tensor([prompt]), True, 0.0
for _ in range(R):
    nxt, pos = dec.prefill(prompts)  # eager, as generate does it
    out = []
    say("enable")
    t0 = time.perf_counter()
    for i in range(N):
        out.append(int(nxt[0]))
        if i + 1 == N:
            break
        nxt = dec.decode_step(nxt[:, None], pos)
        pos += 1
    wall += time.perf_counter() - t0
    say("disable")
    same &= out == ref
print(json.dumps({"wall_s": wall, "same_tokens": same, "compiled": dec.compiled, "recompiles": dec.recompiles,
                  "step": "ahead of time" if dec.aot else "torch.compile" if dec.compiled else "eager"}))
"""


def profile_fast_decoder(perf: Path, *, prompt_len: int, new_tokens: int, reps: int, freq: int,
                         random: bool = False) -> dict[str, Any]:
    """FastDecoder (compiled ahead of time, one thread) generating ``reps`` x ``new_tokens`` after a ``prompt_len``
    prompt in a child process, sampled only while it decodes (``new_tokens - 1`` steps a
    repetition: the first token is the prefill's)."""
    with tempfile.TemporaryDirectory() as tmp:
        data, ctl, ack = Path(tmp) / "ours.data", Path(tmp) / "ctl", Path(tmp) / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        cmd = [str(perf), *_RECORD, "-F", str(freq), "-D", "-1", "--control", f"fifo:{ctl},{ack}", "-o", str(data),
               "--", sys.executable, "-c", _WORKER, str(ctl), str(ack), str(prompt_len), str(new_tokens), str(reps),
               "1" if random else "0"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
        try:
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            raise RuntimeError(f"the profiled FastDecoder failed (code {proc.returncode}): {proc.stderr.strip()[-500:]}") from None
        steps = reps * (new_tokens - 1)
        out = split(tally(_chains(perf, data)), freq=freq, tokens=steps)
    wall_ms = 1000.0 * rec["wall_s"] / steps
    out.update(impl="codex_lab_fast_decode", tokens_per_s=1000.0 / wall_ms, wall_ms_per_token=wall_ms,
               same_tokens=rec["same_tokens"], compiled=rec["compiled"], recompiles=rec["recompiles"],
               step=rec.get("step"))
    return out


def bench_native_profile(model: Any, tok: Any, *, prompt_len: int = 128, new_tokens: int = 128, reps: int = 40,
                         rounds: int = 2, freq: int = 999, random: bool = False) -> list[dict[str, Any]]:
    """Rows ``codex_lab_fast_decode`` and ``llama_cpp_native``: CPU ms per generated token split by
    category (the mean of ``rounds`` interleaved runs of each), the top functions, and each
    side's own tokens/s under the profiler. Without perf or llama-bench: one row saying how to get them."""
    from codex_lab.hf.gguf_export import export_gguf
    from codex_lab.measure.llama_native import find_llama_bench, home_relative

    perf, bench = find_perf(), find_llama_bench()
    if perf is None or bench is None:
        hint = PERF_HINT if perf is None else ("llama-bench is not built: `bash scripts/build_llama_cpp.sh` "
                                               "(about an hour on 2 cores) or set CODEX_LAB_LLAMA_BENCH")
        return [{"scenario": "native_profile", "skipped": hint}]
    runs: dict[str, list[dict[str, Any]]] = {"codex_lab_fast_decode": [], "llama_cpp_native": []}
    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / "model-f32.gguf"
        export_gguf(model.eval(), tok, gguf, gguf_type="f32")
        for _ in range(rounds):  # interleaved: a slower minute of the machine falls on both
            runs["codex_lab_fast_decode"].append(profile_fast_decoder(perf, prompt_len=prompt_len, new_tokens=new_tokens,
                                                                      reps=reps, freq=freq, random=random))
            runs["llama_cpp_native"].append(profile_llama_bench(perf, bench, gguf, prompt_len=prompt_len,
                                                                new_tokens=new_tokens, reps=reps, freq=freq))
    rows = []
    for impl, rs in runs.items():
        # the rounds' splits averaged (each is per token already); top functions from the first round
        ms = {c: sum(r["ms_per_token"][c] for r in rs) / len(rs) for c in CATEGORIES}
        row: dict[str, Any] = {
            "scenario": "native_profile", "impl": impl, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "reps": reps, "rounds": rounds, "threads": 1, "freq_hz": freq, "ms_per_token": ms,
            "cpu_ms_per_token": sum(ms.values()), "samples": sum(r["samples"] for r in rs),
            "wall_ms_per_token": statistics.median(r["wall_ms_per_token"] for r in rs),
            "wall_ms_min": min(r["wall_ms_per_token"] for r in rs), "wall_ms_max": max(r["wall_ms_per_token"] for r in rs),
            "top_functions": rs[0]["top_functions"],
            **{f"{c.replace(' ', '_')}_ms_per_token": v for c, v in ms.items()}}
        if impl == "llama_cpp_native":
            row.update(build_commit=rs[0].get("build_commit"), binary=home_relative(bench))
        else:
            row.update(same_tokens=all(r["same_tokens"] for r in rs), compiled=rs[0]["compiled"],
                       recompiles=max(r["recompiles"] for r in rs), step=rs[0].get("step"))
        rows.append(row)
    return rows


def native_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table: CPU ms per generated token by category, side by side, and the top functions."""
    step = next((r.get("step") for r in rows if r.get("impl") == "codex_lab_fast_decode"), None)
    # the step each record ran: records before the ahead-of-time step have no "step" (torch.compile)
    ours = "codex-lab FastDecoder (compiled ahead of time)" if step == "ahead of time" else "codex-lab FastDecoder (compiled)"
    names = {"codex_lab_fast_decode": ours, "llama_cpp_native": "llama.cpp (llama-bench)"}
    out = ["| engine | wall ms/token (rounds) | CPU ms/token sampled | " + " | ".join(CATEGORIES) + " |",
           "|---" * (len(CATEGORIES) + 3) + "|"]
    for r in rows:
        if "impl" not in r:
            continue
        cells = [f"{r['ms_per_token'][c]:.3f}" for c in CATEGORIES]
        out.append(f"| {names.get(r['impl'], r['impl'])} | {r['wall_ms_per_token']:.3f} ({r['wall_ms_min']:.3f}-"
                   f"{r['wall_ms_max']:.3f}) | {r['cpu_ms_per_token']:.3f} | " + " | ".join(cells) + " |")
    out.append("")
    for r in rows:
        if "impl" in r:
            tops = "; ".join(f"`{name.split(': ', 1)[-1][:50]}` {ms:.3f} ({cat})" for name, ms, cat in r["top_functions"][:5])
            out.append(f"- top functions, {names.get(r['impl'], r['impl'])} (ms per token): {tops}")
    if step == "ahead of time":  # what "unresolved" holds there, so 0.000 matmuls does not read as none
        out.append("- unresolved: code perf cannot name; for FastDecoder, the ahead-of-time package's library "
                   "(its matmuls, attention and the code between them, as one figure)")
    return out


__all__ = ["CATEGORIES", "PERF_HINT", "bench_native_profile", "find_perf", "native_category", "native_lines",
           "chain_category", "parse_script", "profile_fast_decoder", "profile_llama_bench", "split", "tally"]
