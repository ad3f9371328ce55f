"""Report section for lesson 06: KV-cache growth, the cache ladder, batching, TTFT/TBT, speculative."""

from __future__ import annotations

from typing import Any

from codex_lab.stats import FAILS, FAILS_AS_STATED, HOLDS

import torch

TITLE = "Lesson 06: fast inference"
ORDER = 6


def run(ctx: Any) -> str:
    from codex_lab.lessons.l06_inference import bench
    from codex_lab.nn.accounting import kv_bytes_per_token
    from codex_lab.nn.kv_cache import make_static_caches
    pick = ctx.pick  # sizes for the run's mode

    ck = ctx.checkpoint()
    model, tok, cfg = ck.model.cpu().eval(), ck.tokenizer, ck.config
    threads = torch.get_num_threads()
    grad = torch.is_grad_enabled()
    # a tiny model's ops are too small to share between threads (measured in lesson 06)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    try:
        out = []
        per_tok = kv_bytes_per_token(cfg)
        sizes = {n: sum(c.nbytes() for c in make_static_caches(cfg, 1, n)) for n in (256, 512, 1024)}
        linear = all(b == n * per_tok for n, b in sizes.items())
        out.append(f"KV cache: {per_tok:,} bytes per token (2 x {cfg.n_layer} layers x {cfg.n_kv_head} KV heads x "
                   f"{cfg.head_dim} x 4 B); " + ", ".join(f"{n} tokens = {b / 2**20:.1f} MiB" for n, b in sizes.items()) + ".")
        # a preallocated cache holds n x bytes-per-token by construction: a figure, not a verdict
        assert linear, sizes
        ctx.measure("KV cache bytes per token", f"{per_tok:,} B/token, exactly linear: "
                    + ", ".join(f"{b / 2**20:.0f} MiB at {n}" for n, b in sizes.items()), lesson="06")

        ladder = bench.bench_cache(model, [pick(fast=128, full=512)], pick(fast=16, full=64))
        by = {r["impl"]: r["tokens_per_s"] for r in ladder}
        out.append("\n| decode after a {}-token prompt | tokens/s |\n|---|---|\n".format(ladder[0]["prompt_len"])
                   + "\n".join(f"| {k} | {v:.1f} |" for k, v in by.items()))
        st = next(r for r in ladder if r["impl"] == "static_cache")
        out.append(f"\nStatic cache vs no cache: {st['vs_no_cache_median']:.1f}x (per-round range {st['vs_no_cache_lo']:.1f}-"
                   f"{st['vs_no_cache_hi']:.1f}x over {st['rounds']} interleaved rounds; same tokens, asserted).")

        srow, done = bench.bench_streams(model, tok, pick(fast=8, full=32), streams=4, new_tokens=pick(fast=32, full=64))
        s = srow[0]
        met = s["ttft_p95_ms"] < 100 and s["tbt_p95_ms"] < 20
        out.append(f"\n4 concurrent streams ({s['prompt_len']}-token prompts): TTFT p50/p95 {s['ttft_p50_ms']:.0f}/{s['ttft_p95_ms']:.0f} ms, "
                   f"TBT p50/p95 {s['tbt_p50_ms']:.1f}/{s['tbt_p95_ms']:.1f} ms, {s['tokens_per_s']:.0f} tokens/s, "
                   f"{torch.get_num_threads()} CPU thread.")
        # the targets are judged once, on the served system (lesson 07's rows); the engine in process is a figure
        ctx.measure("TTFT / TBT of the engine in process (the targets are judged through the server, lesson 07)",
                    f"tiny model, 4 streams, CPU: TTFT p95 {s['ttft_p95_ms']:.0f} ms, TBT p95 {s['tbt_p95_ms']:.1f} ms "
                    f"({'within' if met else 'outside'} 100 / 20 ms)", lesson="06")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
        axes[0].hist([f.ttft * 1000 for f in done], bins=15); axes[0].axvline(100, color="r"); axes[0].set_xlabel("TTFT (ms)")
        axes[1].hist([x * 1000 for f in done for x in f.tbt], bins=30); axes[1].axvline(20, color="r"); axes[1].set_xlabel("TBT (ms)")
        out.append("\n" + ctx.savefig(fig, "l06_ttft_tbt"))

        out.append("\n" + speculative_section(ctx))
        torch.set_num_threads(threads)  # the goals are measured as `codex-lab bench inference` runs
        goals, recs = performance_goals(ctx)
        out.append("\n" + batching_claim(ctx, [r for r in recs if r.get("scenario") == "batching"]))
        out.append("\n" + goals)
        out.append("\n" + peer_lines())
        out.append("\n" + single_stream_lines())
        out.append("\n" + token_profile_lines())
        out.append("\n" + native_profile_lines())
        return "\n".join(out)
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)


def batching_verdict(vs_one: float, vs_static: float, lower_ttft: bool) -> str:
    """"Improved batch scheduling speeds up serving": fails when batching buys <= 1.2x over one
    request at a time; holds when continuous batching is also ahead of static batching on
    throughput (>= 1x) and on median TTFT; fails as stated in between (batching helps, but the
    "improved" scheduler is not ahead of plain static batching on both)."""
    if vs_one <= 1.2:
        return FAILS
    return HOLDS if lower_ttft and vs_static >= 1 else FAILS_AS_STATED


def batching_claim(ctx: Any, rows: list[dict[str, Any]]) -> str:
    """The batching claim from the performance goals' own batching run (one measurement: the
    claim's ratio and the 3x goal's ratio are the same median of per-round ratios), and its table."""
    b = {r["impl"]: r for r in rows}
    cont, stat = b["continuous_batching"], b["static_batching"]
    ratio = cont["vs_one_median"]
    vs_static = cont["tokens_per_s"] / stat["tokens_per_s"]
    lower_ttft = cont["ttft_p50_ms"] < stat["ttft_p50_ms"]
    ctx.claim("Improved batch scheduling speeds up serving",
              f"continuous batching {ratio:.2f}x one-at-a-time throughput (median of per-round ratios, the run behind the "
              f"3x performance goal); vs static batching {vs_static:.2f}x throughput and TTFT p50 {cont['ttft_p50_ms']:.0f} vs "
              f"{stat['ttft_p50_ms']:.0f} ms ({cont['requests']} mixed requests, same tokens per request)",
              batching_verdict(ratio, vs_static, lower_ttft), lesson="06")
    return ("| batching ({} mixed requests, {} slots) | tokens/s | TTFT p50 ms | TTFT p95 ms | TBT p95 ms |\n|---|---|---|---|---|\n".format(
            cont["requests"], cont["max_batch_size"])
            + "\n".join(f"| {r['impl']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} | "
                        f"{r['tbt_p95_ms']:.1f} |" for r in rows))


def performance_goals(ctx: Any) -> tuple[str, list[dict[str, Any]]]:
    """The course's decoding goals: batch-1 decode at least 2x HF generate and 1.5x HF generate
    with a static cache + torch.compile (same tokens, compiled once), prompt lookup at least
    1.5x plain decoding on code edits, continuous batching at least 3x one request at a time."""
    from codex_lab.course.benches import run_bench

    # the batching scenario's engine with the compiled step (what `codex-lab serve` runs) only in full mode:
    # compiling its 9 decode buckets took 102.6 s of the standard report's 26.7 min on 2 CPU cores
    # (2026-12-03); lesson 07 measures the server's compiled engine
    argv = ["--scenarios", "decode,code_edit,batching"] + ([] if ctx.mode == "full" else ["--no-compile"])
    recs = run_bench("inference", argv, ctx.run_mode)
    dec = next(r for r in recs if r.get("impl") == "codex_lab_fast_decode")
    tail = (f"{dec['tokens_per_s']:.0f} tokens/s, same tokens {dec['same_tokens']}, {dec.get('recompiles')} recompiles, "
            f"compile {dec.get('compile_s', 0):.1f} s")
    lines = []
    for base, target in (("hf_generate", 2.0), ("hf_generate_static_compile", 1.5)):
        if f"speedup_vs_{base}" in dec:
            lines.append(ctx.goal(f"decode, batch 1: FastDecoder vs {base}", dec[f"speedup_vs_{base}"], target, tail, lesson="06"))
    pl = next(r for r in recs if r.get("scenario") == "code_edit" and "speedup_vs_plain" in r)
    cont = next((r for r in recs if r.get("scenario") == "code_continuation" and "speedup_vs_plain" in r), None)
    more = "" if cont is None else (
        f"; on held-out files continued (prompts not built to be copied) {cont['speedup_vs_plain']:.2f}x, acceptance "
        f"{cont['acceptance_rate']:.2f}, same tokens {cont['same_tokens']}")
    lines.append(ctx.goal("prompt-lookup decoding vs plain decoding on code edits", pl["speedup_vs_plain"], 1.5,
                          f"acceptance {pl['acceptance_rate']:.2f}, same tokens {pl['same_tokens']}{more}", lesson="06"))
    b = {r["impl"]: r for r in recs if r.get("scenario") == "batching"}
    if "continuous_batching" in b and "one_at_a_time" in b:
        c = b["continuous_batching"]
        tail = f"{c.get('requests', '?')} mixed requests, {c.get('max_batch_size', '?')} slots"
        fast = b.get("continuous_batching_compiled")
        if fast is not None:  # the engine's compiled fixed-shape step, what `codex-lab serve` runs
            tail += (f"; with the compiled decode step {fast['tokens_per_s'] / c['tokens_per_s']:.2f}x the eager engine "
                     f"({len(fast['buckets'])} buckets compiled in {fast['compile_s']:.1f} s, {fast['recompiles']} recompiles)")
        lines.append(ctx.goal("continuous batching vs one request at a time", c["vs_one_median"], 3.0,
                              tail + " (the batching claim's ratio: one measurement)", lesson="06"))
    return (f"Performance goals (`codex-lab bench inference {' '.join(argv)}`):\n\n- " + "\n- ".join(lines)), recs


def peer_lines(record: dict[str, Any] | None = None) -> str:
    """llama.cpp against FastDecoder on the same GGUF: the recorded run of
    ``codex-lab bench inference --peer llama.cpp`` (bench_records.json, key ``llama_cpp``), labelled
    as recorded, with its date and conditions; how to measure it here when none is recorded."""
    from codex_lab.course.bench_figures import bench_record

    rec = (record if record is not None else bench_record()).get("llama_cpp")
    if not rec:
        return ("llama.cpp as a peer: not recorded; `bash scripts/get_llama_cpp.sh` then "
                "`codex-lab bench inference --peer llama.cpp` measures it on this machine.")
    rows = {(r["impl"], r["prompt_len"]): r for r in rec["rows"] if "impl" in r and r.get("scenario") == "llama_cpp"}
    lines = [f"llama.cpp as a peer (recorded {rec['measured']}, not this run: `{rec['command']}`, {rec['conditions']}; "
             "F32 GGUF of the same model, one math thread each; rerun it here with `bash scripts/get_llama_cpp.sh` "
             "then the command):", ""]
    for L in sorted({k[1] for k in rows}):
        fd, lc = rows[("codex_lab_fast_decode", L)], rows[("llama_cpp", L)]
        lines.append(f"- after a {L}-token prompt: decode FastDecoder {fd['decode_tokens_per_s']:.0f} tokens/s (rounds "
                     f"{fd['decode_min']:.0f}-{fd['decode_max']:.0f}) vs llama.cpp {lc['decode_tokens_per_s']:.0f} "
                     f"({lc['decode_min']:.0f}-{lc['decode_max']:.0f}): {fd['decode_ratio_vs_llama_cpp']:.2f}x; prefill "
                     f"{fd['prefill_ratio_vs_llama_cpp']:.2f}x; same {fd['new_tokens']} greedy tokens: {lc['same_tokens']} "
                     f"(llama.cpp {lc.get('llama_llama_cpp_release')}, node-llama-cpp {lc.get('llama_node_llama_cpp')}, "
                     "a prebuilt generic build)")
        nat = rows.get(("llama_cpp_native", L))
        if nat:  # llama-bench of llama.cpp built from source for this CPU, in the same rounds
            lines.append(f"  - llama.cpp built from source here (llama-bench, build {nat.get('llama_build_commit')}; speed "
                         f"only, no tokens): decode {nat['decode_tokens_per_s']:.0f} tokens/s ({nat['decode_min']:.0f}-"
                         f"{nat['decode_max']:.0f}), prefill {nat['prefill_tokens_per_s']:.0f}: FastDecoder "
                         f"{fd['decode_ratio_vs_llama_native']:.2f}x its decode, {fd['prefill_ratio_vs_llama_native']:.2f}x "
                         "its prefill")
    streams = {r["impl"]: r for r in rec["rows"] if r.get("scenario") == "llama_cpp_streams" and "impl" in r}
    if streams:
        ours, lc = streams["codex_lab_engine"], streams["llama_cpp"]
        lines.append(f"- {ours['streams']} streams at once ({ours['prompt_len']}-token prompts, {ours['new_tokens']} greedy "
                     f"tokens each, prefill included, in process: no HTTP on either side): the serving engine "
                     f"{ours['tokens_per_s']:.0f} tokens/s (rounds {ours['tokens_per_s_min']:.0f}-{ours['tokens_per_s_max']:.0f}) "
                     f"vs llama.cpp with {lc['streams']} parallel sequences (node-llama-cpp batches them) {lc['tokens_per_s']:.0f} "
                     f"({lc['tokens_per_s_min']:.0f}-{lc['tokens_per_s_max']:.0f}): {ours['ratio_vs_llama_cpp']:.2f}x; "
                     f"streams with the same tokens: {ours['same_streams']} of {ours['streams']} (shortest common "
                     f"prefix {ours['shortest_common_prefix']})")
    else:
        lines.append("- 8 streams at once: not in this record; `codex-lab bench inference --peer llama.cpp` measures it")
    every = record if record is not None else bench_record()
    for key, label in PEER_VARIANTS.items():  # the same comparison at other weights and threads
        other = every.get(key)
        if not other:
            continue
        by = {(r["impl"], r["prompt_len"]): r for r in other["rows"] if r.get("scenario") == "llama_cpp" and "impl" in r}
        parts = []
        for L in sorted({k[1] for k in by}):
            fd, nat = by[("codex_lab_fast_decode", L)], by.get(("llama_cpp_native", L))
            vs = (f" vs the source build {nat['decode_tokens_per_s']:.0f} ({nat['decode_min']:.0f}-{nat['decode_max']:.0f}): "
                  f"{fd['decode_ratio_vs_llama_native']:.2f}x" if nat else "")
            parts.append(f"after {L} tokens FastDecoder {fd['decode_tokens_per_s']:.0f} tokens/s ({fd['decode_min']:.0f}-"
                         f"{fd['decode_max']:.0f}){vs}")
        lines.append(f"- {label} (recorded {other['measured']}: `{other['command']}`): " + "; ".join(parts))
    served = False
    for key, how in (("serving_llama_cpp", ""), ("serving_llama_cpp_process", ", the engine in a process of its own")):
        srv = every.get(key)
        if not srv:  # the servers over HTTP (codex-lab bench serving --peer llama.cpp)
            continue
        by = {(r.get("impl"), r.get("concurrency")): r for r in srv["rows"]}
        for c in sorted({k[1] for k in by if k[0] == "codex_lab_serve"}):
            ours, lc = by[("codex_lab_serve", c)], by.get(("llama_server", c))
            if lc:
                served = True
                lines.append(f"- {c} client(s) over HTTP{how} (recorded {srv['measured']}: `{srv['command']}`): "
                             f"`codex-lab serve` {ours['tokens_per_s']:.0f} tokens/s ({ours['tokens_per_s_min']:.0f}-"
                             f"{ours['tokens_per_s_max']:.0f}) vs llama-server {lc['tokens_per_s']:.0f} "
                             f"({lc['tokens_per_s_min']:.0f}-{lc['tokens_per_s_max']:.0f}): {ours['ratio_vs_llama_server']:.2f}x")
        top = max((k[1] for k in by if k[0] == "codex_lab_serve"), default=None)
        ours, lc = by.get(("codex_lab_serve", top)), by.get(("llama_server", top))
        if ours and lc and "answers_compared" in ours:  # the answers compared (records from 2026-12-07 on)
            lines.append(answers_line(ours, lc, top, how))
    if not served:
        lines.append("- over HTTP: not recorded; `bash scripts/build_llama_cpp.sh` then `codex-lab bench serving --compiled "
                     "--peer llama.cpp` measures `codex-lab serve` against llama-server")
    return "\n".join(lines)


def answers_line(ours: dict[str, Any], theirs: dict[str, Any], clients: int, how: str = "") -> str:
    """One line of a serving record's answer checks (:func:`codex_lab.lessons.l07_serving.bench.answer_checks`):
    ``ours`` / ``theirs`` the codex-lab serve / llama-server rows at ``clients`` clients."""
    differ = ", ".join(f"{p!r} from character {i}" for p, i in ours["answers_differ"].items())
    return (f"- answers{how}: the same text on {ours['answers_same_as_peer']} of {ours['answers_compared']} prompts"
            + (f" (they part: {differ})" if differ else "")
            + f"; a full batch left {ours['answers_batched_same_as_alone']} of {ours['answers_batched']} of "
              f"`codex-lab serve`'s answers as they were alone, {theirs['answers_batched_same_as_alone']} of "
              f"{theirs['answers_batched']} of llama-server's; under load at {clients} clients "
              f"{ours['answers_consistent']} of {ours['answers_under_load']} and {theirs['answers_consistent']} of "
              f"{theirs['answers_under_load']} were their prompt's commonest answer")


# the batch-1 comparison's other recorded runs (scripts/record_benches.sh): key -> what differs
PEER_VARIANTS = {"llama_cpp_2threads": "F32, 2 threads each",
                 "llama_cpp_q8_0": "8-bit weights (ours int8 per output row, llama.cpp Q8_0), 1 thread each",
                 "llama_cpp_q8_0_2threads": "8-bit weights, 2 threads each"}


def restart_lines(record: dict[str, Any] | None = None) -> str:
    """``codex-lab serve`` from the command to ready (``python scripts/restart_time.py``, key
    ``restart``): a cold start builds the three compiled graphs, a restart loads them."""
    from codex_lab.course.bench_figures import bench_record

    rec = (record if record is not None else bench_record()).get("restart")
    if not rec:
        return "Time to ready: not recorded; `python scripts/restart_time.py` measures a cold start and a restart here."
    lines = [f"`codex-lab serve` from the command to GET /ready 200 (recorded {rec['measured']}, not this run: "
             f"`{rec['command']}`, {rec['conditions']}):"]
    for r in rec["rows"]:
        what = "an empty compile cache: the graphs built" if r["run"] == "cold" else "the same cache: the graphs loaded"
        lines.append(f"- {r['run']} ({what}): answering (eager) after {r.get('loaded_s', '-')} s, ready with the compiled "
                     f"step after {r.get('ready_s', '-')} s (graphs {r.get('graphs')})")
    return "\n".join(lines)


LOOKUP_GOAL = 1.3  # prompt lookup on the compiled decoder: tokens/s over FastDecoder's package, same tokens


def code_edit_lines(record: dict[str, Any] | None = None) -> str:
    """Prompt lookup on the compiled decoder against FastDecoder's package: the recorded run of
    ``codex-lab bench --mode full inference --scenarios code_edit`` (key ``code_edit``), per
    prompt kind, with what caps it: the decode rounds whose lookup matched nothing, and a verify's
    cost in one-token steps (what each round chose its draft length by); how to measure it here
    when none is recorded."""
    from codex_lab.course.bench_figures import bench_record

    rec = (record if record is not None else bench_record()).get("code_edit")
    rows = [r for r in (rec or {}).get("rows", []) if str(r.get("impl", "")).startswith("prompt_lookup_fast")]
    if not rows:
        return ("Prompt lookup on the compiled decoder: not recorded; `codex-lab bench --mode full inference --scenarios "
                "code_edit` measures it on this machine.")
    lines = [f"Prompt lookup on the compiled decoder (recorded {rec['measured']}, not this run: `{rec['command']}`, "
             f"{rec['conditions']}; goal {LOOKUP_GOAL:.2f}x FastDecoder's package, same tokens):", ""]
    kinds = {"code_edit": "edit prompts (a function, then the start of its renamed copy)",
             "code_continuation": "held-out files continued (not built to be copied)"}
    for r in rows:
        cost = r.get("verify_cost_vs_step", {})
        caps = "" if "no_match_share" not in r else (
            f"; the lookup found nothing to copy in {r['no_match_share']:.0%} of the decode rounds (a plain step), and a "
            f"verify of 4 guesses cost {cost.get('4', float('nan')):.2f}x a one-token step")
        ratio = r["speedup_vs_fast_decode"]
        lines.append(f"- {kinds.get(r['scenario'], r['scenario'])}: {ratio:.2f}x, goal {LOOKUP_GOAL:.2f}x: "
                     f"{'met' if ratio >= LOOKUP_GOAL else 'missed'} (rounds "
                     f"{min(r['speedup_rounds']):.2f}-{max(r['speedup_rounds']):.2f}), {r['tokens_per_target_call']:.2f} "
                     f"tokens per target call, acceptance {r['acceptance_rate']:.2f}, same tokens {r['same_tokens']}{caps}")
    return "\n".join(lines)


def single_stream_lines(record: dict[str, Any] | None = None) -> str:
    """One stream through the serving engine against FastDecoder: the recorded run of
    ``codex-lab bench inference --scenarios single_stream --threads 1`` (bench_records.json, key ``single_stream``),
    labelled as recorded, with where the engine's time per token goes; how to measure it here
    when none is recorded."""
    from codex_lab.course.bench_figures import bench_record

    rec = (record if record is not None else bench_record()).get("single_stream")
    if not rec:
        return ("One stream, serving engine vs FastDecoder: not recorded; `codex-lab bench inference --scenarios single_stream --threads 1` "
                "measures it on this machine.")
    rows = {r["impl"]: r for r in rec["rows"]}
    fd = rows["fast_decode"]
    lines = [f"One stream, in process (recorded {rec['measured']}, not this run: `{rec['command']}`, {rec['conditions']}; "
             f"{fd['new_tokens']} greedy tokens after a {fd['prompt_len']}-token prompt, one math thread):", "",
             f"- FastDecoder {fd['tokens_per_s']:.0f} tokens/s (rounds {fd['tokens_per_s_min']:.0f}-"
             f"{fd['tokens_per_s_max']:.0f}), {fd['ms_per_token']:.2f} ms per token"]

    def speed(r: dict[str, Any]) -> str:  # tokens/s, the rounds' range and the ratio to FastDecoder
        return (f"{r['tokens_per_s']:.0f} tokens/s ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}), "
                f"{r['vs_fast_decode']:.2f}x FastDecoder")

    ways = {"engine_solo": "the serving engine with its one-row shape for a request alone (what `codex-lab serve` runs)",
            "engine_padded": "the serving engine with every step padded to its slots",
            "serve_http": "through `codex-lab serve` over HTTP (a streaming client in a process of its own)",
            "serve_http_process": "the same with the engine in a process of its own (`--engine-process`)"}
    for k, label in ways.items():
        r = rows.get(k)
        if r is None:
            continue
        if k.startswith("engine"):
            lines.append(f"- {label}, {r['slots']} slots: {speed(r)}; per token {r['step_ms_per_token']:.2f} ms in the "
                         f"model step, {r['other_ms_per_token']:.2f} ms around it (scheduling, sampling, emitting)")
        else:
            lines.append(f"- {label}: {speed(r)} (goal 0.80x); HTTP, the event loop and streaming add "
                         f"{r['http_ms_per_token']:.2f} ms per token over the engine in process")
    lines.append(f"- same greedy tokens on all: {fd['same_tokens']}. A lone request runs one graph of one row over its "
                 "own block table, compiled as FastDecoder's step is (frozen weights, Inductor's C++ GEMM template); "
                 "padded, the step computes every slot's row (docs/PROFILE.md)")
    return "\n".join(lines)


def token_profile_lines(record: dict[str, Any] | None = None) -> str:
    """Where a lone stream's time per token goes: the recorded run of ``codex-lab bench
    inference --scenarios token_profile --threads 1`` (bench_records.json, key ``token_profile``),
    labelled as recorded; how to measure it here when none is recorded."""
    from codex_lab.course.bench_figures import bench_record
    from codex_lab.measure.token_profile import profile_lines

    rec = (record if record is not None else bench_record()).get("token_profile")
    if not rec:
        return ("Time per token by operator: not recorded; `codex-lab bench inference --scenarios token_profile "
                "--threads 1` measures it on this machine.")
    rows = rec["rows"]
    return "\n".join([f"Where one stream's time per token goes (recorded {rec['measured']}, not this run: "
                      f"`{rec['command']}`, {rec['conditions']}; {rows[0]['new_tokens']} greedy tokens after a "
                      f"{rows[0]['prompt_len']}-token prompt under torch.profiler, operator self time by category; "
                      "'compiled graph' is a graph's own code between its kernels where those are profiled "
                      "one by one, else the whole graph; 'python' is the wall time no operator accounts for, "
                      "inflated by profiling):", "",
                      *profile_lines(rows)])


def native_profile_lines(record: dict[str, Any] | None = None) -> str:
    """What llama.cpp does in a token's time, beside FastDecoder, under one sampling profiler (issue
    41): the recorded run of ``codex-lab bench inference --scenarios native_profile`` (bench_records.json,
    key ``native_profile``), labelled as recorded; how to measure it here when none is recorded."""
    from codex_lab.course.bench_figures import bench_record
    from codex_lab.measure.native_profile import native_lines

    rec = (record if record is not None else bench_record()).get("native_profile")
    if not rec:
        return ("FastDecoder and llama.cpp under one profiler: not recorded; with Linux perf and llama-bench "
                "(`bash scripts/build_llama_cpp.sh`), `codex-lab bench inference --scenarios native_profile` "
                "measures it on this machine.")
    r0 = next(r for r in rec["rows"] if "impl" in r)
    return "\n".join([f"FastDecoder and llama.cpp under Linux perf (recorded {rec['measured']}, not this run: "
                      f"`{rec['command']}`, {rec['conditions']}; {r0['reps']} x {r0['new_tokens']} greedy tokens after "
                      f"a {r0['prompt_len']}-token prompt, the decode steps only (llama.cpp's less a run that only "
                      f"prefills), one thread each, sampled at {r0['freq_hz']} Hz with call chains; CPU ms per decoded "
                      "token by the function running, attention when it runs inside an attention call; wall ms: "
                      "the median of each engine's own timing of its runs, under the profiler):", "",
                      *native_lines(rec["rows"])])


def speculative_section(ctx: Any) -> str:
    """Speculative decoding with the shipped distilled draft: its training state, acceptance per
    prompt type (beside prompt lookup's), the costs c and v, gamma chosen by the formula, and the
    measured speed ratio over plain decoding (eager and compiled) in interleaved rounds."""
    from codex_lab.course.benches import run_bench
    from codex_lab.lessons.l06_inference.draft import distill_loop, draft_meta
    from codex_lab.training.loop import rates_at
    from codex_lab.training_state import training_state

    meta = draft_meta()
    dc = meta["config"]
    curve = [(s, a) for s, a, _ in meta["curve"]]
    # min_change 0.01: one point of held-out agreement, about 0.01 of acceptance; the rates are the
    # distillation's schedule (warm-up, cosine to a tenth of lr: draft.py) at each evaluation
    sched = distill_loop(dc["steps"], dc["lr"], dc["warmup"])
    state = training_state([curve], higher_is_better=True, min_change=0.01, arm="distilled draft",
                           rates=rates_at([s for s, _ in curve], sched))
    # the scenario exactly as a learner reruns it (sizes by mode; the compiled FastDecoder beside it except in fast mode)
    argv = ["--scenarios", "speculative", "--threads", "1"] + (["--no-compile"] if ctx.mode == "fast" else [])
    rows = run_bench("inference", argv, ctx.run_mode)
    acc = [r for r in rows if r["impl"] == "acceptance"]
    sp = next(r for r in rows if r["impl"].startswith("speculative_g"))
    g = sp["gamma"]
    out = [f"Speculative decoding. The draft: {dc['n_layer']} block of the target's width plus the target's own embedding "
           f"and head, distilled from the target (KL to its next-token distribution) for {dc['steps']} steps of "
           f"{dc['batch_size']} x {dc['seq_len']} tokens of the corpus's train split, {dc.get('on_policy', 0):.0%} of them the "
           f"target's own greedy continuations ({meta['train_cpu_s']:.0f} CPU s, shipped: "
           f"`{meta['command']}`). Held-out agreement with the target's greedy token: {curve[0][1]:.2f} untrained (early exit) "
           f"-> {curve[-1][1]:.2f}; {state.describe()}.",
           f"\n| prompt type | prompts | acceptance a (gamma {acc[0]['gamma']}) | tokens per target forward | "
           "prompt lookup: acceptance | prompt lookup: tokens per target forward |\n|---|---|---|---|---|---|\n"
           + "\n".join(f"| {r['prompt_type']} | {r['prompts']} | {r['acceptance_rate']:.2f} | {r['tokens_per_round']:.2f} | "
                       f"{r['lookup_acceptance_rate']:.2f} | {r['lookup_tokens_per_target_call']:.2f} |" for r in acc),
           f"\nAll prompts: a = {sp['acceptance_rate']:.2f}. Costs in target decode steps (alternating rounds, process CPU "
           f"time, eager cached path): a draft step c = {sp['c']:.2f}; verifying gamma + 1 tokens v = "
           + ", ".join(f"{v:.2f} (gamma {k})" for k, v in sp["v_by_gamma"].items())
           + ". Predicted speed-up E[tokens] / (gamma c + v), E[tokens] = (1 - a^(gamma+1)) / (1 - a): "
           + ", ".join(f"{v:.2f}x (gamma {k})" for k, v in sp["predicted_by_gamma"].items())
           + f"; gamma {g} chosen (the largest prediction).",
           f"\nMeasured over {sp['prompts']} prompts x {sp['new_tokens']} tokens, same tokens asserted: at gamma "
           f"{sp['probe_gamma']} (the acceptance runs) {sp['tokens_per_round_probe']:.2f} tokens per target forward (formula "
           f"{sp['expected_tokens_per_round_probe']:.2f}); at gamma {g}: "
           f"{sp['describe_vs_plain']}; in process CPU time {sp['cpu_speedup_vs_plain']:.2f}x (per-round range "
           f"{sp['cpu_speedup_vs_plain_lo']:.2f}-{sp['cpu_speedup_vs_plain_hi']:.2f}x); the formula predicted "
           f"{sp['predicted_speedup']:.2f}x."]
    if "describe_vs_fast_decoder" in sp:
        out.append(f"Against the compiled FastDecoder (plain, batch 1): {sp['describe_vs_fast_decoder']}. Speculative decoding "
                   "runs eagerly here: the compiled fixed-shape step returns the last position's logits only, and a verify "
                   f"forward needs all gamma + 1. Compiled, the draft's step costs c = {sp['c_compiled']:.2f} of the target's, "
                   "so even a verify as cheap as one step "
                   f"(v = 1) would give at most {sp['predicted_speedup_compiled']:.2f}x (gamma {sp['gamma_compiled']}) by the formula.")
    else:
        out.append("The compiled FastDecoder is left out in fast mode (it compiles for tens of seconds); `codex-lab bench "
                   "inference --scenarios speculative` runs it.")
    out.append("\n" + ctx.goal("speculative decoding (distilled draft) vs plain decoding, both eager", sp["speedup_vs_plain"], 1.0,
                               f"per-round range {sp['speedup_vs_plain_lo']:.2f}-{sp['speedup_vs_plain_hi']:.2f}x over {sp['rounds']} "
                               f"interleaved rounds, gamma {g}, a = {sp['acceptance_rate']:.2f}, c = {sp['c']:.2f}; "
                               f"`codex-lab bench inference {' '.join(argv)}`", lesson="06"))
    return "\n".join(out)
