"""Runtime knobs shared by every lesson: device choice, seeding, the mode and its expected time.

Three modes:

- **fast** shrinks steps and sizes so every notebook and the report run in minutes on 2 CPU
  cores: continuous integration's mode. Quality experiments are too short to converge there,
  and the training-state rule (:mod:`codex_lab.training_state`) says so: "under-trained: no
  verdict".
- **standard** (the default on a CPU): the fast sizes, except the quality experiments, which
  are sized (smaller models, shorter sequences, more steps and seeds) to reach a plateau on
  2 CPU cores within the report's 25 minutes, so their verdicts stand.
- **full** is the course at the article's sizes, meant for a CUDA GPU (weeks on a 2-core CPU: `scripts/estimate_full_cpu.py`).

Who chooses, strongest first:

1. a ``--mode fast|standard|full`` flag of the CLI (``set_mode``), which also sets
   ``CODEX_LAB_MODE`` for child processes;
2. ``CODEX_LAB_MODE=fast|standard|full``;
3. ``CODEX_LAB_FAST=1`` (fast) or ``CODEX_LAB_FAST=0`` (full);
4. ``CI`` set to a non-empty, non-false value: fast;
5. the device: full on CUDA, standard on a CPU (and on Apple's MPS, which full sizes do not target).

``pick(fast=..., full=..., standard=...)`` chooses a size; ``standard`` defaults to the fast
value, so only what standard mode changes is named there. ``fast_mode()`` (and a notebook's
``FAST``) is True in fast *and* standard mode: it means "laptop sizes".

``mode_info()`` says which mode and why; ``lesson_header("05")`` prints that and the lesson's
expected time on this machine (recorded timings scaled by a quick matmul calibration).

Timing a function (``median_ms``, ``interleaved_times``) is :mod:`codex_lab.runtime.timing`;
the math-thread policy (``compute_threads``) is :mod:`codex_lab.runtime.threads`; both are
re-exported here.
"""

from __future__ import annotations

import json
import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeVar

import numpy as np
import torch

from codex_lab.runtime.threads import compute_threads, use_compute_threads
from codex_lab.runtime.timing import interleaved_times, median_ms

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
MODES = ("fast", "standard", "full")
TIMINGS_PATH = Path(__file__).parents[1] / "assets" / "timings.json"  # codex_lab/assets
_override: tuple[str, str] | None = None  # (mode, reason) set by set_mode / the CLI flag
_saved_env: dict[str, str | None] = {}  # CODEX_LAB_MODE as it was before set_mode changed it
_MISSING: Any = object()


@dataclass(frozen=True)
class ModeInfo:
    """The mode in force (``"fast"``, ``"standard"`` or ``"full"``), why, and the device it was decided on."""

    mode: str
    reason: str
    source: str  # "flag", "env", "ci" or "device"
    device: str

    @property
    def fast(self) -> bool:
        """Laptop sizes: True in fast and standard mode (standard differs in the quality experiments only)."""
        return self.mode != "full"

    @property
    def converge(self) -> bool:
        """The quality experiments are sized to reach a plateau (standard and full mode)."""
        return self.mode != "fast"

    def how_to_switch(self) -> str:
        """One sentence telling the user how to get the other modes."""
        others = [m for m in MODES if m != self.mode]
        hint = "; ".join(f"for {m} mode use `--mode {m}` on the command line or set CODEX_LAB_MODE={m}" for m in others)
        if self.device != "cuda" and self.mode != "full":
            hint += " (full mode runs the article's sizes, meant for a GPU: weeks on a 2-core CPU)"
        return hint + "."


def _env_mode() -> tuple[str, str] | None:
    mode = os.environ.get("CODEX_LAB_MODE", "").strip().lower()
    if mode:
        if mode not in MODES:
            raise ValueError(f"CODEX_LAB_MODE={mode!r} is not understood; use one of {', '.join(MODES)}.")
        return mode, f"CODEX_LAB_MODE={mode} is set"
    fast = _env_fast()
    return (fast, f"CODEX_LAB_FAST={os.environ['CODEX_LAB_FAST'].strip()} is set") if fast else None


def _env_fast() -> str | None:
    flag = os.environ.get("CODEX_LAB_FAST", "").strip().lower()
    if flag in _TRUE:
        return "fast"
    if flag in _FALSE:
        return "full"
    if flag:
        raise ValueError(f"CODEX_LAB_FAST={flag!r} is not understood; use 1 (fast) or 0 (full).")
    return None


def mode_info() -> ModeInfo:
    """Which mode is in force and why (flag > CODEX_LAB_MODE > CODEX_LAB_FAST > CI > device)."""
    dev = get_device().type
    if _override is not None:
        return ModeInfo(_override[0], _override[1], "flag", dev)
    env = _env_mode()
    if env is not None:
        return ModeInfo(env[0], env[1], "env", dev)
    ci = os.environ.get("CI", "").strip().lower()
    if ci and ci not in _FALSE:
        return ModeInfo("fast", f"CI={os.environ['CI'].strip()} is set (continuous integration runs fast mode)", "ci", dev)
    if dev == "cuda":
        return ModeInfo("full", "a CUDA GPU is available; full mode is the course at its real sizes", "device", dev)
    return ModeInfo("standard", f"the device is {dev.upper()}, not a CUDA GPU: the laptop sizes, with the quality "
                                "experiments sized to converge (full mode, the article's sizes, is meant for a GPU)",
                    "device", dev)


def fast_mode() -> bool:
    """Return True at laptop sizes: fast or standard mode (see ``mode_info`` for who decides)."""
    return mode_info().fast


def set_mode(mode: str | None, reason: str = "the --mode flag") -> None:
    """Force ``"fast"``, ``"standard"`` or ``"full"`` for this process and its children (via
    ``CODEX_LAB_MODE``, which child processes read before ``CODEX_LAB_FAST``).

    ``None`` removes the forced choice (``CODEX_LAB_MODE`` then keeps the value it had before).
    """
    global _override
    if mode is None:
        if _override is not None:
            prev = _saved_env.pop("CODEX_LAB_MODE", None)
            if prev is None:
                os.environ.pop("CODEX_LAB_MODE", None)
            else:
                os.environ["CODEX_LAB_MODE"] = prev
        _override = None
        return
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not understood; use one of {MODES}.")
    if _override is None:
        _saved_env["CODEX_LAB_MODE"] = os.environ.get("CODEX_LAB_MODE")
    _override = (mode, f"{reason} asked for {mode} mode")
    os.environ["CODEX_LAB_MODE"] = mode


@contextmanager
def mode_override(mode: str, reason: str) -> Iterator[None]:
    """Run a block in ``mode`` and restore the previous choice afterwards (report plans use it)."""
    global _override
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not understood; use one of {MODES}.")
    saved, saved_env = _override, os.environ.get("CODEX_LAB_MODE")
    _override = (mode, reason)
    os.environ["CODEX_LAB_MODE"] = mode
    try:
        yield
    finally:
        _override = saved
        if saved_env is None:
            os.environ.pop("CODEX_LAB_MODE", None)
        else:
            os.environ["CODEX_LAB_MODE"] = saved_env


def pick(fast: T, full: T, *, standard: T = _MISSING) -> T:
    """The size for the mode in force: ``fast``, ``full``, or ``standard`` (default: ``fast``;
    name it where standard mode differs, as the quality experiments do to converge)."""
    mode = mode_info().mode
    if mode == "full":
        return full
    if mode == "standard" and standard is not _MISSING:
        return standard
    return fast


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
        "mode": f"{mode_info().mode} ({mode_info().reason})",
        "platform": platform.platform(),
    }
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


def expected_seconds(kind: str, keys: Iterable[str], mode: str | None = None, device: str | None = None) -> Estimate:
    """Expected wall time of some lessons or report sections on this machine.

    Recorded seconds (reference machine) times ``speed_factor()`` on a CPU; GPU timings are
    used as recorded. Unknown when any of ``keys`` has no recorded time for the mode/device."""
    info = mode_info() if mode is None or device is None else None
    mode = mode or info.mode  # type: ignore[union-attr]
    device = device or info.device  # type: ignore[union-attr]
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


def lesson_header(lesson: str) -> bool:
    """Print the mode, why, this lesson's expected time here and how to switch; set the math
    threads (:func:`compute_threads`); return fast mode.

    A notebook's first code cell calls it: ``FAST = cl.lesson_header("05")``."""
    key = f"{int(str(lesson).lower().lstrip('l')):02d}"
    torch.set_num_threads(compute_threads())
    info = mode_info()
    est = expected_seconds("lesson", [key], info.mode, info.device)
    print(f"lesson {key} | {info.mode} mode: {info.reason} | {torch.get_num_threads()} math thread(s) "
          "(codex_lab.runtime.compute_threads; CODEX_LAB_THREADS=N to change)")
    print(f"expected time of this notebook on this machine: {est.text()}")
    if est.seconds is None and info.mode == "full" and info.device != "cuda":
        fast = expected_seconds("lesson", [key], "fast", info.device)
        print(f"full sizes are meant for a GPU: on this {info.device.upper()} expect many times the fast-mode "
              f"time ({fast.text()})")
    others = " or ".join(m for m in MODES if m != info.mode)
    print(f"for {others} mode: set CODEX_LAB_MODE=<mode> before starting Jupyter "
          f"(or run `%env CODEX_LAB_MODE=<mode>` in a cell, then run the notebook again from the top)")
    return info.fast


def progress(iterable: Iterable[T] | None = None, *, desc: str = "", total: int | None = None,
             enabled: bool = True, unit: str = "it", leave: bool = False) -> Any:
    """A tqdm bar (rate and time left), widget-style in notebooks; a silent pass-through when
    ``enabled`` is False or ``CODEX_LAB_PROGRESS=0`` (logs, CI)."""
    from tqdm.auto import tqdm

    off = not enabled or os.environ.get("CODEX_LAB_PROGRESS", "").strip().lower() in _FALSE
    return tqdm(iterable, desc=desc, total=total, disable=off, unit=unit, leave=leave, dynamic_ncols=True)


__all__ = [
    "MODES", "TIMINGS_PATH", "Estimate", "ModeInfo", "calibrate_ms", "compute_threads", "describe_environment",
    "expected_seconds", "fast_mode", "format_seconds", "get_device", "interleaved_times", "lesson_header", "median_ms",
    "mode_info", "mode_override", "pick", "progress", "recorded_timings", "seed_everything", "set_mode", "speed_factor",
    "timing_table", "use_compute_threads",
]
