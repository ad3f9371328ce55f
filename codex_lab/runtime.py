"""Runtime knobs shared by every lesson: device choice, seeding and the fast-mode switch.

Fast mode (``CODEX_LAB_FAST=1``, on automatically when ``CI`` is set) shrinks steps and
sizes so that every notebook and the report run in minutes on 2 CPU cores. Full mode is
what a learner runs on a GPU. ``CODEX_LAB_FAST=0`` forces full mode even under CI.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Callable, TypeVar

import numpy as np
import torch

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def fast_mode() -> bool:
    """Return True when fast mode is on.

    ``CODEX_LAB_FAST`` wins when set (1/true/yes/on or 0/false/no/off); otherwise fast mode
    is on exactly when the ``CI`` variable is set to a non-empty, non-false value.
    """
    flag = os.environ.get("CODEX_LAB_FAST", "").strip().lower()
    if flag in _TRUE:
        return True
    if flag in _FALSE:
        return False
    if flag:
        raise ValueError(
            f"CODEX_LAB_FAST={flag!r} is not understood; use 1 (fast) or 0 (full)."
        )
    ci = os.environ.get("CI", "").strip().lower()
    return bool(ci) and ci not in _FALSE


def pick(fast: T, full: T) -> T:
    """Return ``fast`` in fast mode and ``full`` otherwise (one knob for every size)."""
    return fast if fast_mode() else full


def get_device(prefer: str | None = None) -> torch.device:
    """Choose the compute device: CUDA > MPS > CPU.

    ``prefer`` (or the ``CODEX_LAB_DEVICE`` variable) overrides the choice, for example
    ``"cpu"`` to reproduce CI on a GPU machine. Asking for a device that is not available
    is an error rather than a silent fallback.
    """
    name = prefer or os.environ.get("CODEX_LAB_DEVICE") or ""
    if name:
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {name!r} asked for but CUDA is not available; use 'cpu'.")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError(f"device {name!r} asked for but MPS is not available; use 'cpu'.")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a CPU generator seeded the same."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def describe_environment() -> dict[str, str]:
    """Versions, device and mode as plain strings, for reports and notebook headers."""
    import platform

    dev = get_device()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(dev),
        "threads": str(torch.get_num_threads()),
        "cpu_count": str(os.cpu_count()),
        "fast_mode": str(fast_mode()),
        "platform": platform.platform(),
    }
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


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
