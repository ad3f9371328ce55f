"""One model version's engine in a process of its own: HTTP parsing and SSE writing never wait for
the engine's Python, nor the engine for theirs.

:class:`~codex_lab.serve.worker.EngineWorker` steps the engine on a thread of the server's
process, so the engine's step orchestration (scheduling, sampling, the graph call's Python) and the
asyncio loop (parsing requests, writing each streamed token) take turns on one interpreter lock.
:class:`EngineProcess` has the same face (``submit``, ``cancel``, ``stats``, ``phase``, ``close``,
``retired``/``closed``/``error``) and runs the engine in a child process (``spawn``: a fresh
interpreter, its own lock and math threads):

- the parent sends ``("submit", id, prompt ids, sampling params, deadline, logprobs?)`` and
  ``("cancel", id)`` down a pipe;
- the child steps the engine and sends ONE message per step with every token of that step
  (id, token id, the time it was produced, its logprob entry when asked for) and every request
  that finished (its :class:`~codex_lab.infer.engine.scheduler.Finished`), then its stats and the
  compile's progress at most every ``stats_every_s``;
- a reader thread in the parent hands each step's events to the requests' asyncio queues with
  one ``call_soon_threadsafe`` per event loop, as the thread worker does.

A step that raises fails the requests in flight; ``max_step_failures`` in a row, or a child that
dies, mark the engine dead (503 from then on, ``/health`` degraded), as with the thread worker.
The tokens are the engine's own: the same engine code runs in the child (tests/test_engine_process.py
holds them equal to the thread worker's).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import threading
import time
from typing import Any, Callable

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.serve.worker import Live, deliver_step, refuse_closed


def _child(conn: Any, model: Any, tokenizer: CodeTokenizer, max_batch_size: int, step_delay_s: float,
           engine_factory: Callable[..., Any] | None, max_step_failures: int, threads: int,
           stats_every_s: float) -> None:
    """The child's loop: build the engine, then apply commands and step until told to stop."""
    import torch

    torch.set_num_threads(threads)
    if engine_factory is None:
        from codex_lab.infer.engine.loop import Engine as engine_factory  # noqa: N813
    try:
        engine = engine_factory(model, tokenizer, max_batch_size=max_batch_size)
    except BaseException as exc:  # noqa: BLE001 (the parent reports it: the engine never started)
        conn.send(("dead", f"{type(exc).__name__}: {exc}"))
        return
    ids: dict[int, int] = {}  # engine rid -> the parent's id
    rids: dict[int, int] = {}  # the parent's id -> engine rid
    logprobs: dict[int, list] = {}  # the parent's id -> the engine's logprob entries (when asked for)
    sent_lp: dict[int, int] = {}
    pending: list[tuple] = []  # this step's token events
    failed, stats_at = 0, 0.0

    def on_token_for(pid: int) -> Callable[[int, str], None]:
        def on_token(token_id: int, text: str) -> None:
            pending.append((pid, "token", token_id, time.perf_counter()))
        return on_token

    def fail_all(message: str) -> list[tuple]:
        out = [(pid, "error", message) for pid in rids]
        for rid in list(ids):
            try:
                engine.cancel(rid)
            except Exception:  # noqa: BLE001 (the engine is already broken)
                pass
        ids.clear()
        rids.clear()
        return out

    while True:
        try:
            changed = False
            while conn.poll(0 if engine.has_work() else 0.02):
                msg = conn.recv()
                changed = True
                if msg[0] == "stop":
                    return
                if msg[0] == "cancel":
                    rid = rids.pop(msg[1], None)
                    if rid is not None:
                        ids.pop(rid, None)
                        engine.cancel(rid)
                    continue
                _, pid, prompt_ids, params, deadline_s, want_lp = msg
                extra: dict[str, Any] = {}
                if want_lp:
                    extra["logprobs"] = logprobs.setdefault(pid, [])
                    sent_lp[pid] = 0
                try:
                    rid = engine.submit(prompt_ids, params, on_token=on_token_for(pid), deadline_s=deadline_s, **extra)
                except ValueError as exc:  # the engine refuses this input: the client's error
                    conn.send(("refused", pid, str(exc)))
                    continue
                except Exception as exc:  # noqa: BLE001 (anything else fails this request only)
                    conn.send(("error", pid, f"{type(exc).__name__}: {exc}"))
                    continue
                ids[rid], rids[pid] = pid, rid
                conn.send(("accepted", pid, rid))
            events: list[tuple] = []
            finished_any = False
            if engine.has_work():
                if step_delay_s:
                    time.sleep(step_delay_s)
                try:
                    finished = engine.step()
                except Exception as exc:  # noqa: BLE001 (a whole step failed: fail its requests, keep serving)
                    failed += 1
                    events = pending + fail_all(f"{type(exc).__name__}: {exc}")
                    pending.clear()
                    conn.send(("events", events))
                    if failed >= max_step_failures:
                        conn.send(("dead", f"{type(exc).__name__}: {exc}"))
                        return
                    continue
                failed = 0
                events, pending[:] = list(pending), []
                for pid, lst in logprobs.items():  # the logprob entries this step added, per request
                    if len(lst) > sent_lp.get(pid, 0):
                        events.append((pid, "logprobs", lst[sent_lp[pid]:]))
                        sent_lp[pid] = len(lst)
                for fin in finished:
                    pid = ids.pop(fin.rid, None)
                    if pid is not None:
                        rids.pop(pid, None)
                        logprobs.pop(pid, None)
                        sent_lp.pop(pid, None)
                        events.append((pid, "done", fin))
                        finished_any = True
                if events:
                    conn.send(("events", events))
            now = time.perf_counter()
            # stats() walks every request: when requests came or went, else every stats_every_s (idle: 0.25 s)
            if changed or finished_any or now - stats_at >= (stats_every_s if engine.has_work() else 0.25):
                step = getattr(engine, "fast_step", None)
                phase = ({"progress": step.compile_progress(), "warming": bool(step.warming),
                          "compiled": bool(step.compiled), "compile_error": step.compile_error}
                         if step is not None else None)
                conn.send(("stats", engine.stats(), phase))
                stats_at = now
        except (EOFError, BrokenPipeError, OSError):  # the parent is gone
            return
        except BaseException as exc:  # noqa: BLE001 (the engine is dead: say so, then stop)
            try:
                conn.send(("events", fail_all(f"{type(exc).__name__}: {exc}")))
                conn.send(("dead", f"{type(exc).__name__}: {exc}"))
            except (OSError, ValueError):
                pass
            return


class EngineProcess:
    """One model version served by one engine in a child process (see the module docstring).

    Args: as :class:`~codex_lab.serve.worker.EngineWorker` (``engine_factory`` must be picklable:
    a module-level function or a ``functools.partial`` of one), and ``threads``: the child's math
    threads (default: the parent's ``torch.get_num_threads()``).
    """

    def __init__(self, version: str, model: Any, tokenizer: CodeTokenizer, *, max_batch_size: int = 8,
                 step_delay_s: float = 0.0, engine_factory: Callable[..., Any] | None = None,
                 max_step_failures: int = 3, threads: int | None = None, stats_every_s: float = 0.05) -> None:
        import torch

        self.version, self.model, self.tokenizer = version, model, tokenizer
        self.stats: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.retired = False
        self.closed = False
        self._phase: dict[str, Any] | None = None
        self._live: dict[int, Live] = {}
        self._ids = itertools.count()
        # commands leave through a sender thread: a pipe that is full (a child still starting, or busy)
        # never blocks the event loop that submits
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._gate = threading.Lock()
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child, name=f"engine-{version}", daemon=True,
                                args=(child, model, tokenizer, max_batch_size, step_delay_s, engine_factory,
                                      max_step_failures, threads or torch.get_num_threads(), stats_every_s))
        self.proc.start()
        child.close()
        self.thread = threading.Thread(target=self._read, name=f"engine-{version}-reader", daemon=True)
        self.thread.start()
        self._sender = threading.Thread(target=self._send_loop, name=f"engine-{version}-sender", daemon=True)
        self._sender.start()

    # ---- the parent's side --------------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        self._outbox.put(msg)

    def _send_loop(self) -> None:
        """The sender thread: commands down the pipe in the order they were sent; ``None`` ends it."""
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            try:
                self._conn.send(msg)
            except (OSError, ValueError):  # the child is gone: the reader reports it
                return

    def submit(self, live: Live) -> None:
        """Send a request to the engine (thread-safe); :class:`WorkerClosed` if this retired worker
        has stopped, a 503 :class:`ApiError` if its engine is dead."""
        with self._gate:
            refuse_closed(self)
            pid = next(self._ids)
            live.pid = pid
            self._live[pid] = live
        # the engine's deadline counts from its own arrival: give it what is left of ours
        remaining = max(1e-3, live.arrival + live.deadline_s - time.perf_counter())
        self._send(("submit", pid, list(live.req.prompt_ids), live.params, remaining, live.params.logprobs is not None))

    def cancel(self, live: Live) -> None:
        """Cancel a request (thread-safe): its slot and KV blocks are freed at the child's next step."""
        live.cancelled = True
        pid = live.pid
        if pid is not None and self._live.pop(pid, None) is not None:
            self._send(("cancel", pid))

    def _read(self) -> None:
        """The reader thread: the child's messages to the requests' asyncio queues."""
        while True:
            try:
                if not self._conn.poll(0.05):
                    if self.retired and not self._live:
                        self._stop_child()
                        return
                    if not self.proc.is_alive():
                        raise EOFError("the engine process exited")
                    continue
                msg = self._conn.recv()
            except (EOFError, OSError) as exc:
                if not self.closed:
                    self._died(f"engine process gone: {exc}")
                return
            kind = msg[0]
            if kind == "events":
                self._events(msg[1])
            elif kind == "accepted":
                live = self._live.get(msg[1])
                if live is not None:
                    live.rid = msg[2]
                    live.post(("accepted", msg[2]))
            elif kind in ("refused", "error"):
                live = self._live.pop(msg[1], None)
                if live is not None:
                    live.post((kind, msg[2]))
            elif kind == "stats":
                self.stats, self._phase = msg[1], msg[2]
            elif kind == "dead":
                self._died(msg[1])
                return

    def _events(self, events: list[tuple]) -> None:
        out: list[tuple[Live, tuple]] = []
        for ev in events:
            pid, what = ev[0], ev[1]
            live = self._live.get(pid)
            if live is None:
                continue
            if what == "token":
                live.token_times.append(ev[3])  # stamped in the child (perf_counter is one clock system-wide)
                item: tuple = ("token", ev[2])
            elif what == "logprobs":
                live.logprobs.extend(ev[2])
                continue
            elif what == "done":
                self._live.pop(pid, None)
                fin = ev[2]
                item = ("error", fin.error or "the engine failed on this request") if fin.finish_reason == "error" \
                    else ("done", fin)
            else:  # "error": a failed step
                self._live.pop(pid, None)
                item = ("error", ev[2])
            out.append((live, item))
        deliver_step(out)

    def _died(self, why: str) -> None:
        with self._gate:
            self.error = RuntimeError(why)
        for live in list(self._live.values()):
            live.post(("error", why))
        self._live.clear()

    def _stop_child(self) -> None:
        with self._gate:
            self.closed = True
        self._send(("stop",))
        self._send(None)  # the sender ends after the stop
        self.proc.join(5)
        if self.proc.is_alive():  # a child still starting (spawn imports torch) or wedged in a step
            self.proc.terminate()
            self.proc.join(5)  # SIGTERM arrives when it arrives: wait for it, so close() returns with no child
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.stats = {}

    def phase(self) -> dict[str, Any]:
        """Readiness, as :meth:`EngineWorker.phase <codex_lab.serve.worker.EngineWorker.phase>` gives it,
        from the child's last report."""
        ph = self._phase
        done, total = ph["progress"] if ph else (0, 0)
        out: dict[str, Any] = {"phase": "ready", "graphs_done": done, "graphs_total": total, "error": ""}
        if self.error is not None or (not self.proc.is_alive() and not self.closed):
            out.update(phase="degraded", error=f"engine failed: {self.error}" if self.error is not None
                       else "engine process stopped")
        elif self.stats == {} and ph is None and not self.closed:
            out["phase"] = "warming"  # the child is still building its engine
        elif ph is not None and ph["warming"]:
            out["phase"] = "warming"
        elif ph is not None and not ph["compiled"]:
            out.update(phase="degraded", error=f"compile failed, the eager step serves: {ph['compile_error']}")
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Stop the child (requests still in flight are dropped)."""
        if not self.closed:
            self._stop_child()
        self.thread.join(timeout)


__all__ = ["EngineProcess"]
