"""The performance figures the docs pages state, each computed from the bench record
(``codex_lab/assets/bench_records.json``: for each bench the command, the date, the conditions
and the rows its ``--json`` printed; ``scripts/update_figures.py --bench KEY FILE`` records one).

Each figure is one :class:`BenchFigure`: a fixed phrase around a number computed from those
rows. :mod:`codex_lab.course.figures` checks and rewrites them with the timing figures.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

BENCH_RECORD = Path(__file__).resolve().parents[1] / "assets" / "bench_records.json"

def bench_record(path: Path = BENCH_RECORD) -> dict[str, Any]:
    """Bench key -> {"command", "measured", "conditions", "rows"} (``bench_records.json``; {} if absent)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _pick(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The one row whose fields equal ``match`` (a clear error naming the match if none or several)."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(hits) != 1:
        raise ValueError(f"{len(hits)} bench rows match {match}; re-record the bench (scripts/update_figures.py --bench)")
    return hits[0]


@dataclass(frozen=True)
class BenchFigure:
    """One performance figure of the docs pages: ``phrase`` is a regular expression with three
    groups (the words before, the number, the words after); the number is ``field`` of the
    row of record ``key`` matching ``match``, times ``scale``, with ``digits`` decimals; with
    ``over``, divided by the same field of the row matching ``over`` (a speed-up)."""

    key: str
    phrase: str
    match: tuple[tuple[str, Any], ...]
    field: str
    digits: int = 0
    scale: float = 1.0
    over: tuple[tuple[str, Any], ...] = ()
    fn: Callable[[list[dict[str, Any]]], float] | None = None  # computes the number instead

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.phrase)

    def value(self, rows: list[dict[str, Any]]) -> str:
        """The figure as the text states it (``digits`` decimals, no thousands separator)."""
        if self.fn is not None:
            return f"{self.fn(rows):.{self.digits}f}"
        x = float(_pick(rows, **dict(self.match))[self.field]) * self.scale
        if self.over:
            # speed-up = field(match) / field(over), both rows of the same run
            x /= float(_pick(rows, **dict(self.over))[self.field]) * self.scale
        return f"{x:.{self.digits}f}"


NUM = r"(\d[\d,]*(?:\.\d+)?)"


def _decode(key: str, label: str) -> list[BenchFigure]:
    """FastDecoder's tokens/s and its two speed-ups, and the two HF baselines, of decode record ``key``."""
    fd = (("impl", "codex_lab_fast_decode"),)
    return [
        BenchFigure(key, rf"({label}: FastDecoder ){NUM}( tokens/s)", fd, "tokens_per_s"),
        BenchFigure(key, rf"({label}: FastDecoder [^|]*? = \*\*){NUM}(x\*\* HF `generate`)", fd, "speedup_vs_hf_generate", 2),
        BenchFigure(key, rf"({label}: [^|]*?HF `generate` \(){NUM}(\))", (("impl", "hf_generate"),), "tokens_per_s"),
        BenchFigure(key, rf"({label}: [^|]*?\*\*){NUM}(x\*\* HF static \+ compile)", fd, "speedup_vs_hf_generate_static_compile", 2),
        BenchFigure(key, rf"({label}: [^|]*?HF static \+ compile \(){NUM}(\))", (("impl", "hf_generate_static_compile"),), "tokens_per_s"),
        BenchFigure(key, rf"({label}: [^|]*?first call ){NUM}( s)", fd, "first_call_s", 1),
    ]


def _aot_decode(key: str, label: str) -> list[BenchFigure]:
    """The decode step compiled ahead of time (FastDecoder ``compile="aot"``) in decode record
    ``key``: its tokens/s and speed-up over the ``torch.compile``'d step of the same rounds, and its
    int8 copy's tokens/s and speed-up over the float32 package."""
    aot, jit = (("impl", "codex_lab_fast_decode_aot"),), (("impl", "codex_lab_fast_decode"),)
    q = (("impl", "codex_lab_fast_decode_int8_aot"),)
    head = rf"{label}, ahead of time: "
    return [
        BenchFigure(key, rf"({head}FastDecoder ){NUM}( tokens/s)", aot, "tokens_per_s"),
        # speed-up = tokens/s of the package / tokens/s of the torch.compile'd step, same rounds
        BenchFigure(key, rf"({head}[^|]*?\*\*){NUM}(x\*\* the `torch\.compile`d step's)", aot, "tokens_per_s", 2,
                    over=jit),
        BenchFigure(key, rf"({head}[^|]*?int8 copy ){NUM}( tokens/s)", q, "tokens_per_s"),
        BenchFigure(key, rf"({head}[^|]*?int8 copy [^|]*?\*\*){NUM}(x\*\* the float32 package's)", q, "tokens_per_s", 2,
                    over=aot),
    ]


def _serving(key: str, label: str) -> list[BenchFigure]:
    """TTFT and TBT p95 at 4, 8 and 16 streams of serving record ``key``."""
    out = []
    for c in (4, 8, 16):
        for field, name in (("ttft_p95_ms", "TTFT"), ("tbt_p95_ms", "TBT")):
            out.append(BenchFigure(key, rf"({label} {c} streams: [^|;]*?{name} p95 \**){NUM}( ms)",
                                   (("concurrency", c),), field, 1))
    return out


def _code_edit(key: str) -> list[BenchFigure]:
    """Prompt-lookup decoding against plain decoding on code edits."""
    edit = (("scenario", "code_edit"),)  # the record also holds plain continuations (scenario code_continuation)
    pl, plain = (*edit, ("impl", "prompt_lookup_d16")), (*edit, ("impl", "plain_static_cache"))
    fast, pl_fast = (*edit, ("impl", "fast_decode_aot")), (*edit, ("impl", "prompt_lookup_fast_aot_d16"))
    return [
        BenchFigure(key, rf"(prompt lookup: \*\*){NUM}(x\*\* plain decoding)", pl, "speedup_vs_plain", 2),
        BenchFigure(key, rf"(prompt lookup: [^|]*?plain decoding \(){NUM}( vs )", pl, "tokens_per_s"),
        BenchFigure(key, rf"(prompt lookup: [^|]*?plain decoding \(\d+ vs ){NUM}( tokens/s\))", plain, "tokens_per_s"),
        BenchFigure(key, rf"(prompt lookup: [^|]*?acceptance ){NUM}(,)", pl, "acceptance_rate", 2),
        # on the decoder compiled ahead of time: the guesses verified by its packages
        BenchFigure(key, rf"(prompt lookup on the compiled decoder: \*\*){NUM}(x\*\* FastDecoder's)", pl_fast,
                    "speedup_vs_fast_decode", 2),
        BenchFigure(key, rf"(prompt lookup on the compiled decoder: [^|]*?\(){NUM}( vs )", pl_fast, "tokens_per_s"),
        BenchFigure(key, rf"(prompt lookup on the compiled decoder: [^|]*?\(\d+ vs ){NUM}( tokens/s\))", fast,
                    "tokens_per_s"),
        # what caps it: decode rounds with nothing to copy, and the cost of a verify in one-token steps
        BenchFigure(key, rf"(prompt lookup on the compiled decoder: [^|]*?\*\*){NUM}(%\*\* of its decode rounds)",
                    pl_fast, "no_match_share", 0, scale=100.0),
        BenchFigure(key, rf"(prompt lookup on the compiled decoder: [^|]*?verify of 4 guesses costs \*\*){NUM}(x\*\*)",
                    pl_fast, "verify_cost_vs_step", 1, fn=lambda rows: _pick(rows, **dict(pl_fast))["verify_cost_vs_step"]["4"]),
    ]


def _batching(key: str, label: str) -> list[BenchFigure]:
    """Continuous batching (eager and compiled) against one request at a time: medians of the
    per-round ratios, their range, and the median round's tokens/s."""
    one, cont, comp = (("impl", "one_at_a_time"),), (("impl", "continuous_batching"),), (("impl", "continuous_batching_compiled"),)
    return [
        BenchFigure(key, rf"({label}: continuous batching \*\*){NUM}(x\*\* one at a time)", cont, "vs_one_median", 2),
        BenchFigure(key, rf"({label}: continuous batching [^|;]*?one at a time \(rounds ){NUM}(-)", cont, "vs_one_lo", 2),
        BenchFigure(key, rf"({label}: continuous batching [^|;]*?one at a time \(rounds \d+\.\d+-){NUM}(x; )", cont, "vs_one_hi", 2),
        BenchFigure(key, rf"({label}: continuous batching [^|;]*?x; ){NUM}( vs )", cont, "tokens_per_s"),
        BenchFigure(key, rf"({label}: continuous batching [^|;]*?x; \d+ vs ){NUM}( tokens/s\))", one, "tokens_per_s"),
        BenchFigure(key, rf"({label}: [^|;]*?compiled engine ){NUM}( tokens/s)", comp, "tokens_per_s"),
        BenchFigure(key, rf"({label}: [^|;]*?compiled engine \d+ tokens/s = \*\*){NUM}(x\*\* the eager engine)",
                    comp, "vs_eager_median", 2),
        BenchFigure(key, rf"({label}: [^|;]*?the eager engine \(rounds ){NUM}(-)", comp, "vs_eager_lo", 2),
        BenchFigure(key, rf"({label}: [^|;]*?the eager engine \(rounds \d+\.\d+-){NUM}(x\))", comp, "vs_eager_hi", 2),
        BenchFigure(key, rf"({label}: [^|;]*?buckets compiled in ){NUM}( s)", comp, "compile_s"),
    ]


def _attention(key: str) -> list[BenchFigure]:
    """Sparse attention at N=8192 against dense SDPA: speed-ups, times, pairs computed, peaks."""
    at = lambda impl: (("impl", impl), ("N", 8192))  # noqa: E731
    fw, fb = "N=8192 forward: ", "N=8192 forward \\+ backward: "
    out = [
        BenchFigure(key, rf"({fw}`fast` [^|]*?\*\*){NUM}(x\*\* SDPA)", at("fast"), "speedup_vs_sdpa", 2),
        BenchFigure(key, rf"({fw}[^|]*?SDPA \(){NUM}( vs )", at("fast"), "median_ms", 1),
        BenchFigure(key, rf"({fw}[^|]*?SDPA \([\d.]+ vs ){NUM}( ms)", at("sdpa"), "median_ms"),
        BenchFigure(key, rf"({fw}[^|]*?computes ){NUM}(% of the causal pairs)", at("fast"), "computed_fraction", 1, 100.0),
        BenchFigure(key, rf"({fb}`fast` [^|]*?\*\*){NUM}(x\*\* SDPA)", at("fast"), "fwd_bwd_speedup_vs_sdpa", 2),
        BenchFigure(key, rf"({fb}[^|]*?SDPA \(){NUM}( vs )", at("fast"), "fwd_bwd_ms", 1),
        BenchFigure(key, rf"({fb}[^|]*?SDPA \([\d.]+ vs ){NUM}( ms)", at("sdpa"), "fwd_bwd_ms"),
        BenchFigure(key, rf"({fw}[^|]*?\(SDPA ){NUM}( MiB\))", at("sdpa"), "peak_mib"),
    ]
    for impl in ("fast-flash", "blocks", "flex"):
        out.append(BenchFigure(key, rf"({fw}[^|]*?`{impl}` ){NUM}(x)", at(impl), "speedup_vs_sdpa", 2))
    for impl in ("fast-flash", "blocks"):
        out.append(BenchFigure(key, rf"({fb}[^|]*?`{impl}` ){NUM}(x)", at(impl), "fwd_bwd_speedup_vs_sdpa", 2))
    for i, impl in enumerate(("fast", "fast-flash", "blocks", "flex")):
        before = "peak " + "".join(r"\d+ / " for _ in range(i))
        after = " MiB" if impl == "flex" else " / "
        out.append(BenchFigure(key, rf"({fw}[^|]*?{before}){NUM}({after})", at(impl), "peak_mib"))
    # the goals themselves come from the pattern's measured density d and tile share at N=8192
    goal = "sparse forward at N=8192 "
    out += [
        BenchFigure(key, rf"({goal}\(d=){NUM}(,)", at("fast"), "density", 3),
        BenchFigure(key, rf"({goal}\(d=[\d.]+, ){NUM}(% of tiles\))", at("fast"), "tile_fraction", 1, 100.0),
        BenchFigure(key, rf"({goal}[^|]*?0\.6/d = ){NUM}(x)", at("fast"), "goal_0_6_over_d", 2),
        BenchFigure(key, rf"({goal}[^|]*?\(limit 1/d = ){NUM}(x\))", at("fast"), "limit_1_over_d", 1),
        BenchFigure(key, rf"(sparse forward \+ backward >= 0\.5/d = ){NUM}(x)", at("fast"), "goal_fwd_bwd_0_5_over_d", 2),
    ]
    return out


def _moba(key: str) -> list[BenchFigure]:
    """The learned pattern (MoBA) against the fixed pattern's fast kernel at N=8192."""
    row = lambda rows, impl: _pick(rows, impl=impl, N=8192)  # noqa: E731
    # time ratio per kept pair = (t_moba / t_fast) x (d_fast / d_moba): each kernel's time over the pairs it keeps
    per_pair = lambda r: (row(r, "moba")["median_ms"] / row(r, "fast")["median_ms"]  # noqa: E731
                          * row(r, "fast")["density"] / row(r, "moba")["density"])
    # share of the sparse limit = speed-up x density (the limit is 1/d)
    of_limit = lambda r: row(r, "fast")["speedup_vs_sdpa"] * row(r, "fast")["density"]  # noqa: E731
    lab = "N=8192, learned pattern: "
    mob, fast = (("impl", "moba"), ("N", 8192)), (("impl", "fast"), ("N", 8192))
    return [
        BenchFigure(key, rf"({lab}forward \*\*){NUM}(x\*\* the fixed pattern's time)", mob, "median_ms", 2, over=fast),
        BenchFigure(key, rf"({lab}[^|]*?at density ){NUM}( vs )", mob, "density", 3),
        BenchFigure(key, rf"({lab}[^|]*?at density [\d.]+ vs ){NUM}( \()", fast, "density", 3),
        BenchFigure(key, rf"({lab}[^|]*?\(){NUM}(x per kept pair\))", (), "", 2, fn=per_pair),
        BenchFigure(key, rf"({lab}[^|]*?forward \+ backward \*\*){NUM}(x\*\*)", mob, "fwd_bwd_ms", 2, over=fast),
        BenchFigure(key, rf"({lab}[^|]*?the fixed `fast` kernel ){NUM}(x SDPA)", fast, "speedup_vs_sdpa", 2),
        BenchFigure(key, rf"({lab}[^|]*?x SDPA = \*\*){NUM}( of 1/d\*\*)", (), "", 2, fn=of_limit),
    ]


def _moe(fast: str, full: str) -> list[BenchFigure]:
    """MoE grouped dispatch against the fastest HF Mixtral block, per size, fast and full mode."""
    out = []
    for key, label, sizes in ((fast, "fast: ", ((256, 8, 2), (512, 8, 2), (512, 16, 4))),
                              (full, "full: ", ((512, 8, 2), (2048, 8, 2), (2048, 16, 2), (2048, 16, 4), (8192, 8, 2)))):
        for n, e, k in sizes:
            m = (("impl", "grouped"), ("tokens", n), ("experts", e), ("top_k", k))
            out.append(BenchFigure(key, rf"({label}[^|]*?{n} tokens, {e} experts top-{k} \*\*){NUM}(x\*\*)", m,
                                   "speedup_vs_fastest_hf", 2))
    # the largest difference of any implementation's output from the reference loop's, both modes
    out.append(BenchFigure(full, rf"(max abs diff from the reference loop ){NUM}( x 1e-6)", (), "", 1,
                           fn=lambda rows: 1e6 * max(float(r["max_abs_diff"]) for r in rows)))
    return out


def _llama_cpp(key: str, lead: str, streams: bool = False) -> list[BenchFigure]:
    """Batch-1 decode and prefill of FastDecoder and llama.cpp after 128- and 512-token prompts (each
    line begins with ``lead``: the weights and threads, e.g. "F32, 1 thread, "), and (``streams``)
    8 streams at once: the serving engine's and llama.cpp's throughput and their ratio."""
    out = []
    for L in (128, 512):
        fd = (("scenario", "llama_cpp"), ("impl", "codex_lab_fast_decode"), ("prompt_len", L))
        lc = (("scenario", "llama_cpp"), ("impl", "llama_cpp"), ("prompt_len", L))
        head = rf"{lead}after a {L}-token prompt: "
        out += [
            BenchFigure(key, rf"({head}FastDecoder ){NUM}( tokens/s)", fd, "decode_tokens_per_s"),
            BenchFigure(key, rf"({head}[^|\n]*?llama\.cpp ){NUM}( tokens/s)", lc, "decode_tokens_per_s"),
            BenchFigure(key, rf"({head}[^|\n]*?\*\*){NUM}(x\*\* llama\.cpp's decode)", fd,
                        "decode_ratio_vs_llama_cpp", 2),
            BenchFigure(key, rf"({head}[^|\n]*?prefill ){NUM}(x llama\.cpp's)", fd,
                        "prefill_ratio_vs_llama_cpp", 2),
            # llama.cpp built from source for this CPU (llama-bench), in the same rounds
            BenchFigure(key, rf"({head}[^|\n]*?built from source ){NUM}( tokens/s)",
                        (("scenario", "llama_cpp"), ("impl", "llama_cpp_native"), ("prompt_len", L)), "decode_tokens_per_s"),
            BenchFigure(key, rf"({head}[^|\n]*?\*\*){NUM}(x\*\* the source build's decode)", fd,
                        "decode_ratio_vs_llama_native", 2),
        ]
    if not streams:
        return out
    stream = (("scenario", "llama_cpp_streams"),)
    return out + _throughput_pair(key, "8 streams at once: ", "the serving engine", (*stream, ("impl", "codex_lab_engine")),
                                  r"llama\.cpp", (*stream, ("impl", "llama_cpp")), "ratio_vs_llama_cpp")


def _throughput_pair(key: str, lead: str, ours_words: str, ours: tuple[tuple[str, Any], ...], theirs_words: str,
                     theirs: tuple[tuple[str, Any], ...], ratio_field: str) -> list[BenchFigure]:
    """The line ``LEAD OURS N tokens/s, THEIRS N tokens/s: **Rx** THEIRS's throughput``: both
    tokens/s and the ratio (``ratio_field`` of our row). ``theirs_words`` is a regular expression."""
    return [
        BenchFigure(key, rf"({lead}{ours_words} ){NUM}( tokens/s)", ours, "tokens_per_s"),
        BenchFigure(key, rf"({lead}[^|]*?{theirs_words} ){NUM}( tokens/s)", theirs, "tokens_per_s"),
        BenchFigure(key, rf"({lead}[^|]*?\*\*){NUM}(x\*\* {theirs_words}'s throughput)", ours, ratio_field, 2),
    ]


def _llama_server(key: str, how: str = "") -> list[BenchFigure]:
    """codex-lab serve and llama-server under the same load over HTTP: tokens/s at 1 and 8 clients and
    their ratio (``how``: words after "over HTTP", e.g. ", the engine in its own process")."""
    return [fig for c in (1, 8)
            for fig in _throughput_pair(key, rf"{c} client[s]? over HTTP{how}: ", "`codex-lab serve`",
                                        (("impl", "codex_lab_serve"), ("concurrency", c)), "llama-server",
                                        (("impl", "llama_server"), ("concurrency", c)), "ratio_vs_llama_server")]


def _answers(key: str, how: str = "") -> list[BenchFigure]:
    """The answers' checks of a serving record against llama-server (``how`` as in
    :func:`_llama_server`): prompts with the same text on both servers, batched answers equal to
    the same server's answer alone, and answers under load at 8 clients equal to their prompt's
    commonest answer, on each server."""
    ours, theirs = (("impl", "codex_lab_serve"), ("concurrency", 8)), (("impl", "llama_server"), ("concurrency", 8))
    lead = rf"answers{how}: "
    pairs = [("same text on", "prompts", ours, "answers_same_as_peer", "answers_compared"),
             ("in a full batch,", "of `codex-lab serve`'s answers equalled", ours, "answers_batched_same_as_alone",
              "answers_batched"),
             ("answers alone and", "of llama-server's;", theirs, "answers_batched_same_as_alone", "answers_batched"),
             ("under load at 8 clients,", "of `codex-lab serve`'s answers and", ours, "answers_consistent",
              "answers_under_load"),
             ("answers and", "of llama-server's were", theirs, "answers_consistent", "answers_under_load")]
    out = []
    for before, after, row, k, n in pairs:
        out += [BenchFigure(key, rf"({lead}[^|]*?{before} \*\*){NUM}( of )", row, k),
                BenchFigure(key, rf"({lead}[^|]*?{before} \*\*\d+ of ){NUM}(\*\* {after})", row, n)]
    return out


def _single_stream(key: str) -> list[BenchFigure]:
    """One stream: FastDecoder's tokens/s, the serving engine's with and without its one-row shape (in
    process), and through ``codex-lab serve`` over HTTP with what HTTP adds per token."""
    fd, solo, pad = (("impl", "fast_decode"),), (("impl", "engine_solo"),), (("impl", "engine_padded"),)
    http = (("impl", "serve_http"),)
    return [
        BenchFigure(key, rf"(one stream in process: FastDecoder ){NUM}( tokens/s)", fd, "tokens_per_s"),
        BenchFigure(key, rf"(one stream in process: [^|]*?one-row shape ){NUM}( tokens/s)", solo, "tokens_per_s"),
        BenchFigure(key, rf"(one stream in process: [^|]*?\*\*){NUM}(x\*\* FastDecoder's)", solo, "vs_fast_decode", 2),
        BenchFigure(key, rf"(one stream in process: [^|]*?padded to 8 rows ){NUM}( tokens/s)", pad, "tokens_per_s"),
        BenchFigure(key, rf"(one stream in process: [^|]*?model step ){NUM}( ms per token)", solo, "step_ms_per_token", 2),
        BenchFigure(key, rf"(one stream through `codex-lab serve`: ){NUM}( tokens/s)", http, "tokens_per_s"),
        BenchFigure(key, rf"(one stream through `codex-lab serve`: [^|]*?\*\*){NUM}(x\*\* FastDecoder's)", http,
                    "vs_fast_decode", 2),
        BenchFigure(key, rf"(one stream through `codex-lab serve`: [^|]*?HTTP adds ){NUM}( ms per token)", http,
                    "http_ms_per_token", 2),
        BenchFigure(key, rf"(one stream through `codex-lab serve --engine-process`: ){NUM}( tokens/s)",
                    (("impl", "serve_http_process"),), "tokens_per_s"),
        BenchFigure(key, rf"(one stream through `codex-lab serve --engine-process`: [^|\n]*?\*\*){NUM}(x\*\* FastDecoder's)",
                    (("impl", "serve_http_process"),), "vs_fast_decode", 2),
    ]


def _restart(key: str) -> list[BenchFigure]:
    """``codex-lab serve`` from the command to GET /ready 200: a cold start (an empty compile cache:
    the three graphs built) and a restart over the same cache (loaded)."""
    return [BenchFigure(key, rf"({run} start[^|\n]*?: ready in ){NUM}( s)", (("run", run),), "ready_s", 1)
            for run in ("cold", "warm")]


def _token_profile(key: str) -> list[BenchFigure]:
    """A lone stream under torch.profiler (the graphs' kernels profiled one by one): ms per token
    of FastDecoder (compiled) and the serving engine's one-row step, unprofiled, and each one's
    matmuls, attention, compiled graph's own code and Python."""
    out = []
    for who, anchor in ((("impl", "fast_decode"),), r"FastDecoder compiled "), ((("impl", "engine_solo"),), r"[^|]*?one-row step "):
        head = rf"(under torch\.profiler: {anchor}"
        out += [BenchFigure(key, head + rf"){NUM}( ms per token)", who, "unprofiled_ms_per_token", 2)]
        for words, field in (("matmuls ", "matmul_ms_per_token"), ("attention ", "attention_ms_per_token"),
                             ("the compiled graph's own code ", "graph_ms_per_token"),
                             ("Python and guards ", "python_ms_per_token")):
            out.append(BenchFigure(key, head + rf"[^|;]*?{words}){NUM}( ms)", who, field, 2))
    return out


def _native_profile(key: str) -> list[BenchFigure]:
    """Both engines' decode under Linux perf: wall and CPU ms per token, and the CPU ms of each one's
    matmuls, attention, runtime (the code between kernels), Python and code perf cannot name (an
    ahead-of-time package's kernels); the ratios of FastDecoder's CPU time to llama.cpp's, in all
    and outside the kernels (runtime and Python against llama.cpp's graph scheduling)."""
    out = []
    for who, name in ((("impl", "codex_lab_fast_decode"),), "FastDecoder"), ((("impl", "llama_cpp_native"),), "llama.cpp"):
        head = rf"(under perf, decode only: {name} "
        out += [BenchFigure(key, head + rf"){NUM}( ms per token)", who, "wall_ms_per_token", 2),
                BenchFigure(key, head + rf"[^|;]*?CPU ){NUM}( ms)", who, "cpu_ms_per_token", 2)]
        for words, field in (("matmuls ", "matmul_ms_per_token"), ("attention ", "attention_ms_per_token"),
                             ("unnamed ", "unresolved_ms_per_token"), ("runtime ", "runtime_ms_per_token"),
                             ("Python ", "python_ms_per_token")):
            out.append(BenchFigure(key, head + rf"[^|;]*?{words}){NUM}( ms)", who, field, 2))

    def ratio(*fields: str) -> Callable[[list[dict[str, Any]]], float]:
        # FastDecoder's CPU ms per token in `fields` over llama.cpp's, both rows of the same run
        def fn(rows: list[dict[str, Any]]) -> float:
            ours = _pick(rows, impl="codex_lab_fast_decode")
            theirs = _pick(rows, impl="llama_cpp_native")
            return sum(float(ours[f]) for f in fields) / sum(float(theirs[f]) for f in fields)
        return fn

    out += [
        BenchFigure(key, rf"([Uu]nder perf, FastDecoder's decode takes\s+\*\*){NUM}(x\*\* llama\.cpp's CPU time)", (),
                    "", 2, fn=ratio("cpu_ms_per_token")),
        BenchFigure(key, rf"(the interpreter around each step, takes\s+\*\*){NUM}(x\*\* llama\.cpp's graph scheduling)",
                    (), "", 1, fn=ratio("runtime_ms_per_token", "python_ms_per_token")),
    ]
    return out


def _readme_peer() -> list[BenchFigure]:
    """The README's one line on llama.cpp: batch-1 decode against llama-bench (F32, one thread, after
    a 128-token prompt) and ``codex-lab serve`` against llama-server at one client and at eight."""
    fd = (("scenario", "llama_cpp"), ("impl", "codex_lab_fast_decode"), ("prompt_len", 128))
    return [
        BenchFigure("llama_cpp", rf"(batch-1 decode after a 128-token prompt at \*\*){NUM}(x\*\* llama-bench's)", fd,
                    "decode_ratio_vs_llama_native", 2),
        BenchFigure("serving_llama_cpp", rf"(`codex-lab serve` at ){NUM}(x llama-server's with one client)",
                    (("impl", "codex_lab_serve"), ("concurrency", 1)), "ratio_vs_llama_server", 2),
        BenchFigure("serving_llama_cpp", rf"(llama-server's with one client and ){NUM}(x with eight)",
                    (("impl", "codex_lab_serve"), ("concurrency", 8)), "ratio_vs_llama_server", 2),
    ]


BENCH_FIGURES: list[BenchFigure] = [
    *_readme_peer(),
    *_llama_cpp("llama_cpp", "F32, 1 thread, ", streams=True),
    *_llama_cpp("llama_cpp_2threads", "F32, 2 threads, "),
    *_llama_cpp("llama_cpp_q8_0", "8-bit, 1 thread, "),
    *_llama_cpp("llama_cpp_q8_0_2threads", "8-bit, 2 threads, "),
    *_restart("restart"),
    *_native_profile("native_profile"),
    *_single_stream("single_stream"),
    *_token_profile("token_profile"),
    *_llama_server("serving_llama_cpp"),
    *_llama_server("serving_llama_cpp_process", ", the engine in its own process"),
    *_answers("serving_llama_cpp"),
    *_answers("serving_llama_cpp_process", ", the engine in its own process"),
    *_attention("attention"),
    *_moba("moba"),
    *_moe("moe_fast", "moe_full"),
    *_code_edit("code_edit"),
    *_batching("batching", "16 slots"),
    *_batching("batching_8slots", "8 slots"),
    *_decode("decode", "2 threads"),
    *_decode("decode_1thread", "1 thread"),
    *_aot_decode("decode_1thread", "1 thread"),
    *_serving("serving", "prompts in the step,"),
    *_serving("serving_batched", "batched eager prefill,"),
    *_serving("serving_reference", "one forward per request,"),
]



def record_bench(key: str, rows: list[dict[str, Any]], command: str, conditions: str, measured: str,
                 path: Path = BENCH_RECORD) -> None:
    """Store a bench's ``--json`` rows under ``key`` (checked against the figures that read them first)."""
    for fig in BENCH_FIGURES:
        if fig.key == key:
            fig.value(rows)  # raises, naming the row, if the rows lack what a figure reads
    rec = bench_record(path)
    rec[key] = {"command": command, "measured": measured, "conditions": conditions, "rows": rows}
    path.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
