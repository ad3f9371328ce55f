"""Report section for lesson 07: serving latency, robustness, gates, canary, registry."""

from __future__ import annotations

import copy
import os
import tempfile
import time

import torch

from codex_lab.stats import FAILS, FAILS_AS_STATED, HOLDS

TITLE = "Lesson 07: monitored serving, release gates, canary and rollback"
ORDER = 7


def _perturbed(model: torch.nn.Module, scale: float = 1.0, seed: int = 0) -> torch.nn.Module:
    bad = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in bad.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * scale)  # noise ~ each tensor's spread
    return bad


def run(ctx) -> str:  # noqa: ANN001
    """Measure the seed's section-4 targets on the shipped model; record verdicts."""
    from codex_lab.serve.canary import CanaryController, CanaryPolicy
    from codex_lab.serve.gates import bench_problems, engine_completer, gate_decision, run_gates
    from codex_lab.serve.loadtest import malformed_storm, run_load
    from codex_lab.serve.metrics import peak_memory_bytes
    from codex_lab.serve.registry import Registry
    pick = ctx.pick  # sizes for the run's mode
    from codex_lab.serve.app import serve_in_background
    from codex_lab.serve.router import ModelServer, ServerConfig

    threads = torch.get_num_threads()
    # the math threads are the report's (course.report runs each section under
    # runtime.use_compute_threads: 1 on a 2-core machine), as in the lesson
    ck = ctx.checkpoint()
    lines: list[str] = []
    try:
        srv = ModelServer(ck.tokenizer, ServerConfig(model_name="codex-lab-tiny", max_batch_size=8, max_waiting=64))
        srv.add_version("v0001", ck.model)
        bg = serve_in_background(srv)
        try:
            run_load(bg.url, concurrency=1, requests=2, max_tokens=8)  # warm-up
            s4 = run_load(bg.url, concurrency=4, requests=pick(fast=16, full=64), max_tokens=32, duration_s=60).summary()
            stress_s = pick(fast=3.0, full=60.0)
            s64 = run_load(bg.url, concurrency=64, requests=100_000, duration_s=stress_s, max_tokens=24,
                           disconnect_prob=0.5, seed=1).summary()
            time.sleep(0.3)
            h = srv.health()
            leaked = h["in_flight"] + h["running"] + h["waiting"] + h["kv_used_tokens"]
            storm = malformed_storm(bg.url, 200)
            # the release baseline: the shipped model fine-tuned on codebench 2 iid (shipped weights,
            # scripts/l05_calibrate_shipped.py --save), so the functional gate can see damage; the
            # untuned shipped model scores ~0 there, as would its copy
            from codex_lab.training.checkpoint import load_codebench2_tuned

            tuned = load_codebench2_tuned().model
            base = run_gates(engine_completer(tuned, ck.tokenizer), max_tokens=48)
            dmg = run_gates(engine_completer(_perturbed(tuned), ck.tokenizer), max_tokens=48)
            passed, why = gate_decision(dmg.scores(), base.scores())
            ctl = CanaryController(srv, CanaryPolicy(share=0.3, min_requests=5, promote_after=10))
            ctl.start("v0002-slow", ck.model, step_delay_s=0.1)
            ctl.watch(interval_s=0.2, timeout_s=120)
            sc = run_load(bg.url, concurrency=4, requests=pick(fast=24, full=120), max_tokens=16, duration_s=120).summary()
            dec = ctl.join(120)
            peak_mib = peak_memory_bytes() / 2**20
        finally:
            bg.stop()
        # deadline: a request that would take ~5 s on a slowed engine, under a 0.3 s deadline
        slow = ModelServer(ck.tokenizer, ServerConfig(model_name="codex-lab-tiny", deadline_s=0.3))
        slow.add_version("v0001", ck.model, step_delay_s=0.05)
        bg2 = serve_in_background(slow)
        try:
            import httpx

            t0 = time.perf_counter()
            r = httpx.post(bg2.url + "/v1/completions", json={"model": "codex-lab-tiny", "prompt": "def f():",
                                                              "max_tokens": 100}, timeout=30).json()
            # OpenAI's finish_reason is "length"; the server's extension field says why: "deadline"
            dl_s, dl_reason = time.perf_counter() - t0, r["choices"][0].get("finish_detail") or r["choices"][0]["finish_reason"]
        finally:
            bg2.stop()
        reg = Registry(tempfile.mkdtemp(prefix="codex-lab-report-registry-"))
        for i in range(5):
            reg.promote(reg.add(_perturbed(ck.model, 0.01, seed=i), ck.tokenizer))
        kept = reg.versions()
    finally:
        torch.set_num_threads(threads)

    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    lines += [
        "Shipped tiny model behind the OpenAI-compatible server (one torch thread), clients on the same "
        f"machine over loopback; {load} at the end of the measurements (latency on a shared machine "
        "rises with the load).",
        "",
        "| load | TTFT p50 / p95 / p99 (ms) | TBT p50 / p95 / p99 (ms) | TTFT<=100ms | TBT<=20ms | tokens/s | errors |",
        "|---|---|---|---|---|---|---|",
        f"| 4 streams, {s4['requests_ok']} requests | {s4['ttft_p50_ms']} / {s4['ttft_p95_ms']} / {s4['ttft_p99_ms']} | "
        f"{s4['tbt_p50_ms']} / {s4['tbt_p95_ms']} / {s4['tbt_p99_ms']} | {s4['ttft_share_under_100ms']:.0%} | "
        f"{s4['tbt_share_under_20ms']:.0%} | {s4['tokens_per_s']} | {s4['errors']} |",
        f"| 64 streams, {stress_s:.0f} s, 50% hang up | {s64['ttft_p50_ms']} / {s64['ttft_p95_ms']} / {s64['ttft_p99_ms']} | "
        f"{s64['tbt_p50_ms']} / {s64['tbt_p95_ms']} / {s64['tbt_p99_ms']} | {s64['ttft_share_under_100ms']:.0%} | "
        f"{s64['tbt_share_under_20ms']:.0%} | {s64['tokens_per_s']} | {s64['errors']} |",
        "",
        f"- 64-stream storm: {s64['requests_ok']} completed, {s64['disconnected']} clients hung up, "
        f"{s64['errors']} errors; leaked slots/KV tokens afterwards: {leaked}.",
        f"- 200 malformed requests (+2 wrong route/method): statuses {storm['statuses']}, "
        f"{storm['server_errors']} server errors, error shape wrong for {len(storm['bad_error_shape'])}.",
        f"- Deadline 0.3 s on a request needing ~5 s: ended after {dl_s:.2f} s with finish_reason `length`, "
        f"finish_detail `{dl_reason}`.",
        f"- Peak memory (process RSS on CPU): {peak_mib:.0f} MiB.",
        f"- Gates, baseline: {', '.join(f'{k} {v:.2f}' for k, v in base.scores().items())}.",
        f"- Gates, noise-damaged candidate: {', '.join(f'{k} {v:.2f}' for k, v in dmg.scores().items())} -> "
        f"{'passes' if passed else 'refused: ' + '; '.join(why)}.",
        f"- Canary with an injected 0.1 s per engine step: **{dec.action if dec else 'no decision'}** "
        f"({'; '.join(dec.reasons) if dec else ''}); client errors during the canary: {sc['errors']}.",
        f"- Registry after 5 promotions keeps {kept} (current + 2 previous).",
    ]
    ctx.claim("TTFT < 100 ms", f"p95 {s4['ttft_p95_ms']:.0f} ms with 4 streams on this CPU, {load} "
              f"({s4['ttft_share_under_100ms']:.0%} of requests within)",
              latency_verdict(s4["ttft_p95_ms"], 100.0), lesson="07")
    ctx.claim("TBT < 20 ms", f"p95 {s4['tbt_p95_ms']:.1f} ms with 4 streams on this CPU, {load} "
              f"({s4['tbt_share_under_20ms']:.0%} of gaps within)",
              latency_verdict(s4["tbt_p95_ms"], 20.0), lesson="07")
    ctx.claim("a request finishes within 30 s", f"deadline enforced: a 0.3 s deadline ended a ~5 s request after "
              f"{dl_s:.2f} s (finish_detail {dl_reason})", deadline_verdict(dl_reason, dl_s, 0.3), lesson="07")
    # the registry keeps what it is configured to keep: a figure, not a verdict
    ctx.measure("versions kept by the registry", f"after 5 promotions the registry holds {len(kept)} versions "
                f"(the article: at least two previous ones)", lesson="07")
    ctx.claim("gate new versions on syntax, function and style; no worse than the baseline",
              f"damaged candidate {'refused' if not passed else 'passed'}; functional (codebench 2 iid pass@1, "
              f"{len(bench_problems())} held-out problems) {base.functional:.0%} for the fine-tuned baseline vs "
              f"{dmg.functional:.0%} damaged"
              + ("" if dmg.functional < base.functional else ": the functional gate did not see the damage in this run"),
              gate_verdict(passed, dmg.functional, base.functional), lesson="07")
    ctx.claim("roll back a worse version (canary)", f"slow canary: {dec.action if dec else 'none'}, "
              f"{sc['errors']} failed client requests", rollback_verdict(dec.action if dec else None, sc["errors"]),
              lesson="07")
    return "\n".join(lines)


def latency_verdict(p95_ms: float, limit_ms: float) -> str:
    """A latency target (TTFT < 100 ms, TBT < 20 ms) on the served system's p95: holds below the
    limit, fails at or above it."""
    return HOLDS if p95_ms < limit_ms else FAILS


def deadline_verdict(reason: str, ended_after_s: float, deadline_s: float, slack_s: float = 1.0) -> str:
    """"One request finishes within its deadline (30 s)": holds when a request needing longer than
    its deadline was ended by the deadline (finish_detail "deadline") within ``slack_s`` of it (a
    step in progress finishes first); fails otherwise (it ran on, or ended for another reason)."""
    return HOLDS if reason == "deadline" and ended_after_s <= deadline_s + slack_s else FAILS


def gate_verdict(passed: bool, damaged_functional: float, base_functional: float) -> str:
    """The gates on a deliberately damaged candidate: holds when they refuse it and the functional
    gate saw the damage; fails as stated when refused by other gates only; fails when it passed."""
    if passed:
        return FAILS
    return HOLDS if damaged_functional < base_functional else FAILS_AS_STATED


def rollback_verdict(action: str | None, client_errors: int) -> str:
    """The canary on a slowed candidate: holds when it rolled back with no failed client request."""
    return HOLDS if action == "rollback" and client_errors == 0 else FAILS
