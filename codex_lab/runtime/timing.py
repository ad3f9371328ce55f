"""Timing code on a shared machine: the median wall time of one function, and several
functions timed in interleaved, rotating rounds so that their ratios stay fair when other
processes load the machine (re-exported by :mod:`codex_lab.runtime`).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def median_ms(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, sync: Callable[[], None] | None = None) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def round_order(names: Sequence[T], rnd: int) -> list[T]:
    """``names`` rotated by ``rnd``: the order of round ``rnd`` of an interleaved run, so no entry
    always runs first (a cold cache) or right after the same other one (whose caches it inherits)."""
    k = rnd % len(names) if names else 0
    return list(names[k:]) + list(names[:k])


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None] | None = None,
                      ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process-CPU milliseconds of each fn, ``repeats`` rounds, one call per fn per round.

    Round-robin order spreads any load from other processes (and any drift of the machine's
    speed during the run) evenly over the implementations, so their ratios stay fair on a
    shared machine; timing each one in a block of its own would give the first and the
    last different machines. The order rotates every round, so no fn always runs right
    after the same other one (whose caches it would inherit).
    """
    wall: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for i in range(repeats if names else 0):
        for name in round_order(names, i):
            if sync:
                sync()
            w0, c0 = time.perf_counter(), time.process_time()
            fns[name]()
            if sync:
                sync()
            wall[name].append((time.perf_counter() - w0) * 1000.0)
            cpu[name].append((time.process_time() - c0) * 1000.0)
    return wall, cpu
