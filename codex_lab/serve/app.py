"""An OpenAI-compatible completions server over the continuous-batching engine.

Pieces:

- :class:`EngineWorker`: one model version = one :class:`~codex_lab.infer.engine.Engine` and the
  one thread that steps it. Every engine call happens on that thread; HTTP handlers talk to
  it through a command queue, and tokens come back to asyncio with
  ``loop.call_soon_threadsafe``.
- :class:`ModelServer`: the versions being served, the router (a primary version plus an
  optional canary taking a configurable share of traffic), limits and metrics.
- :func:`create_app`: the FastAPI app: ``POST /v1/completions`` (plain and server-sent
  events ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /health``, ``GET /metrics``.
- :class:`BackgroundServer` / :func:`serve_in_background`: uvicorn in a thread on a loopback
  port (tests, notebooks).

Limits: bodies over the size limit -> 413, bad fields -> 400, unknown model -> 404, more
requests in flight than ``max_batch_size`` per version ``+ max_waiting`` -> 429; each request has a
deadline (30 s by default) and ends with ``finish_reason="deadline"`` when it passes it; a
client that disconnects is cancelled in the engine at once, freeing its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from codex_lab.serve.metrics import ServerMetrics
from codex_lab.serve.protocol import ApiError, CompletionRequest, Limits, parse_completion, parse_json, safe_text
from codex_lab.data.tokenizer import CodeTokenizer

LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
    """

    model_name: str = "codex-lab-tiny"
    max_batch_size: int = 8
    max_waiting: int = 32
    deadline_s: float = 30.0
    limits: Limits = field(default_factory=Limits)


class WorkerClosed(RuntimeError):
    """A retired version's engine thread has stopped; route the request again."""


class EngineFailure(RuntimeError):
    """An engine thread failed while serving a request (counted once, with its version)."""


class _Live:
    """One request in flight: its asyncio queue of events, token timestamps and engine id."""

    def __init__(self, loop: asyncio.AbstractEventLoop, req: CompletionRequest, version: str, deadline_s: float) -> None:
        self.loop, self.req, self.version, self.deadline_s = loop, req, version, deadline_s
        self.events: asyncio.Queue = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.token_times: list[float] = []
        self.rid: int | None = None
        self.cancelled = False

    def post(self, item: tuple) -> None:
        """Hand an event to the request's asyncio queue (safe from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # event loop closed (server shutting down)
            pass

    def on_token(self, token_id: int, text: str) -> None:  # engine thread
        self.token_times.append(time.perf_counter())
        self.post(("token", token_id))

    def on_finish(self, fin: Any) -> None:  # engine thread
        self.post(("done", fin))


class EngineWorker:
    """One model version served by one engine stepped by one thread.

    Args:
        version: the version's name (a label on its metrics).
        model, tokenizer: what the engine runs.
        max_batch_size: the engine's batch.
        step_delay_s: extra sleep per engine step: fault injection, to demonstrate a slow
            candidate being caught by the canary (0 in normal use).
        engine_factory: builds the engine (default: ``codex_lab.infer.engine.Engine``).
    """

    def __init__(self, version: str, model: Any, tokenizer: CodeTokenizer, *, max_batch_size: int = 8,
                 step_delay_s: float = 0.0, engine_factory: Callable[..., Any] | None = None) -> None:
        if engine_factory is None:
            from codex_lab.infer.engine import Engine as engine_factory  # noqa: N813
        # the engine's own SamplingParams class (a test engine may bring its own)
        self.params_cls = getattr(sys.modules[engine_factory.__module__], "SamplingParams")
        self.version, self.model, self.tokenizer = version, model, tokenizer
        self.step_delay_s = step_delay_s
        self.engine = engine_factory(model, tokenizer, max_batch_size=max_batch_size)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.live: dict[int, _Live] = {}
        self.stats: dict[str, Any] = self.engine.stats()
        self.steps = 0
        self._stop = threading.Event()
        self._gate = threading.Lock()  # orders submit() against the thread's decision to exit
        self.retired = False  # no new requests; the thread exits once idle
        self.closed = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"engine-{version}", daemon=True)
        self.thread.start()

    def submit(self, live: _Live) -> None:
        """Queue a request for the engine (thread-safe).

        Raises :class:`WorkerClosed` if this retired worker has already stopped (route
        again), and a 503 :class:`ApiError` if its engine crashed.
        """
        with self._gate:
            if self.error is not None:
                raise ApiError(503, f"the engine of version {self.version} failed ({self.error}); retry later",
                               type_="server_error", code="engine_failed", kind="internal")
            if self.closed:
                raise WorkerClosed(self.version)
            self.inbox.put(("submit", live))

    def cancel(self, live: _Live) -> None:
        """Cancel a request now (thread-safe): its slot and KV blocks are freed at the next step."""
        self.inbox.put(("cancel", live))

    def _drain(self, block: bool) -> None:
        try:
            cmd, live = self.inbox.get(timeout=0.02) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd == "submit" and not live.cancelled:
                r = live.req
                params = self.params_cls(max_tokens=r.max_tokens, temperature=r.temperature, top_k=r.top_k,
                                        top_p=r.top_p, stop=list(r.stop), seed=r.seed)
                # the engine's deadline counts from its own arrival: give it what is left of ours
                remaining = max(1e-3, live.arrival + live.deadline_s - time.perf_counter())
                try:
                    live.rid = self.engine.submit(r.prompt_ids, params, on_token=live.on_token, deadline_s=remaining)
                    self.live[live.rid] = live
                except Exception as exc:  # refused by the engine: fail this request only
                    live.post(("error", exc))
            elif cmd == "cancel":
                live.cancelled = True
                if live.rid is not None and self.live.pop(live.rid, None) is not None:
                    self.engine.cancel(live.rid)
            try:
                cmd, live = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                busy = self.engine.has_work()
                self._drain(block=not busy)
                if self.engine.has_work():
                    if self.step_delay_s:
                        time.sleep(self.step_delay_s)
                    for fin in self.engine.step():
                        live = self.live.pop(fin.rid, None)
                        if live is not None:
                            live.on_finish(fin)
                    self.steps += 1
                self.stats = self.engine.stats()
                if self.retired and not self.live and not self.engine.has_work():
                    with self._gate:
                        if self.inbox.empty():
                            self.closed = True
                            self.stats = {}
                            return
        except BaseException as exc:  # surface engine crashes to waiting requests
            with self._gate:
                self.error = exc
            for live in list(self.live.values()):
                live.post(("error", exc))
            self.live.clear()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (requests still in flight are dropped)."""
        self._stop.set()
        self.thread.join(timeout)


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
        self.workers[version] = EngineWorker(version, model, self.tokenizer, max_batch_size=self.config.max_batch_size,
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
                               type_="rate_limit_error", code="rate_limit_exceeded", kind="rate_limited")
            self.in_flight += 1

    def release(self) -> None:
        """Count a request out."""
        with self._lock:
            self.in_flight -= 1


async def _watch_disconnect(receive: Callable[[], Any], on_disconnect: Callable[[], None]) -> None:
    """Wait for the client's ``http.disconnect`` and call ``on_disconnect``."""
    while True:
        msg = await receive()
        if msg.get("type") == "http.disconnect":
            on_disconnect()
            return


def _chunk(cid: str, created: int, model: str, text: str, finish: str | None, usage: dict | None = None) -> str:
    obj: dict[str, Any] = {"id": cid, "object": "text_completion", "created": created, "model": model,
                           "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return f"data: {json.dumps(obj)}\n\n"


def create_app(server: ModelServer) -> Any:
    """The FastAPI app serving ``server`` (see the module docstring for the routes)."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        server.close()

    app = FastAPI(title="codex-lab server", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.server = server
    cfg, metrics, tok = server.config, server.metrics, server.tokenizer

    def err(e: ApiError) -> JSONResponse:
        metrics.error(e.kind)
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request"
        return err(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind=kind))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        e = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error", kind="internal")
        if isinstance(exc, EngineFailure):  # already counted, with its version
            return JSONResponse(e.body(), status_code=500)
        return err(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error", kind="internal"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/metrics")
    async def prom() -> PlainTextResponse:
        for v, s in server.engine_stats().items():
            metrics.set_engine_stats(v, s)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        ids = [cfg.model_name] + [f"{cfg.model_name}@{v}" for v in server.versions()]
        return {"object": "list", "data": [{"id": i, "object": "model", "created": int(server.started),
                                            "owned_by": "codex-lab"} for i in ids]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        try:
            declared = int(request.headers.get("content-length") or 0)
            if declared > cfg.limits.max_body_bytes:
                raise ApiError(413, f"request body is {declared} bytes; the limit is {cfg.limits.max_body_bytes}",
                               code="body_too_large", kind="too_large")
            raw = bytearray()
            async for part in request.stream():
                raw += part
                if len(raw) > cfg.limits.max_body_bytes:
                    raise ApiError(413, f"request body exceeds the limit of {cfg.limits.max_body_bytes} bytes",
                                   code="body_too_large", kind="too_large")
            body = parse_json(bytes(raw), cfg.limits)
            req = parse_completion(body, tok, cfg.limits, cfg.model_name, server.versions())
            server.admit()
        except ApiError as e:
            return err(e)
        try:
            for attempt in range(3):  # a version retired between routing and submitting: route again
                try:
                    worker = server.route(req.version)
                    live = _Live(asyncio.get_running_loop(), req, worker.version, cfg.deadline_s)
                    worker.submit(live)
                    break
                except (WorkerClosed, KeyError):
                    if attempt == 2 or req.version is not None:
                        raise ApiError(404 if req.version else 503, f"version {req.version or 'primary'} is no longer "
                                       "served", param="model", code="model_not_found", kind="not_found") from None
        except ApiError as e:
            server.release()
            return err(e)
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        headers = {"x-codex-lab-version": worker.version}

        def on_disconnect() -> None:
            if not live.cancelled:
                worker.cancel(live)
                live.post(("disconnect", None))

        async def events() -> AsyncIterator[tuple[str, Any]]:
            """(kind, value): ("delta", text) while running, then ("end", (text, reason, n_tokens))."""
            watcher = asyncio.create_task(_watch_disconnect(request.receive, on_disconnect))
            ids: list[int] = []
            sent, reason, done, failed = "", None, False, False
            try:
                hard_deadline = live.arrival + cfg.deadline_s + 2.0  # engine enforces the deadline; this is a guard
                while True:
                    left = hard_deadline - time.perf_counter()
                    try:
                        kind, val = await asyncio.wait_for(live.events.get(), timeout=max(left, 0.0))
                    except asyncio.TimeoutError:
                        worker.cancel(live)
                        text, reason = safe_text(tok.decode(ids), req.stop)[0], "deadline"
                        break
                    if kind == "token":
                        ids.append(val)
                        text, hit = safe_text(tok.decode(ids), req.stop)
                        if hit:  # the server enforces stop strings itself, whatever the engine does
                            worker.cancel(live)
                            reason = "stop"
                            break
                        if len(text) > len(sent) and text.startswith(sent):
                            yield "delta", text[len(sent):]
                            sent = text
                    elif kind == "done":
                        out = list(val.output_ids) if len(val.output_ids) >= len(ids) else ids
                        ids = out
                        text, hit = safe_text(tok.decode(ids), req.stop)
                        if not hit and val.finish_reason != "stop":
                            text = tok.decode(ids)  # the end: send any held-back tail
                        reason = "stop" if hit else val.finish_reason
                        break
                    elif kind == "disconnect":
                        reason = "disconnected"
                        return
                    elif kind == "error":
                        failed = True
                        raise EngineFailure(f"the engine of version {worker.version} failed: {val}")
                done = True
                yield "end", (text, reason, len(ids))
            finally:
                watcher.cancel()
                if not done and not live.cancelled:
                    worker.cancel(live)  # the client went away (or we failed): free the slot now
                server.release()
                if failed:
                    metrics.error("internal", worker.version)
                elif reason == "disconnected" or (not done and reason is None):
                    metrics.error("disconnected", worker.version)
                elif reason is not None:
                    metrics.observe_request(worker.version, arrival=live.arrival, token_times=live.token_times[: len(ids)],
                                            prompt_tokens=len(req.prompt_ids), finish_reason=reason)

        def usage(n_out: int) -> dict[str, int]:
            return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": n_out,
                    "total_tokens": len(req.prompt_ids) + n_out}

        if req.stream:
            async def sse() -> AsyncIterator[str]:
                sent, ev = "", events()
                try:
                    async for kind, val in ev:
                        if kind == "delta":
                            sent += val
                            yield _chunk(cid, created, cfg.model_name, val, None)
                        else:
                            text, reason, n = val
                            tail = text[len(sent):] if text.startswith(sent) else ""
                            yield _chunk(cid, created, cfg.model_name, tail, reason, usage(n))
                    yield "data: [DONE]\n\n"
                finally:
                    await ev.aclose()  # runs the request's clean-up even if the client vanished

            return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)

        result = None
        async for kind, val in events():
            if kind == "end":
                result = val
        if result is None:  # client gone: nobody reads this
            return JSONResponse({"error": {"message": "client disconnected", "type": "invalid_request_error",
                                           "param": None, "code": "disconnected"}}, status_code=499)
        text, reason, n = result
        return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": cfg.model_name,
                             "system_fingerprint": worker.version,
                             "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
                             "usage": usage(n)}, headers=headers)

    return app


def check_loopback(host: str) -> None:
    """Raise ValueError unless ``host`` is a loopback name (the course never serves outside)."""
    if host not in LOOPBACK:
        raise ValueError(f"host {host!r} is not loopback; use 127.0.0.1 (the course only serves and loads "
                         "this machine)")


class BackgroundServer:
    """uvicorn serving an app in a daemon thread on 127.0.0.1; ``url`` and ``stop()``."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        check_loopback(host)
        self.sock = socket.socket(socket.AF_INET6 if host == "::1" else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{'[::1]' if host == '::1' else host}:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=2)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="uvicorn")
        self.thread.start()
        t0 = time.time()
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.time() - t0 > 30:
                raise RuntimeError("the server did not start within 30 s")
            time.sleep(0.01)

    def stop(self) -> None:
        """Shut uvicorn down and join its thread."""
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.sock.close()


def serve_in_background(server: ModelServer, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """Start ``create_app(server)`` on a loopback port; returns the handle (``.url``, ``.stop()``)."""
    return BackgroundServer(create_app(server), host=host, port=port)
