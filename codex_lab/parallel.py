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


__all__ = ["JOBS_ENV", "cpu_seconds", "run_units", "unit_workers"]
