"""One model version = one :class:`~codex_lab.infer.engine.loop.Engine` and the one thread that steps it.

Every engine call happens on that thread; HTTP handlers talk to it through a command
queue, and events come back to asyncio with ``loop.call_soon_threadsafe``. Each request
sees, in order: ``("accepted", rid)`` or ``("refused", message)`` (the engine said no: its
input, a 400), then ``("token", id)`` events, then ``("done", Finished)`` or
``("error", message)`` (serving this request failed; the others go on).

A whole engine step that raises fails the requests then in flight (500s), their slots are
freed and the thread keeps serving; only ``max_step_failures`` failed steps in a row mark the
engine dead (503 from then on, ``/health`` degraded).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.sampling import SamplingParams
from codex_lab.serve.protocol import CompletionRequest
from codex_lab.serve.api_errors import ApiError


class WorkerClosed(RuntimeError):
    """A retired version's engine thread has stopped; route the request again."""


def refuse_closed(worker: Any) -> None:
    """Raise what a request sent to ``worker`` gets when it cannot take it: a 503
    :class:`ApiError` if its engine is dead, :class:`WorkerClosed` if it retired and stopped.
    Call it holding the worker's gate (it orders submits against the worker's decision to stop)."""
    if worker.error is not None:
        raise ApiError(503, f"the engine of version {worker.version} failed ({worker.error}); retry later",
                       type_="server_error", code="engine_failed", kind="internal")
    if worker.closed:
        raise WorkerClosed(worker.version)


class Live:
    """One request in flight: its asyncio queue of events, token timestamps and engine id."""

    def __init__(self, loop: asyncio.AbstractEventLoop, req: CompletionRequest, params: SamplingParams,
                 deadline_s: float) -> None:
        self.loop, self.req, self.params, self.deadline_s = loop, req, params, deadline_s
        self.events: asyncio.Queue = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.token_times: list[float] = []
        self.rid: int | None = None
        self.pid: int | None = None  # an engine process's id for it (serve.engine_process)
        self.cancelled = False
        self.logprobs: list = []  # with params.logprobs: the engine appends one TokenLogprob per token

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
        if fin.finish_reason == "error":
            self.post(("error", fin.error or "the engine failed on this request"))
        else:
            self.post(("done", fin))


def _deliver(items: list[tuple[asyncio.Queue, tuple]]) -> None:
    """Put a step's token events into their requests' queues (on the event loop)."""
    for q, item in items:
        q.put_nowait(item)


def deliver_step(events: list[tuple[Live, tuple]]) -> None:
    """Hand one step's ``(request, event)`` pairs to asyncio: one ``call_soon_threadsafe`` per
    event loop per step instead of one per token (each call wakes the loop and takes the GIL)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, tuple]]] = {}
    for live, item in events:
        by_loop.setdefault(live.loop, []).append((live.events, item))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # event loop closed (server shutting down)
            pass


class EngineWorker:
    """One model version served by one engine stepped by one thread.

    Args:
        version: the version's name (a label on its metrics).
        model, tokenizer: what the engine runs.
        max_batch_size: the engine's batch.
        step_delay_s: extra sleep per engine step: fault injection, to demonstrate a slow
            candidate being caught by the canary (0 in normal use).
        engine_factory: builds the engine (default: ``codex_lab.infer.engine.loop.Engine``).
        max_step_failures: failed engine steps in a row after which the engine is dead.
    """

    def __init__(self, version: str, model: Any, tokenizer: CodeTokenizer, *, max_batch_size: int = 8,
                 step_delay_s: float = 0.0, engine_factory: Callable[..., Any] | None = None,
                 max_step_failures: int = 3) -> None:
        if engine_factory is None:
            from codex_lab.infer.engine.loop import Engine as engine_factory  # noqa: N813
        self.version, self.model, self.tokenizer = version, model, tokenizer
        self.step_delay_s, self.max_step_failures = step_delay_s, max_step_failures
        self.engine = engine_factory(model, tokenizer, max_batch_size=max_batch_size)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.live: dict[int, Live] = {}
        self.stats: dict[str, Any] = self.engine.stats()
        self.stats_every_s = 0.05  # stats() between steps at most this often (always when requests come or go, or idle)
        self._stats_at = 0.0
        self.batch_events = True  # token events of one step go to the event loop in one call (False: one per token)
        self._pending: list[tuple[Live, tuple]] = []  # token events of the current step
        self.steps = 0
        self.failed_steps = 0  # in a row
        self._stop = threading.Event()
        self._gate = threading.Lock()  # orders submit() against the thread's decision to exit
        self.retired = False  # no new requests; the thread exits once idle
        self.closed = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"engine-{version}", daemon=True)
        self.thread.start()

    def submit(self, live: Live) -> None:
        """Queue a request for the engine (thread-safe).

        Raises :class:`WorkerClosed` if this retired worker has already stopped (route
        again), and a 503 :class:`ApiError` if its engine is dead.
        """
        with self._gate:
            refuse_closed(self)
            self.inbox.put(("submit", live))

    def cancel(self, live: Live) -> None:
        """Cancel a request now (thread-safe): its slot and KV blocks are freed at the next step."""
        self.inbox.put(("cancel", live))

    def _accept(self, live: Live) -> None:
        # the engine's deadline counts from its own arrival: give it what is left of ours
        remaining = max(1e-3, live.arrival + live.deadline_s - time.perf_counter())
        try:
            extra = {"logprobs": live.logprobs} if live.params.logprobs is not None else {}
            on_token = self._on_token(live) if self.batch_events else live.on_token
            live.rid = self.engine.submit(live.req.prompt_ids, live.params, on_token=on_token,
                                          deadline_s=remaining, **extra)
        except ValueError as exc:  # the engine refuses this input: the client's error
            live.post(("refused", str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 (anything else fails this request only)
            live.post(("error", f"{type(exc).__name__}: {exc}"))
            return
        self.live[live.rid] = live
        live.post(("accepted", live.rid))

    def _on_token(self, live: Live) -> Callable[[int, str], None]:
        """``live.on_token`` that holds the event until the step ends (see :meth:`_flush`)."""
        def on_token(token_id: int, text: str) -> None:  # engine thread
            live.token_times.append(time.perf_counter())
            self._pending.append((live, ("token", token_id)))
        return on_token

    def _flush(self) -> None:
        """Hand the step's token events to asyncio (:func:`deliver_step`)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        deliver_step(pending)

    def _drain(self, block: bool) -> bool:
        """Apply the queued submits and cancels; whether there were any."""
        try:
            cmd, live = self.inbox.get(timeout=0.02) if block else self.inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            if cmd == "submit" and not live.cancelled:
                self._accept(live)
            elif cmd == "cancel":
                live.cancelled = True
                if live.rid is not None and self.live.pop(live.rid, None) is not None:
                    self.engine.cancel(live.rid)
            try:
                cmd, live = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _step(self) -> bool:
        """One engine step; whether a request finished (or the step failed)."""
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        try:
            finished = self.engine.step()
        except Exception as exc:  # noqa: BLE001 (a whole step failed: fail its requests, keep serving)
            self._flush()  # the tokens streamed before the failure come first
            self.failed_steps += 1
            self._fail_live(f"{type(exc).__name__}: {exc}")
            if self.failed_steps >= self.max_step_failures:
                raise
            return True
        self.failed_steps = 0
        self._flush()  # a request's tokens before its end
        for fin in finished:
            live = self.live.pop(fin.rid, None)
            if live is not None:
                live.on_finish(fin)
        self.steps += 1
        return bool(finished)

    def _fail_live(self, message: str) -> None:
        """Fail every request in flight and free their engine slots."""
        for rid, live in list(self.live.items()):
            live.post(("error", message))
            try:
                self.engine.cancel(rid)
            except Exception:  # noqa: BLE001 (the engine is already broken; the slot is lost with it)
                pass
        self.live.clear()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                changed = self._drain(block=not self.engine.has_work())
                busy = self.engine.has_work()
                if busy:
                    changed = self._step() or changed
                now = time.perf_counter()
                # stats() walks every request: not every step, but whenever requests came, went or all is idle
                if changed or not busy or now - self._stats_at >= self.stats_every_s:
                    self.stats, self._stats_at = self.engine.stats(), now
                if self.retired and not self.live and not self.engine.has_work():
                    with self._gate:
                        if self.inbox.empty():
                            self.closed = True
                            self.stats = {}
                            return
        except BaseException as exc:  # the engine is dead: tell everyone waiting, refuse new requests
            with self._gate:
                self.error = exc
            self._fail_live(f"{type(exc).__name__}: {exc}")
            while True:
                try:
                    cmd, live = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if cmd == "submit":
                    live.post(("error", f"{type(exc).__name__}: {exc}"))

    def phase(self) -> dict[str, Any]:
        """This version's readiness: ``phase`` is "warming" while the background compile runs (the
        eager step serves), "ready" when the compiled graphs serve (or the engine compiles nothing:
        ``--no-compile``), "degraded" when the compile failed (the eager step serves) or the engine
        thread is dead; ``graphs_done`` / ``graphs_total``: the compile's progress (0 / 0 without
        a compiled step); ``error``: why it is degraded ("" otherwise)."""
        step = getattr(self.engine, "fast_step", None)
        done, total = step.compile_progress() if step is not None else (0, 0)
        out: dict[str, Any] = {"phase": "ready", "graphs_done": done, "graphs_total": total, "error": ""}
        if self.error is not None or (not self.thread.is_alive() and not self.closed):
            out.update(phase="degraded", error=f"engine failed: {type(self.error).__name__}: {self.error}"
                       if self.error is not None else "engine thread stopped")
        elif step is not None and step.warming:
            out["phase"] = "warming"
        elif step is not None and not step.compiled:  # asked to compile, serving eagerly instead
            out.update(phase="degraded", error=f"compile failed, the eager step serves: {step.compile_error}")
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (requests still in flight are dropped)."""
        self._stop.set()
        self.thread.join(timeout)
