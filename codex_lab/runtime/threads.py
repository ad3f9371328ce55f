"""The math threads every lesson, report section and server uses, decided in one place
(``CODEX_LAB_THREADS``, else by the cores this process may run on; re-exported by
:mod:`codex_lab.runtime`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch


def compute_threads() -> int:
    """The math threads every lesson and report section uses (the one place that decides).

    ``CODEX_LAB_THREADS=N`` wins; otherwise 1 on a machine with at most 2 cores (the engine,
    server and clients, or pytest's two workers, share them: two OpenMP threads each ran
    lesson 05's fine-tunes 11x slower on a loaded machine), else all cores but one."""
    env = os.environ.get("CODEX_LAB_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"CODEX_LAB_THREADS={env!r}: give a positive whole number of threads, e.g. 1")
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cores <= 2 else cores - 1


@contextmanager
def use_compute_threads() -> Iterator[int]:
    """Run the block with :func:`compute_threads` math threads; restore the previous count after."""
    before = torch.get_num_threads()
    n = compute_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
