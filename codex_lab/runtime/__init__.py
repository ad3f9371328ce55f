"""Runtime knobs shared by every lesson: device choice, seeding, expected run times, progress bars.

The mode (fast, standard or full) is :mod:`codex_lab.runtime.mode`: resolved once by an entry
point (:func:`resolve_mode`; a notebook's ``MODE = cl.lesson_header("05")``) into a
:class:`Mode` that is passed to whatever needs a size (``mode.pick(fast=..., full=...)``).
``lesson_header`` prints the mode, why, and the lesson's expected time on this machine
(recorded timings scaled by a quick matmul calibration).

Timing a function (``median_ms``, ``interleaved_times``) is :mod:`codex_lab.runtime.timing`;
the math-thread policy (``compute_threads``) is :mod:`codex_lab.runtime.threads`; both are
re-exported here.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, TypeVar

import numpy as np
import torch

from codex_lab.runtime.mode import MODES, Mode, resolve_mode
from codex_lab.runtime.threads import compute_threads, use_compute_threads
from codex_lab.runtime.timing import interleaved_times, median_ms, round_order

T = TypeVar("T")

_FALSE = {"0", "false", "no", "off"}
TIMINGS_PATH = Path(__file__).parents[1] / "assets" / "timings.json"  # codex_lab/assets


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


def describe_environment(mode: Mode | None = None) -> dict[str, str]:
    """Versions, device and (when given) the run's mode as plain strings, for reports and notebook headers."""
    import platform

    dev = get_device()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(dev),
        "threads": str(torch.get_num_threads()),
        "cpu_count": str(os.cpu_count()),
        "platform": platform.platform(),
    }
    if mode is not None:
        info["mode"] = f"{mode.name} ({mode.reason})"
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


# ---------------------------------------------------------------- expected run times


@lru_cache(maxsize=1)
def calibrate_ms() -> float:
    """Best-of-15 wall time (ms) of one fixed float32 matmul, (384, 384) @ (384, 384), on one
    CPU thread. The ratio to the reference machine's figure scales recorded timings; the best
    run (not the median) is the least disturbed by other processes. Takes about 0.1 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(384, 384, generator=g)  # (384, 384)
        b = torch.randn(384, 384, generator=g)  # (384, 384)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(15):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best * 1000.0


@lru_cache(maxsize=1)
def recorded_timings() -> dict[str, Any]:
    """The shipped table of per-lesson and per-report-section seconds (``assets/timings.json``)."""
    return json.loads(TIMINGS_PATH.read_text())


def speed_factor() -> float:
    """How much slower this machine is than the reference one (>1: slower), from ``calibrate_ms``.

    Clamped to [0.1, 10]: a calibration further off than that says more about a busy machine
    than about the hardware."""
    ref = float(recorded_timings()["reference"]["matmul_ms"])
    # factor = this machine's matmul time / the reference machine's
    return min(10.0, max(0.1, calibrate_ms() / ref))


@dataclass(frozen=True)
class Estimate:
    """Expected seconds (None when nothing was recorded for this mode and device) and its basis."""

    seconds: float | None
    basis: str

    def text(self) -> str:
        if self.seconds is None:
            return f"unknown ({self.basis})"
        return f"about {format_seconds(self.seconds)} ({self.basis})"


def format_seconds(s: float) -> str:
    """``75`` -> ``"1 min 15 s"``; ``4000`` -> ``"1 h 7 min"``."""
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def timing_table(kind: str, mode: str, device: str) -> tuple[dict[str, float], str]:
    """Recorded seconds per lesson/section (``kind`` "lesson" or "report") and where they come from.

    CUDA uses the GPU table (unscaled); every other device the CPU table. Standard mode runs
    the fast sizes except its quality experiments: its table is the fast one, overridden by
    the recorded standard times."""
    table = recorded_timings()[kind]
    dev = 'cuda' if device == 'cuda' else 'cpu'
    key = f"{mode}/{dev}"
    out = {k: float(v) for k, v in table.get(key, {}).items()}
    if mode == "standard":
        out = {**{k: float(v) for k, v in table.get(f"fast/{dev}", {}).items()}, **out}
    return out, recorded_timings()["provenance"].get(f"{kind} {key}", key)


def expected_seconds(kind: str, keys: Iterable[str], mode: str, device: str) -> Estimate:
    """Expected wall time of some lessons or report sections on this machine.

    Recorded seconds (reference machine) times ``speed_factor()`` on a CPU; GPU timings are
    used as recorded. Unknown when any of ``keys`` has no recorded time for the mode/device."""
    table, source = timing_table(kind, mode, device)
    keys = list(keys)
    missing = [k for k in keys if k not in table]
    if missing:
        return Estimate(None, f"no recorded {mode}-mode time on {'a GPU' if device == 'cuda' else 'a CPU'} for {', '.join(missing)}")
    recorded = sum(table[k] for k in keys)
    if device == "cuda":
        return Estimate(recorded, f"recorded on a GPU: {format_seconds(recorded)}; {source}")
    f = speed_factor()
    # expected = recorded seconds on the reference machine x (this matmul time / reference matmul time)
    return Estimate(recorded * f, f"{format_seconds(recorded)} {source}, x{f:.2f} for this machine by a matmul calibration")


def lesson_header(lesson: str, mode: str | None = None) -> Mode:
    """A notebook's entry point: resolve the mode once (``mode``, else the environment: see
    :func:`resolve_mode`), print it, why, this lesson's expected time here and how to switch;
    set the math threads (:func:`compute_threads`); return the :class:`Mode` the notebook passes on.

    A notebook's first code cell calls it: ``MODE = cl.lesson_header("05")``."""
    key = f"{int(str(lesson).lower().lstrip('l')):02d}"
    torch.set_num_threads(compute_threads())
    info = resolve_mode(mode, flag_reason="the notebook")
    est = expected_seconds("lesson", [key], info.name, info.device)
    print(f"lesson {key} | {info.name} mode: {info.reason} | {torch.get_num_threads()} math thread(s) "
          "(codex_lab.runtime.compute_threads; CODEX_LAB_THREADS=N to change)")
    print(f"expected time of this notebook on this machine: {est.text()}")
    if est.seconds is None and info.name == "full" and info.device != "cuda":
        fast = expected_seconds("lesson", [key], "fast", info.device)
        print(f"full sizes are meant for a GPU: on this {info.device.upper()} expect many times the fast-mode "
              f"time ({fast.text()})")
    others = " or ".join(m for m in MODES if m != info.name)
    print(f"for {others} mode: set CODEX_LAB_MODE=<mode> before starting Jupyter, or pass it here: "
          f'cl.lesson_header("{key}", mode="<mode>"); then run the notebook again from the top')
    return info


def progress(iterable: Iterable[T] | None = None, *, desc: str = "", total: int | None = None,
             enabled: bool = True, unit: str = "it", leave: bool = False) -> Any:
    """A tqdm bar (rate and time left), widget-style in notebooks; a silent pass-through when
    ``enabled`` is False or ``CODEX_LAB_PROGRESS=0`` (logs, CI)."""
    from tqdm.auto import tqdm

    off = not enabled or os.environ.get("CODEX_LAB_PROGRESS", "").strip().lower() in _FALSE
    return tqdm(iterable, desc=desc, total=total, disable=off, unit=unit, leave=leave, dynamic_ncols=True)


__all__ = [
    "MODES", "TIMINGS_PATH", "Estimate", "Mode", "calibrate_ms", "compute_threads", "describe_environment",
    "expected_seconds", "format_seconds", "get_device", "interleaved_times", "lesson_header", "median_ms", "round_order",
    "progress", "recorded_timings", "resolve_mode", "seed_everything", "speed_factor", "timing_table",
    "use_compute_threads",
]
