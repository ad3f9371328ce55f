"""The served versions of one model: routing (a primary plus an optional canary taking a
share of traffic), the in-flight bound (429 + ``Retry-After``), health, and the server's knobs.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.errors import InputError
from codex_lab.serve.metrics import ServerMetrics
from codex_lab.serve.api_errors import ApiError, Limits
from codex_lab.serve.security import LOOPBACK
from codex_lab.serve.worker import EngineWorker


@dataclass
class ServerConfig:
    """Server knobs.

    Args:
        model_name: the ``model`` clients send (``name`` or ``name@version`` to pin one).
        max_batch_size: requests decoded together per engine.
        max_waiting: requests that may queue beyond the running batches; more -> 429
            (capacity = max_batch_size per served version + max_waiting).
        deadline_s: longest a request may take, in seconds (the seed's 30 s).
        limits: request validation limits (``max_seq_len`` is taken from the model).
        allowed_hosts: names accepted in the ``Host`` header ("*" = any); loopback by default.
        api_key: when set, clients must send ``Authorization: Bearer <api_key>``.
        header_timeout_s: a connection must send complete request headers within this (seconds).
        body_timeout_s: a request body must arrive within this (seconds), else 408.
        keep_alive_s: an idle keep-alive connection is closed after this (seconds).
        max_connections: open connections at most; one more gets 503 and is closed.
        retry_after_s: the ``Retry-After`` of a 429 (seconds).
        fim_format: "psm" or "spm" when the served model was trained for fill-in-the-middle
            (``meta["fim_rate"] > 0``; then ``suffix`` is served), else None (``suffix`` -> 400).
        engine_process: run each version's engine in a child process
            (:class:`~codex_lab.serve.engine_process.EngineProcess`) instead of a thread of this one,
            so HTTP and the engine's Python never wait on one interpreter lock.
    """

    model_name: str = "codex-lab-tiny"
    max_batch_size: int = 8
    max_waiting: int = 32
    deadline_s: float = 30.0
    limits: Limits = field(default_factory=Limits)
    allowed_hosts: tuple[str, ...] = LOOPBACK
    api_key: str | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 256
    retry_after_s: int = 1
    fim_format: str | None = None
    engine_process: bool = False

    def validate(self) -> None:
        """Raise :class:`~codex_lab.errors.InputError` naming the first bad knob and its range."""
        def num(name: str, v: Any, lo: float, hi: float, integer: bool = False) -> None:
            ok = isinstance(v, int) and not isinstance(v, bool) if integer else (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            if not ok or not lo <= v <= hi:
                kind = "an integer" if integer else "a number"
                raise InputError(f"{name} must be {kind} in [{lo:g}, {hi:g}], got {v!r}")

        num("max_batch_size", self.max_batch_size, 1, 1024, True)
        num("max_waiting", self.max_waiting, 0, 100_000, True)
        num("deadline_s", self.deadline_s, 0.01, 3600)
        num("header_timeout_s", self.header_timeout_s, 0.1, 600)
        num("body_timeout_s", self.body_timeout_s, 0.1, 600)
        num("keep_alive_s", self.keep_alive_s, 1, 600)
        num("max_connections", self.max_connections, 1, 100_000, True)
        num("retry_after_s", self.retry_after_s, 0, 3600, True)
        num("max_tokens", self.limits.max_tokens, 1, 1_000_000, True)
        num("max_body_bytes", self.limits.max_body_bytes, 1024, 64 * 2**20, True)
        if not self.model_name or "@" in self.model_name:
            raise InputError(f"model_name must be non-empty and without '@', got {self.model_name!r}")
        if not self.allowed_hosts or not all(isinstance(h, str) and h for h in self.allowed_hosts):
            raise InputError(f"allowed_hosts must be non-empty host names (or '*'), got {self.allowed_hosts!r}")
        if self.api_key is not None and (not self.api_key.strip() or not self.api_key.isprintable()):
            raise InputError("the API key must be non-empty printable text")


class ModelServer:
    """Served versions, routing (primary + canary share), limits and metrics.

    Args:
        tokenizer: shared by every version (the registry keeps one per version, and
            versions of one model share it).
        config: :class:`ServerConfig`.
        engine_factory: passed to each :class:`EngineWorker`.
    """

    def __init__(self, tokenizer: CodeTokenizer, config: ServerConfig | None = None,
                 engine_factory: Callable[..., Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config or ServerConfig()
        self.config.validate()
        self.engine_factory = engine_factory
        self.metrics = ServerMetrics(self.config.model_name)
        self.workers: dict[str, EngineWorker] = {}
        self.primary: str | None = None
        self.canary: str | None = None
        self.canary_share = 0.0
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.in_flight = 0
        self.started = time.time()

    # ---- versions ----------------------------------------------------------------------
    def add_version(self, version: str, model: Any, *, step_delay_s: float = 0.0, primary: bool = False) -> None:
        """Start serving ``version`` (an engine + its thread); make it primary if asked or first."""
        if version in self.workers:
            raise ValueError(f"version {version!r} is already served")
        self.config.limits.max_seq_len = min(self.config.limits.max_seq_len, model.cfg.max_seq_len)
        kind: Any = EngineWorker
        if self.config.engine_process:
            from codex_lab.serve.engine_process import EngineProcess as kind
        self.workers[version] = kind(version, model, self.tokenizer, max_batch_size=self.config.max_batch_size,
                                     step_delay_s=step_delay_s, engine_factory=self.engine_factory)
        if primary or self.primary is None:
            self.primary = version
        self._publish()

    def set_canary(self, version: str | None, share: float = 0.1) -> None:
        """Route ``share`` (0..1) of unpinned requests to ``version`` (``None``: no canary)."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"canary share must be in [0, 1], got {share}")
        if version is not None and version not in self.workers:
            raise ValueError(f"version {version!r} is not served; add_version it first")
        with self._lock:
            self.canary, self.canary_share = version, (share if version else 0.0)
        self._publish()

    def promote_canary(self) -> str:
        """The canary becomes the primary; the old primary retires once its requests finish."""
        if self.canary is None:
            raise ValueError("there is no canary to promote")
        with self._lock:
            old, self.primary, self.canary, self.canary_share = self.primary, self.canary, None, 0.0
        if old is not None:
            self._retire(old)
        self._publish()
        return self.primary  # type: ignore[return-value]

    def rollback_canary(self) -> str | None:
        """Stop routing to the canary; its in-flight requests finish normally, then it retires."""
        with self._lock:
            bad, self.canary, self.canary_share = self.canary, None, 0.0
        if bad is not None:
            self._retire(bad)
        self._publish()
        return bad

    def _retire(self, version: str) -> None:
        w = self.workers.pop(version, None)
        if w is not None:
            w.retired = True
        self.metrics.drop_version(version)

    def _publish(self) -> None:
        self.metrics.set_versions(self.primary, self.canary)

    def route(self, pinned: str | None) -> EngineWorker:
        """The worker for a request: the pinned version, else canary for its share, else primary.

        The canary gets exactly ``floor(n * share)`` of the first n unpinned requests
        (deterministic, no random draws), so small tests see the configured share.
        """
        if pinned is not None:
            return self.workers[pinned]
        with self._lock:
            n = next(self._counter)
            # request n goes to the canary when floor((n + 1) * share) > floor(n * share)
            to_canary = self.canary is not None and int((n + 1) * self.canary_share) > int(n * self.canary_share)
            version = self.canary if to_canary else self.primary
        if version is None:
            raise ApiError(503, "no model version is loaded", type_="server_error", kind="internal")
        return self.workers[version]

    def versions(self) -> list[str]:
        """Versions currently routable."""
        return list(self.workers)

    def engine_stats(self) -> dict[str, dict[str, Any]]:
        """Latest engine ``stats()`` per version (snapshots taken by each engine thread)."""
        return {v: dict(w.stats) for v, w in self.workers.items()}

    def health(self) -> dict[str, Any]:
        """Status for ``GET /health``: versions, requests in flight, engine slots in use."""
        stats = self.engine_stats()
        dead = [v for v, w in self.workers.items() if w.error is not None or not w.thread.is_alive()]
        return {
            "status": "ok" if self.primary and not dead else "degraded",
            "model": self.config.model_name, "primary": self.primary, "canary": self.canary,
            "canary_share": self.canary_share, "in_flight": self.in_flight,
            "running": sum(s.get("running", 0) for s in stats.values()),
            "waiting": sum(s.get("waiting", 0) for s in stats.values()),
            "kv_used_tokens": sum(s.get("kv_used_tokens", 0) for s in stats.values()),
            "dead_engines": dead, "uptime_s": round(time.time() - self.started, 3),
        }

    def close(self) -> None:
        """Stop every engine thread."""
        for w in list(self.workers.values()):
            w.close()

    # ---- one request -------------------------------------------------------------------
    def admit(self) -> None:
        """Count a request in, or raise 429 when the queue is full."""
        with self._lock:
            if self.in_flight >= self.config.max_batch_size * max(1, len(self.workers)) + self.config.max_waiting:
                raise ApiError(429, f"the server is full ({self.in_flight} requests in flight); retry after a moment",
                               type_="rate_limit_error", code="rate_limit_exceeded", kind="rate_limited",
                               headers={"Retry-After": str(self.config.retry_after_s)})
            self.in_flight += 1

    def release(self) -> None:
        """Count a request out."""
        with self._lock:
            self.in_flight -= 1
