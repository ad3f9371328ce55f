"""The mode (fast, standard or full): resolved once, where a run starts, then passed along.

Three modes:

- **fast** shrinks steps and sizes so every notebook and the report run in minutes on 2 CPU
  cores: continuous integration's mode. Quality experiments are too short to converge there,
  and the training-state rule (:mod:`codex_lab.training_state`) says so: "under-trained: no
  verdict".
- **standard** (the default on a CPU): the fast sizes, except the quality experiments, which
  are sized (smaller models, shorter sequences, more steps and seeds) for 2 CPU cores; the
  training-state rule says whether each arm reached its plateau, and one that did not gives no
  verdict.
- **full** is the course at the article's sizes, meant for a CUDA GPU (weeks on a 2-core CPU:
  ``scripts/estimate_full_cpu.py``).

:func:`resolve_mode` is called once, by an entry point: the command line (``codex-lab
--mode ...``), a notebook's first cell (``MODE = cl.lesson_header("05")``) or a script. It
returns a :class:`Mode`, which the entry point passes to whatever needs a size; no module
reads a global mode. Who chooses, strongest first:

1. the ``--mode fast|standard|full`` flag (the ``flag`` argument);
2. ``CODEX_LAB_MODE=fast|standard|full``;
3. ``CODEX_LAB_FAST=1`` (fast) or ``CODEX_LAB_FAST=0`` (full);
4. ``CI`` set to a non-empty, non-false value: fast;
5. the device: full on CUDA, standard on a CPU (and on Apple's MPS, which full sizes do not target).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

T = TypeVar("T")

MODES = ("fast", "standard", "full")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_MISSING: Any = object()


@dataclass(frozen=True)
class Mode:
    """The mode of one run (``name``: ``"fast"``, ``"standard"`` or ``"full"``), why it was
    chosen (``reason``, ``source``: ``"flag"``, ``"env"``, ``"ci"``, ``"device"`` or ``"given"``)
    and the device it was decided on. :meth:`pick` chooses a size."""

    name: str
    reason: str = "given by the caller"
    source: str = "given"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"mode {self.name!r} is not understood; use one of {', '.join(MODES)}.")

    @property
    def fast(self) -> bool:
        """Laptop sizes: True in fast and standard mode (standard differs in the quality experiments only)."""
        return self.name != "full"

    @property
    def converge(self) -> bool:
        """The quality experiments are sized to aim for a plateau (standard and full mode), not CI's smoke sizes."""
        return self.name != "fast"

    def pick(self, fast: T, full: T, *, standard: T = _MISSING) -> T:
        """The size for this mode: ``fast``, ``full``, or ``standard`` (default: ``fast``; name it
        where standard mode differs, as the quality experiments do to converge)."""
        if self.name == "full":
            return full
        if self.name == "standard" and standard is not _MISSING:
            return standard
        return fast

    def how_to_switch(self) -> str:
        """One sentence telling the user how to get the other modes."""
        others = [m for m in MODES if m != self.name]
        hint = "; ".join(f"for {m} mode use `--mode {m}` on the command line or set CODEX_LAB_MODE={m}" for m in others)
        if self.device != "cuda" and self.name != "full":
            hint += " (full mode runs the article's sizes, meant for a GPU: weeks on a 2-core CPU)"
        return hint + "."


def _env_mode(env: Mapping[str, str]) -> tuple[str, str] | None:
    mode = env.get("CODEX_LAB_MODE", "").strip().lower()
    if mode:
        if mode not in MODES:
            raise ValueError(f"CODEX_LAB_MODE={mode!r} is not understood; use one of {', '.join(MODES)}.")
        return mode, f"CODEX_LAB_MODE={mode} is set"
    flag = env.get("CODEX_LAB_FAST", "").strip().lower()
    if flag in _TRUE:
        return "fast", f"CODEX_LAB_FAST={env['CODEX_LAB_FAST'].strip()} is set"
    if flag in _FALSE:
        return "full", f"CODEX_LAB_FAST={env['CODEX_LAB_FAST'].strip()} is set"
    if flag:
        raise ValueError(f"CODEX_LAB_FAST={flag!r} is not understood; use 1 (fast) or 0 (full).")
    return None


def resolve_mode(flag: str | None = None, *, env: Mapping[str, str] | None = None, device: str | None = None,
                 flag_reason: str = "the --mode flag") -> Mode:
    """The mode of a run that starts here: ``flag`` > ``CODEX_LAB_MODE`` > ``CODEX_LAB_FAST`` >
    ``CI`` > the device (``env`` defaults to this process's environment; ``device`` to
    :func:`codex_lab.runtime.get_device`). Call it once, at the entry point, and pass the result."""
    if device is None:
        from codex_lab.runtime import get_device

        device = get_device().type
    env = os.environ if env is None else env
    if flag:
        flag = flag.strip().lower()
        if flag not in MODES:
            raise ValueError(f"mode {flag!r} is not understood; use one of {', '.join(MODES)}.")
        return Mode(flag, f"{flag_reason} asked for {flag} mode", "flag", device)
    got = _env_mode(env)
    if got is not None:
        return Mode(got[0], got[1], "env", device)
    ci = env.get("CI", "").strip().lower()
    if ci and ci not in _FALSE:
        return Mode("fast", f"CI={env['CI'].strip()} is set (continuous integration runs fast mode)", "ci", device)
    if device == "cuda":
        return Mode("full", "a CUDA GPU is available; full mode is the course at its real sizes", "device", device)
    return Mode("standard", f"the device is {device.upper()}, not a CUDA GPU: the laptop sizes, with the quality "
                            "experiments sized to converge (full mode, the article's sizes, is meant for a GPU)",
                "device", device)


__all__ = ["MODES", "Mode", "resolve_mode"]
