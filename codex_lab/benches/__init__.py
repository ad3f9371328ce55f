"""Benchmarks behind ``codex-lab bench NAME [--json]``, one module per benchmark.

Each module defines ``NAME: str``, ``HELP: str``, ``add_arguments(parser)`` and
``run(args) -> list[dict]``: flat records (one per measured case) that the CLI prints as
a table or, with ``--json``, as a JSON list. Ratios are always taken within one run.
"""

from __future__ import annotations

import importlib
import pkgutil
import statistics
import time
from types import ModuleType
from typing import Callable


def discover() -> dict[str, ModuleType]:
    """Benchmark modules by their NAME."""
    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return {m.NAME: m for m in mods if hasattr(m, "NAME")}


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
