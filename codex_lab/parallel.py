"""Independent units of an experiment (seeds, arms) run side by side, one process per core.

Every lesson trains with one math thread on a 2-core machine (``runtime.compute_threads``:
two OpenMP threads per step were slower than one on such a machine), so a report section that
trains its seeds one after the other leaves a core idle. :func:`run_units` runs the units of an
experiment in worker processes instead, each with ``compute_threads()`` math threads, and
returns their results in the order given: the same numbers as running them in a loop (every
unit seeds its own initialisation, data order and evaluation sample; ``tests/test_parallel.py``
holds the two paths equal), in about ``1 / workers`` of the wall time.

How many workers (:func:`unit_workers`): ``CODEX_LAB_JOBS=N`` wins (1 runs the units in this
process: the plain reference path; the test suite sets it, since pytest's own workers already
hold the cores); otherwise 1 on a CUDA device (one GPU: processes would queue on it), else
``cores // compute_threads()`` capped by the number of units. Workers are spawned (not forked:
a forked child of a process holding OpenMP or the compile thread's locks can hang) and stay
quiet (no progress bars); a unit gets its sizes in its arguments, never from the mode of the
process that started it; a unit's exception reaches the caller with the unit named; on Linux a
worker ends when the process that started it dies, however it was stopped.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Mapping, Sequence, TypeVar

import torch

from codex_lab.runtime import compute_threads, get_device

R = TypeVar("R")
JOBS_ENV = "CODEX_LAB_JOBS"


def unit_workers(n_units: int) -> int:
    """How many processes :func:`run_units` uses for ``n_units`` units (module docstring)."""
    if n_units <= 1:
        return 1
    env = os.environ.get(JOBS_ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"{JOBS_ENV}={env!r}: give a positive whole number of worker processes, e.g. 1 or 2")
        return min(int(env), n_units)
    if get_device().type == "cuda":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # processes x math threads each <= cores
    return max(1, min(n_units, cores // compute_threads()))


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and by its finished worker processes (user + system;
    :func:`run_units` waits for its workers, so their time is counted once it returns)."""
    import resource
    import time

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _die_with_parent(parent: int) -> None:
    """Linux: this worker gets SIGTERM when the process that started it dies. Without it, a run
    stopped by its pid (``kill PID``, not Ctrl-C, which signals the whole group) leaves its
    workers training on, writing the checkpoints a resumed run will read."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _start_worker(env: Mapping[str, str], threads: int, parent: int | None = None) -> None:
    if parent is not None:
        _die_with_parent(parent)
    os.environ.update(env)
    torch.set_num_threads(threads)


def _call(fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    return fn(*args, **kwargs)


def run_units(fn: Callable[..., R], units: Sequence[tuple[Any, ...] | Mapping[str, Any]], *,
              common: Mapping[str, Any] | None = None, jobs: int | None = None,
              names: Sequence[str] | None = None, on_done: Callable[[int, R], None] | None = None) -> list[R]:
    """``[fn(*unit, **common) for unit in units]`` (a unit that is a mapping is passed as keywords),
    run in :func:`unit_workers` processes; results in the order of ``units``.

    ``fn`` must be importable by name (a module-level function: workers are spawned), and its
    arguments and result picklable (tensors travel through shared memory). ``jobs`` overrides
    the worker count (1: in this process). ``names`` label the units in an error (default:
    ``unit 0``, ``unit 1``, ...).
    """
    common = dict(common or {})
    calls = [((), {**u, **common}) if isinstance(u, Mapping) else (tuple(u), dict(common)) for u in units]
    labels = list(names) if names is not None else [f"unit {i}" for i in range(len(calls))]
    if len(labels) != len(calls):
        raise ValueError(f"names: {len(labels)} labels for {len(calls)} units; give one per unit")
    workers = unit_workers(len(calls)) if jobs is None else max(1, min(jobs, len(calls)))
    if workers == 1:  # the plain path: a loop in this process
        out1: list[R] = []
        for i, (a, kw) in enumerate(calls):
            out1.append(fn(*a, **kw))
            if on_done is not None:
                on_done(i, out1[-1])
        return out1
    if getattr(fn, "__qualname__", "").count("<"):
        raise ValueError(f"{fn!r} is not importable by name (a lambda or a nested function); workers are spawned "
                         f"and need a module-level function, or set {JOBS_ENV}=1 to run the units here")
    import multiprocessing

    env = {"CODEX_LAB_PROGRESS": "0", JOBS_ENV: "1"}
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(env, compute_threads(), os.getpid()))
    futures = [pool.submit(_call, fn, a, kw) for a, kw in calls]
    index = {f: i for i, f in enumerate(futures)}
    got: dict[int, R] = {}
    try:
        for f in as_completed(futures):
            i = index[f]
            try:
                got[i] = f.result()
            except Exception as exc:
                raise RuntimeError(f"{labels[i]} of {getattr(fn, '__name__', fn)} failed in a worker process: "
                                   f"{type(exc).__name__}: {exc} (rerun with {JOBS_ENV}=1 to see it in this "
                                   f"process)") from exc
            if on_done is not None:
                on_done(i, got[i])
    except BaseException:  # an error or Ctrl-C: drop what has not started, do not wait for the rest
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [got[i] for i in range(len(calls))]


def _serve(conn: Any, factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           env: Mapping[str, str], threads: int, parent: int) -> None:
    """The loop of a :class:`Remote`'s process: build the object, then answer ``(name, args,
    kwargs)`` with ``("ok", result)`` or ``("error", text)`` until ``None`` or the pipe closes."""
    _start_worker(env, threads, parent)
    try:
        obj = factory(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        name, a, kw = msg
        try:
            conn.send(("ok", getattr(obj, name)(*a, **kw)))
        except BaseException as exc:  # noqa: BLE001
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Remote:
    """An object built by ``factory(*args, **kwargs)`` in a process of its own (spawned, with
    ``compute_threads()`` math threads, ended with the process that started it), its methods
    called through a pipe: ``call(name, *a)`` waits for the result; ``send(name, *a)`` then
    ``receive()`` lets several remotes work side by side (:func:`call_all`).

    Use: the seeds of one arm trained in lockstep (each chunk every seed, then the arm judged)
    on as many cores as there are seeds. Each seed's arithmetic is the one it has in place (one
    math thread, its own generators), so the numbers are the same either way
    (``tests/test_parallel.py``). ``factory``, arguments and results must pickle."""

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.label = getattr(factory, "__name__", str(factory))
        env = {"CODEX_LAB_PROGRESS": "0", JOBS_ENV: "1"}
        self._proc = ctx.Process(target=_serve, args=(child, factory, args, kwargs, env, compute_threads(), os.getpid()),
                                 name=f"codex-lab {self.label}")
        self._proc.start()
        child.close()
        self._pending = True  # the factory's answer
        try:
            self.receive()
        except RuntimeError:  # the object was not built: its process has ended; nothing is left open
            self._proc.join(5)
            self._conn.close()
            raise

    def send(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start ``obj.name(*args, **kwargs)`` in the process; :meth:`receive` gives its result."""
        if self._pending:
            raise RuntimeError(f"{self.label}: a call is still in flight; receive() its result first")
        self._conn.send((name, args, kwargs))
        self._pending = True

    def receive(self) -> Any:
        """The result of the call :meth:`send` started (raises what it raised, as a RuntimeError)."""
        if not self._pending:
            raise RuntimeError(f"{self.label}: nothing was sent; send() a call first")
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            raise RuntimeError(f"the process of {self.label} ended (exit code {self._proc.exitcode}) before it "
                               f"answered; rerun with {JOBS_ENV}=1 to see the error in this process") from None
        self._pending = False
        if kind == "error":
            raise RuntimeError(f"{self.label} failed in its process: {value} (rerun with {JOBS_ENV}=1 to see it "
                               f"in this process)")
        return value

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``obj.name(*args, **kwargs)`` in the process, waited for."""
        self.send(name, *args, **kwargs)
        return self.receive()

    def method(self, name: str) -> "RemoteMethod":
        """``obj.name`` as a callable that :func:`call_all` runs side by side with others."""
        return RemoteMethod(self, name)

    def close(self) -> None:
        """End the process (its object is gone; what it wrote to disk stays)."""
        if self._proc.is_alive():
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(5)
        self._conn.close()

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RemoteMethod:
    """One method of a :class:`Remote`: call it (waits), or let :func:`call_all` start it."""

    def __init__(self, remote: Remote, name: str) -> None:
        self.remote, self.name = remote, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.remote.call(self.name, *args, **kwargs)


def call_all(fns: Sequence[Callable[..., R]], *args: Any) -> list[R]:
    """``[fn(*args) for fn in fns]``, with every :class:`RemoteMethod` started first so that they
    run side by side (each in its own process); the others run here, in order. Results in the
    order of ``fns``; every started call is received before an error is raised (no remote is
    left with an answer in flight)."""
    for fn in fns:
        if isinstance(fn, RemoteMethod):
            fn.remote.send(fn.name, *args)
    out: list[Any] = []
    error: BaseException | None = None
    for fn in fns:
        try:
            out.append(fn.remote.receive() if isinstance(fn, RemoteMethod) else fn(*args))
        except Exception as exc:  # keep receiving the others' answers, then raise the first
            error = error or exc
            out.append(None)
    if error is not None:
        raise error
    return out


__all__ = ["JOBS_ENV", "Remote", "RemoteMethod", "call_all", "cpu_seconds", "run_units", "unit_workers"]
