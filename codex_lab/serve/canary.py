"""Canary release: send a share of live traffic to a candidate, compare, promote or roll back.

The controller reads each version's live Prometheus series (:meth:`ServerMetrics.version_counts`)
over the same window (counts at the canary's start are subtracted from the primary's) and
decides, once the canary has served ``min_requests``:

- roll back when the canary breaches the error budget (share of requests past the deadline
  or failed inside the server; a client's bad request is a 4xx counted for no version, so
  no client can force a rollback) or its SLO attainment (share of first tokens within 100 ms, of token gaps
  within 20 ms) is more than ``max_attainment_drop`` below the primary's;
- promote when it has served ``promote_after`` requests without a breach, and only when both
  versions have latency observations in the window (no data is never "within the SLOs");
- otherwise wait.

Rolling back only stops routing new requests to the canary: requests it is already
serving finish normally, so no client request fails because of a rollback.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from codex_lab.serve.router import ModelServer


@dataclass
class CanaryPolicy:
    """When a canary is promoted or rolled back.

    Args:
        share: fraction of unpinned traffic sent to the canary.
        min_requests: canary requests before any decision.
        promote_after: canary requests without a breach before promotion.
        ttft_slo_s, tbt_slo_s: the latency targets (seed: 100 ms, 20 ms); bucket edges.
        max_attainment_drop: how far (absolute share) the canary's attainment may fall below
            the primary's. 0.15: on a shared 2-core machine an identical model's attainment
            moves by several points between windows of a few dozen requests.
        error_budget: share of canary requests allowed to fail (past deadline or internal).
        max_quality_drop: how far (absolute share) the canary's live quality signal, the share of
            its answers whose prompt + answer parses as Python, may fall below the primary's on
            the same traffic. A canary is never promoted without that signal on both sides.
    """

    share: float = 0.25
    min_requests: int = 8
    promote_after: int = 24
    ttft_slo_s: float = 0.1
    tbt_slo_s: float = 0.02
    max_attainment_drop: float = 0.15
    error_budget: float = 0.02
    max_quality_drop: float = 0.15


@dataclass
class CanaryDecision:
    """What the controller concluded: action in {"wait", "promote", "rollback"}."""

    action: str
    reasons: list[str]
    canary: dict[str, float]
    primary: dict[str, float]
    at: float = field(default_factory=time.time)


def _share(ok: float, n: float) -> float:
    # attainment = observations within the target / observations
    return ok / n if n else math.nan


def window_stats(now: dict[str, float], start: dict[str, float] | None = None) -> dict[str, float]:
    """Counts since ``start`` plus derived shares: error_rate, ttft_attainment, tbt_attainment,
    quality_share (nan where no answer's quality was judged)."""
    d = {k: v - (start or {}).get(k, 0.0) for k, v in now.items()}
    d["quality_share"] = _share(d.get("quality_ok", 0.0), d.get("quality_n", 0.0))
    d["error_rate"] = _share(d["failures"], d["n"])
    d["ttft_attainment"] = _share(d["ttft_ok"], d["ttft_n"])
    d["tbt_attainment"] = _share(d["itl_ok"], d["itl_n"])
    return d


def client_window(rep: Any, policy: CanaryPolicy | None = None, *, parses: Any = None) -> dict[str, float]:
    """:func:`window_stats` of a client-side load test (a ``LoadReport``: ttft, tbt in seconds, ok,
    errors), for a server whose metrics the controller cannot read (another engine, such as
    llama.cpp's server): the same counts the Prometheus series give, seen by the clients.
    ``parses``: per answer, whether prompt + answer parses (the quality signal; None: none)."""
    policy = policy or CanaryPolicy()
    failures = float(sum(rep.errors.values()))
    judged = [bool(p) for p in parses] if parses is not None else []
    now = {"n": rep.ok + failures, "failures": failures, "quality_ok": float(sum(judged)), "quality_n": float(len(judged)),
           "ttft_n": float(len(rep.ttft)), "ttft_ok": float(sum(x <= policy.ttft_slo_s for x in rep.ttft)),
           "itl_n": float(len(rep.tbt)), "itl_ok": float(sum(x <= policy.tbt_slo_s for x in rep.tbt))}
    return window_stats(now)


def decide(canary: dict[str, float], primary: dict[str, float], policy: CanaryPolicy) -> tuple[str, list[str]]:
    """The decision rule on two :func:`window_stats` dicts; returns (action, reasons)."""
    if canary["n"] < policy.min_requests:
        return "wait", [f"canary served {canary['n']:.0f} < {policy.min_requests} requests"]
    reasons = []
    if canary["error_rate"] > policy.error_budget:
        reasons.append(f"error rate {canary['error_rate']:.1%} > budget {policy.error_budget:.1%}")
    names = (f"TTFT<={policy.ttft_slo_s * 1000:g}ms", f"TBT<={policy.tbt_slo_s * 1000:g}ms")
    missing = []  # latency the decision has no data for: never promoted on
    for key, name in zip(("ttft_attainment", "tbt_attainment"), names):
        c, p = canary[key], primary[key]
        if math.isnan(p):
            missing.append(f"{name}: the primary has no latency observations in this window")
            continue
        if math.isnan(c) or c < p - policy.max_attainment_drop:
            reasons.append(f"{name} attainment {c:.1%} vs primary {p:.1%} (allowed drop {policy.max_attainment_drop:.0%})")
    cq, pq = canary.get("quality_share", math.nan), primary.get("quality_share", math.nan)
    if math.isnan(pq) or math.isnan(cq):
        missing.append("quality: no answer of " + ("the primary" if math.isnan(pq) else "the canary")
                       + " judged in this window")
    elif cq < pq - policy.max_quality_drop:
        reasons.append(f"quality: {cq:.1%} of the canary's answers parse vs primary {pq:.1%} (allowed drop "
                       f"{policy.max_quality_drop:.0%})")
    if reasons:
        return "rollback", reasons
    if missing:
        # no comparison, no promotion: "within the SLOs" needs latency measured on both sides
        return "wait", [f"cannot promote without latency and quality data ({'; '.join(missing)})"]
    if canary["n"] >= policy.promote_after:
        return "promote", [f"{canary['n']:.0f} requests within the SLOs, the error budget and the quality drop"]
    return "wait", [f"no breach after {canary['n']:.0f} of {policy.promote_after} requests"]


class CanaryController:
    """Runs one canary on a :class:`ModelServer`.

    Args:
        server: the serving server (its primary is the baseline).
        policy: :class:`CanaryPolicy`.
        registry: optional :class:`~codex_lab.serve.registry.Registry`: when the canary's version
            is one of its versions, promotion is recorded there and the outcome is written into
            the candidate's manifest. A canary served under another name (``"v0003-slow"``) is
            compared and acted on in the server only; :attr:`in_registry` says which case ran.
    """

    def __init__(self, server: ModelServer, policy: CanaryPolicy | None = None, registry: Any = None) -> None:
        self.server, self.policy, self.registry = server, policy or CanaryPolicy(), registry
        self.version: str | None = None
        self.primary: str | None = None
        self._start: dict[str, dict[str, float]] = {}
        self.decisions: list[CanaryDecision] = []
        self._thread: threading.Thread | None = None
        self.in_registry = False
        self.error: BaseException | None = None

    def start(self, version: str, model: Any, *, step_delay_s: float = 0.0) -> None:
        """Serve ``model`` as ``version`` and route the policy's share of traffic to it.

        ``step_delay_s`` injects a delay per engine step (a deliberately slow candidate).
        """
        if self.server.primary is None:
            raise ValueError("the server has no primary version to compare a canary against")
        self.server.add_version(version, model, step_delay_s=step_delay_s)
        self.version, self.primary = version, self.server.primary
        # decided once, here: only a version the registry holds can be promoted or annotated there
        self.in_registry = self.registry is not None and version in self.registry.versions()
        self._start = {v: self._counts(v) for v in (version, self.primary)}
        self.server.set_canary(version, self.policy.share)

    def _counts(self, version: str) -> dict[str, float]:
        return self.server.metrics.version_counts(version, self.policy.ttft_slo_s, self.policy.tbt_slo_s)

    def evaluate(self) -> CanaryDecision:
        """Compare the canary with the primary over the canary's window (no action taken)."""
        if self.version is None or self.primary is None:
            raise ValueError("no canary running; call start() first")
        can = window_stats(self._counts(self.version), self._start[self.version])
        pri = window_stats(self._counts(self.primary), self._start[self.primary])
        action, reasons = decide(can, pri, self.policy)
        return CanaryDecision(action, reasons, can, pri)

    def step(self) -> CanaryDecision:
        """Evaluate and act: promote, roll back, or keep waiting."""
        d = self.evaluate()
        self.decisions.append(d)
        if d.action == "promote":
            self.server.promote_canary()
            if self.in_registry:
                self.registry.promote(self.version)
        elif d.action == "rollback":
            self.server.rollback_canary()
        if d.action != "wait" and self.in_registry:
            man = self.registry.manifest(self.version)
            self.registry.set_gates(self.version, {**man.gates, "canary": {"action": d.action, "reasons": d.reasons}})
        return d

    @property
    def done(self) -> bool:
        """True once promoted or rolled back."""
        return bool(self.decisions) and self.decisions[-1].action != "wait"

    def watch(self, interval_s: float = 0.2, timeout_s: float = 60.0) -> None:
        """Call :meth:`step` every ``interval_s`` in a background thread until decided or timed out.

        An exception in the thread stops it and is kept in :attr:`error`; :meth:`join` raises it
        in the caller's thread (never a traceback printed from the background thread).
        """
        self.error = None

        def loop() -> None:
            t_end = time.time() + timeout_s
            try:
                while not self.done and time.time() < t_end:
                    time.sleep(interval_s)
                    self.step()
            except Exception as exc:  # handed to join(), which raises it where it can be handled
                self.error = exc

        self._thread = threading.Thread(target=loop, name="canary", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> CanaryDecision | None:
        """Wait for :meth:`watch` to finish; the last decision. Raises what the thread raised."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise RuntimeError(f"the canary controller stopped on an error: {self.error!r}") from self.error
        return self.decisions[-1] if self.decisions else None
