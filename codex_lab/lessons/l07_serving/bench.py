"""``codex-lab bench serving``: what clients of the HTTP server see, by concurrency.

Starts the OpenAI-compatible server (``codex_lab.serve.app``) on a free loopback port with
the shipped model (or ``--checkpoint``), then drives it with ``codex_lab.serve.loadtest`` at each
concurrency, the clients in a process of their own as real clients are
(:func:`~codex_lab.serve.loadtest.run_load_in_process`): one record per level with TTFT/TBT
p50/p95/p99 (ms), the shares within the
seed's targets (100 ms / 20 ms), throughput and errors. All levels run in one process on
one machine, so they compare with each other; absolute numbers depend on the machine.

``--peer llama.cpp`` also starts llama.cpp's own server (``llama-server``, built by
``scripts/build_llama_cpp.sh``) on the same model exported to an F32 GGUF, with as many
parallel slots as the largest level and the same math threads, and drives both servers with
the same clients and prompts, level by level in interleaved rounds (``--rounds``, default 3),
one TCP connection per request on both (llama-server drops kept-alive connections after a
stream), every answer run to ``--max-tokens`` on both (``ignore_eos``: the same work): one row
per server and level with the median throughput and its range, and the ratio. The answers are
compared too (:func:`answer_checks`): per server and level, whether every request for a prompt
got the same text under load; then, untimed, each prompt sent alone and in a full batch to each
server (greedy, each server's own end of generation): whether batching changed any answer, and
on how many prompts the two servers' texts are equal.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from typing import Any

import torch


NAME = "serving"
HELP = "server latency seen by streaming clients at several concurrencies (TTFT/TBT percentiles, SLO shares)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", default="1,4,8", help="comma-separated client counts")
    p.add_argument("--requests", type=int, default=None, help="requests per level (default 4x clients fast, 16x full)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped tiny model)")
    p.add_argument("--threads", type=int, default=None,
                   help="the server's math threads (default: codex_lab.runtime.compute_threads, as `codex-lab serve`)")
    p.add_argument("--compiled", action="store_true",
                   help="the engine `codex-lab serve` runs: compiled decode step (the levels start once every bucket is built)")
    p.add_argument("--prefill", choices=("step", "batched", "each"), default="step",
                   help="how arriving prompts are prefilled: step = as rows of the compiled decode step (with "
                        "--compiled: what `codex-lab serve` runs; else batched), batched = one eager forward for "
                        "all beside the step, each = one eager forward per request (the reference path)")
    p.add_argument("--engine-process", action="store_true",
                   help="the engine in a process of its own (`codex-lab serve --engine-process`): HTTP and the engine "
                        "never wait on one interpreter lock")
    p.add_argument("--peer", choices=("llama.cpp",), default=None,
                   help="also drive llama.cpp's llama-server (scripts/build_llama_cpp.sh builds it) on the same model "
                        "exported to an F32 GGUF, with as many parallel slots as the largest level and the same "
                        "math threads, the same load in interleaved rounds; rows per server and level, with ratios")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of every level (default 1; 3 with --peer): the rows give the median and the range")


def answer_checks(alone: dict[str, dict[str, list[str]]], batched: dict[str, dict[str, list[str]]],
                  ours: str = "codex_lab_serve", peer: str = "llama_server") -> dict[str, dict[str, Any]]:
    """The answers' checks, per server: ``alone`` and ``batched`` map a server to its texts per
    prompt (each prompt sent once alone; every prompt in one full batch).

    ``answers_batched_same_as_alone`` of ``answers_batched``: the batched answers equal to the
    same server's answer to that prompt alone (a batch must not change an answer: the check is
    per request, so two swapped answers fail it). ``answers_same_as_peer`` of
    ``answers_compared``: the prompts whose alone answers are equal on both servers;
    ``answers_differ``: for each other prompt, the character where the two texts part.
    """
    out: dict[str, dict[str, Any]] = {}
    for impl, texts in alone.items():
        ref = {p: ts[0] for p, ts in texts.items() if ts}
        pairs = [(p, t) for p, ts in batched.get(impl, {}).items() for t in ts]
        same = sum(ref.get(p) == t for p, t in pairs)
        out[impl] = {"answers_batched_same_as_alone": same, "answers_batched": len(pairs)}
    if ours in alone and peer in alone:
        a = {p: ts[0] for p, ts in alone[ours].items() if ts}
        b = {p: ts[0] for p, ts in alone[peer].items() if ts}
        prompts = sorted(set(a) | set(b))
        differ = {}
        for p in prompts:
            x, y = a.get(p), b.get(p)
            if x is None or y is None or x != y:  # the first character where they part (a missing answer: 0)
                differ[p] = 0 if x is None or y is None else next(
                    (i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
        for impl in (ours, peer):
            out[impl].update(answers_same_as_peer=len(prompts) - len(differ), answers_compared=len(prompts),
                             answers_differ=differ)
    return out


def consistent_answers(rounds: list[dict[str, list[str]]]) -> tuple[int, int]:
    """(k, n): of the n answers in ``rounds`` (texts per prompt, one dict per round), the k equal
    to the commonest answer to their prompt (greedy decoding under load: k = n when no batch,
    arrival order or round changed an answer)."""
    by: dict[str, list[str]] = {}
    for texts in rounds:
        for p, ts in texts.items():
            by.setdefault(p, []).extend(ts)
    same = sum(max(ts.count(t) for t in set(ts)) for ts in by.values())
    return same, sum(map(len, by.values()))


def bench_engine(model: Any, tokenizer: Any, *, compiled: bool, prefill: str, **kw: Any) -> Any:
    """The server's engine as `codex-lab serve` builds it (module level: an engine process
    unpickles it by name)."""
    from codex_lab.infer.engine.loop import Engine
    from codex_lab.serve.compiled import compiled_engine

    eng = compiled_engine(model, tokenizer, mixed=prefill == "step", **kw) if compiled else Engine(model, tokenizer, **kw)
    eng.batch_prefill = prefill != "each"
    return eng


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained
    from codex_lab.runtime import compute_threads, round_order
    from codex_lab.serve.loadtest import run_load, run_load_in_process
    from codex_lab.infer.engine.runner.options import freeze_long_lived
    from codex_lab.serve.app import serve_in_background
    from codex_lab.serve.router import ModelServer, ServerConfig

    compiled = bool(getattr(args, "compiled", False))
    prefill = getattr(args, "prefill", "step")
    prefill = "batched" if prefill == "step" and not compiled else prefill  # in the step needs the compiled step
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency must list client counts >= 1, got {args.concurrency!r}")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or compute_threads())
    ck = load_checkpoint(args.checkpoint) if args.checkpoint else load_pretrained()
    engines: list[Any] = []
    in_process = bool(getattr(args, "engine_process", False))

    def factory(model: Any, tokenizer: Any, **kw: Any) -> Any:  # the server's engine, as `codex-lab serve` builds it
        eng = bench_engine(model, tokenizer, compiled=compiled, prefill=prefill, **kw)
        engines.append(eng)
        return eng

    srv = ModelServer(ck.tokenizer, ServerConfig(model_name="bench", max_batch_size=max(8, max(levels)),
                                                 max_waiting=4 * max(levels), engine_process=in_process),
                      engine_factory=functools.partial(bench_engine, compiled=compiled, prefill=prefill)
                      if in_process else factory)
    srv.add_version("v0001", ck.model)
    freeze_long_lived()  # as `codex-lab serve` does once the model is loaded
    bg = serve_in_background(srv)
    rows: list[dict[str, Any]] = []
    peer = getattr(args, "peer", None)
    rounds = getattr(args, "rounds", None) or (3 if peer else 1)
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    stack = contextlib.ExitStack()
    try:
        run_load(bg.url, concurrency=1, requests=2, max_tokens=8, progress=False)  # warm-up (each level below has a bar)
        for eng in engines:  # the compiled engine: every bucket built (and the compiler's objects frozen) first
            if eng.fast_step is not None and not eng.fast_step.ready.wait(600):
                raise RuntimeError("the decode step's background compile took over 600 s")
        if in_process:  # the child reports its compile's progress: wait until it serves the compiled graphs
            t0 = time.perf_counter()
            while srv.workers["v0001"].phase()["phase"] == "warming":
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError("the engine process's background compile took over 600 s")
                time.sleep(0.2)
        targets = {"codex_lab_serve": bg.url}
        peer_info: dict[str, Any] = {}
        if peer == "llama.cpp":
            targets.update(_start_llama_server(stack, ck, max(levels), torch.get_num_threads(), peer_info))
            if "skipped" in peer_info:
                rows.append({"impl": "llama_server", **peer_info})
        samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rnd in range(rounds):  # interleaved: every level on every server, then the next round
            for c in levels:
                n = args.requests or c * args.mode.pick(fast=4, full=16)
                # the servers' order alternates from round to round: neither always runs first
                for impl, url in round_order(list(targets.items()), rnd):
                    # with a peer, one connection per request on both servers (llama-server drops kept-alive
                    # ones), and every answer runs to max_tokens on both (ignore_eos: the same work; without
                    # it, of 16 answers at 1 client codex-lab's ended at end-of-text 8 times and llama-server's
                    # once, 2026-12-03, so their throughputs counted different work)
                    samples.setdefault((impl, c), []).append(
                        run_load_in_process(url, concurrency=c, requests=n, max_tokens=args.max_tokens, duration_s=300,
                                            **({"fresh_connections": True, "extra_body": {"ignore_eos": True},
                                                "with_texts": True} if peer else {})))
        checks: dict[str, dict[str, Any]] = {}
        if peer:  # untimed: each prompt alone, then every prompt in one full batch, greedy, on each server
            from codex_lab.serve.loadtest import PROMPTS

            alone, batched = {}, {}
            for impl, url in targets.items():
                one = dict(max_tokens=args.max_tokens, fresh_connections=True, with_texts=True, cycle_prompts=True,
                           progress=False, prompts=list(PROMPTS))
                alone[impl] = run_load_in_process(url, concurrency=1, requests=len(PROMPTS), **one)["texts"]
                full = max(levels) * -(-len(PROMPTS) // max(levels))  # whole batches holding every prompt
                batched[impl] = run_load_in_process(url, concurrency=max(levels), requests=full, **one)["texts"]
            checks = answer_checks(alone, batched)
        for (impl, c), ss in samples.items():
            rates = sorted(x["tokens_per_s"] for x in ss)
            s = next(x for x in ss if x["tokens_per_s"] == rates[len(rates) // 2])  # the median round's percentiles
            row = {"concurrency": c, "requests": s["requests_ok"], "threads": torch.get_num_threads(),
                   "compiled": compiled, "prefill": prefill, "engine_process": in_process,
                   **{k: s[k] for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tbt_p50_ms", "tbt_p95_ms",
                                        "tbt_p99_ms", "ttft_share_under_100ms", "tbt_share_under_20ms",
                                        "tokens_per_s", "errors")}}
            if peer:
                row.update(impl=impl, rounds=rounds, tokens_per_s=statistics.median(rates),
                           tokens_per_s_min=rates[0], tokens_per_s_max=rates[-1],
                           # every round kept, in the order run (the percentiles are the median round's)
                           tokens_per_s_rounds=[x["tokens_per_s"] for x in ss],
                           ttft_p95_ms_rounds=[x["ttft_p95_ms"] for x in ss], tbt_p95_ms_rounds=[x["tbt_p95_ms"] for x in ss],
                           kv_cache="f16 (llama-server's default)" if impl == "llama_server" else "f32",
                           tokens=s["tokens"], finish_reasons=s["finish_reasons"],  # the median round's
                           # every round's answers: the same text for every request of a prompt
                           **dict(zip(("answers_consistent", "answers_under_load"),
                                      consistent_answers([x.get("texts", {}) for x in ss]))),
                           **checks.get(impl, {}))
                if impl == "llama_server":
                    row.update({f"llama_{k}": v for k, v in peer_info.items()})
            rows.append(row)
        by = {(r.get("impl"), r["concurrency"]): r for r in rows if "concurrency" in r}
        for (impl, c), r in by.items():  # codex-lab serve / llama-server, per level (> 1: codex-lab faster)
            if peer and ("llama_server", c) in by:
                r["ratio_vs_llama_server"] = by[("codex_lab_serve", c)]["tokens_per_s"] / by[("llama_server", c)]["tokens_per_s"]
    finally:
        stack.close()
        bg.stop()
        torch.set_num_threads(old_threads)
    return rows


def _start_llama_server(stack: contextlib.ExitStack, ck: Any, slots: int, threads: int,
                        info: dict[str, Any]) -> dict[str, str]:
    """llama-server on ``ck``'s model exported to an F32 GGUF (in a folder ``stack`` removes), with
    ``slots`` parallel slots of the model's context and ``threads`` math threads, warmed with
    one request: {"llama_server": its URL}. Without llama-server: {} and ``info["skipped"]``
    says how to build it; else ``info`` gets its version."""
    import socket
    import tempfile
    from pathlib import Path

    from codex_lab.hf.gguf_export import export_gguf
    from codex_lab.measure.llama_native import SERVER_HINT, LlamaServer, find_llama_server
    from codex_lab.serve.loadtest import run_load

    if find_llama_server() is None:
        info["skipped"] = SERVER_HINT
        return {}
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    gguf = export_gguf(ck.model, ck.tokenizer, tmp / "model-f32.gguf", gguf_type="f32")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = stack.enter_context(LlamaServer(gguf, port=port, slots=slots, context=ck.model.cfg.max_seq_len, threads=threads))
    run_load(srv.url, concurrency=1, requests=2, max_tokens=8, progress=False, fresh_connections=True)  # warm-up
    info.update(version=srv.version(), slots=slots)
    return {"llama_server": srv.url}
