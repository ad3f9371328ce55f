"""Prometheus metrics of the server, named like vLLM's (``vllm:...`` -> ``codex_lab:...``).

Each app owns its own :class:`prometheus_client.CollectorRegistry`, so several servers (a
test, a notebook, a canary) never share counters. Latency histograms have bucket edges at
the seed's targets (0.02 s between tokens, 0.1 s to the first token), so the share of
requests within an SLO reads straight off one cumulative bucket:
``attainment = bucket(le=target) / count``.

Every per-request series carries ``model_name`` and ``version`` labels: a canary compares
the live metrics of two versions served side by side.
"""

from __future__ import annotations

import math
import resource
import sys
from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "codex_lab:"
# seconds; 0.1 (TTFT target) and 0.02 (TBT target) are edges on purpose
TTFT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)
# client errors (never counted against a version: a client must not be able to fail a canary),
# then "disconnected" and "internal" (a failure of the server or its engine, counted per version)
ERROR_KINDS = ("invalid_request", "unauthorized", "not_found", "too_large", "timeout", "rate_limited",
               "unavailable", "disconnected", "internal")
# the server's phases (GET /health's "phase"; GET /ready answers 200 only in "ready")
PHASES = ("starting", "warming", "ready", "degraded")


def peak_memory_bytes() -> int:
    """Peak memory of this process in bytes: CUDA max allocated on a GPU, else peak RSS."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return int(peak if sys.platform == "darwin" else peak * 1024)


class ServerMetrics:
    """All metrics of one server, in one private registry.

    Args:
        model_name: the name clients send as ``model`` (a label on every series).
    """

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        r, lv = self.registry, ["model_name", "version"]
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token (request received -> first token).",
                              lv, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Time between consecutive output tokens (TBT).",
                             lv, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Request received -> last token.",
                             lv, buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens processed.", lv, registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", lv, registry=r)
        self.success = Counter(PREFIX + "request_success", "Finished requests by finish reason.",
                               lv + ["finished_reason"], registry=r)
        self.quality = Counter(PREFIX + "completion_parses", "Finished answers whose prompt + answer (cut at the "
                               "function's end) parses as Python: a live quality signal.", lv + ["parses"], registry=r)
        self.errors = Counter(PREFIX + "request_errors", "Failed requests by kind (version '-' = refused before routing).",
                              ["model_name", "version", "kind"], registry=r)
        self.running = Gauge(PREFIX + "num_requests_running", "Requests in the running batch.", lv, registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests queued for a slot.", lv, registry=r)
        self.kv_usage = Gauge(PREFIX + "kv_cache_usage_perc", "KV-cache blocks in use, 0..1.", lv, registry=r)
        self.kv_bytes = Gauge(PREFIX + "kv_cache_used_bytes", "KV-cache bytes in use.", lv, registry=r)
        self.peak_memory = Gauge(PREFIX + "peak_memory_bytes", "Peak memory: CUDA max allocated, else process peak RSS.",
                                 ["model_name"], registry=r)
        self.version_info = Gauge(PREFIX + "model_version_info", "1 for each served version; role = primary|canary.",
                                  ["model_name", "version", "role"], registry=r)
        self.phase = Gauge(PREFIX + "server_phase", "1 for the server's current phase (starting, warming, ready, "
                           "degraded), 0 for the others.", ["model_name", "phase"], registry=r)
        self.graphs_done = Gauge(PREFIX + "compile_graphs_done", "Decode graphs compiled so far (the background "
                                 "compile's progress).", lv, registry=r)
        self.graphs_total = Gauge(PREFIX + "compile_graphs_total", "Decode graphs the background compile builds "
                                  "(0: the engine compiles nothing).", lv, registry=r)
        self.set_phase("starting", {})
        for kind in ERROR_KINDS:  # expose zeros so rates exist before the first error
            self.errors.labels(model_name, "-", kind)

    def observe_request(self, version: str, *, arrival: float, token_times: Sequence[float], prompt_tokens: int,
                        finish_reason: str, parses: bool | None = None) -> None:
        """Record one finished request. Times in seconds on one clock (``time.perf_counter``);
        ``parses``: whether prompt + answer parses as Python (None: not judged)."""
        lab = (self.model_name, version)
        if parses is not None:
            self.quality.labels(*lab, "true" if parses else "false").inc()
        if token_times:
            # TTFT = first token time - arrival
            self.ttft.labels(*lab).observe(token_times[0] - arrival)
            for a, b in zip(token_times, token_times[1:]):
                # TBT = gap between consecutive tokens
                self.itl.labels(*lab).observe(b - a)
            self.e2e.labels(*lab).observe(token_times[-1] - arrival)
        self.prompt_tokens.labels(*lab).inc(prompt_tokens)
        self.generation_tokens.labels(*lab).inc(len(token_times))
        self.success.labels(*lab, finish_reason).inc()

    def error(self, kind: str, version: str = "-") -> None:
        """Count one failed request of ``kind`` (one of ``ERROR_KINDS``) on ``version``."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {kind!r}; use one of {ERROR_KINDS}")
        self.errors.labels(self.model_name, version, kind).inc()

    def version_counts(self, version: str, ttft_target_s: float = 0.1, tbt_target_s: float = 0.02) -> dict[str, float]:
        """Cumulative numbers of one version, for comparing versions live (the canary).

        n: finished requests; failures: finished past the deadline or failed inside the
        server; quality_ok / quality_n: answers whose prompt + answer parses, and answers judged; ttft_ok / ttft_n and itl_ok / itl_n: observations within the targets
        (bucket edges; default the seed's 0.1 s and 0.02 s) and all observations.
        """
        if ttft_target_s not in TTFT_BUCKETS or tbt_target_s not in ITL_BUCKETS:
            raise ValueError(f"targets must be bucket edges: TTFT {TTFT_BUCKETS}, TBT {ITL_BUCKETS}")
        lab = {"model_name": self.model_name, "version": version}
        ok = {r: self.sample(PREFIX + "request_success_total", {**lab, "finished_reason": r})
              for r in ("stop", "length", "deadline", "cancelled")}
        internal = self.sample(PREFIX + "request_errors_total", {**lab, "kind": "internal"})
        out = {"n": sum(ok.values()) + internal, "failures": ok["deadline"] + internal}
        q = {p: self.sample(PREFIX + "completion_parses_total", {**lab, "parses": p}) for p in ("true", "false")}
        out["quality_ok"], out["quality_n"] = q["true"], q["true"] + q["false"]
        for key, h, target in (("ttft", self.ttft, ttft_target_s), ("itl", self.itl, tbt_target_s)):
            out[f"{key}_n"] = self.sample(h._name + "_count", lab)  # noqa: SLF001
            out[f"{key}_ok"] = self.sample(h._name + "_bucket", {**lab, "le": _le(target)})  # noqa: SLF001
        return out

    def set_engine_stats(self, version: str, stats: dict) -> None:
        """Update the gauges from an engine's ``stats()`` dict."""
        lab = (self.model_name, version)
        self.running.labels(*lab).set(stats.get("running", 0))
        self.waiting.labels(*lab).set(stats.get("waiting", 0))
        cap = stats.get("kv_capacity_tokens") or 0
        # usage = used KV tokens / capacity
        self.kv_usage.labels(*lab).set(stats.get("kv_used_tokens", 0) / cap if cap else 0.0)
        self.kv_bytes.labels(*lab).set(stats.get("kv_used_bytes", 0))

    def set_phase(self, phase: str, progress: dict[str, tuple[int, int]]) -> None:
        """The server's phase (one-hot over :data:`PHASES`) and each version's compile progress
        ``{version: (graphs done, graphs total)}``."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; use one of {PHASES}")
        for p in PHASES:
            self.phase.labels(self.model_name, p).set(1 if p == phase else 0)
        for version, (done, total) in progress.items():
            self.graphs_done.labels(self.model_name, version).set(done)
            self.graphs_total.labels(self.model_name, version).set(total)

    def drop_version(self, version: str) -> None:
        """Remove a retired version's gauges (its histograms and counters stay: they are history)."""
        for g in (self.running, self.waiting, self.kv_usage, self.kv_bytes, self.graphs_done, self.graphs_total):
            try:
                g.remove(self.model_name, version)
            except KeyError:
                pass  # never set

    def set_versions(self, primary: str | None, canary: str | None) -> None:
        """Mark which versions serve (info gauge: 1 = serving)."""
        self.version_info.clear()
        if primary:
            self.version_info.labels(self.model_name, primary, "primary").set(1)
        if canary:
            self.version_info.labels(self.model_name, canary, "canary").set(1)

    def render(self) -> bytes:
        """Prometheus text exposition of every metric (peak memory refreshed first)."""
        self.peak_memory.labels(self.model_name).set(peak_memory_bytes())
        return generate_latest(self.registry)

    def sample(self, name: str, labels: dict[str, str]) -> float:
        """Current value of one sample (0.0 when it does not exist yet)."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else float(v)

    def attainment(self, metric: str, version: str, target_s: float) -> tuple[float, int]:
        """(share of observations <= target_s, count) of one histogram for one version.

        ``target_s`` must be a bucket edge (the share is read from that bucket, not
        interpolated). ``metric`` is ``"ttft"``, ``"itl"`` or ``"e2e"``.
        """
        h = {"ttft": self.ttft, "itl": self.itl, "e2e": self.e2e}[metric]
        name = h._name  # noqa: SLF001 (prometheus_client keeps the full name here)
        edges = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e": E2E_BUCKETS}[metric]
        if target_s not in edges:
            raise ValueError(f"{target_s} s is not a bucket edge of {metric}; edges: {edges}")
        lab = {"model_name": self.model_name, "version": version}
        count = self.sample(name + "_count", lab)
        within = self.sample(name + "_bucket", {**lab, "le": _le(target_s)})
        return (within / count if count else math.nan), int(count)


def _le(x: float) -> str:
    """Label value prometheus_client writes for a bucket edge (float repr, e.g. '0.1')."""
    return repr(float(x))


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse Prometheus text into ``{sample name: [(labels, value), ...]}``."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def histogram_attainment(buckets: Iterable[tuple[float, float]], target_s: float) -> float:
    """SLO attainment from cumulative histogram buckets ``[(le, count <= le), ...]``.

    attainment = count in the bucket whose edge is ``target_s`` / total count (the ``+Inf``
    bucket). The target must be an edge: between edges the share is unknown.
    """
    b = sorted(buckets)
    if not b or not math.isinf(b[-1][0]):
        raise ValueError("buckets must include the +Inf bucket (the total count)")
    total = b[-1][1]
    hits = [c for le, c in b if math.isclose(le, target_s)]
    if not hits:
        raise ValueError(f"{target_s} is not a bucket edge; edges: {[le for le, _ in b]}")
    return hits[0] / total if total else math.nan
