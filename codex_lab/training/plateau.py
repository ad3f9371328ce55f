"""Train an arm to its plateau: its seeds in lockstep, a chunk at a time, until the
training-state rule (:mod:`codex_lab.training_state`) calls it trained, then confirm by
training half as long again.

A quality verdict is given only on arms at a plateau. Rather than guess a budget and hope, a
run here keeps training every seed of an arm by ``chunk`` steps, re-judging the arm on all its
seeds' held-out curves after each chunk, and stops at the first chunk where the rule says
"trained" (or "degrading"), or at ``max_steps``. The verdict is read at that stopping point.

Then the **budget-extension check**: every seed trains ``extend`` (one half) of the steps it
took again, and the arm's mean held-out value must move by less than ``min_change``. It is
the rule's own test: an arm the rule called trained that still moves by more than what the
claim cares about would show the rule wrong, and the report prints it either way.

Each seed is driven through one function, ``advance(n) -> curve``, that trains ``n`` more steps
and returns the seed's whole held-out curve so far ((step, value) pairs), for example a
:class:`codex_lab.training.finetune.FinetuneSession` wrapped to return its mean validation
loss per evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from codex_lab.stats import DEGRADING, TRAINED
from codex_lab.training_state import TrainingState, training_state

Curve = list[tuple[float, float]]
Advance = Callable[[int], Curve]
EXTEND = 0.5  # the budget-extension check trains half the steps again


@dataclass
class PlateauRun:
    """One arm trained to its plateau.

    ``steps``: optimiser steps per seed at the stopping point (the verdict's); ``state``: the
    arm's training state there; ``reached``: the rule said trained before ``max_steps``;
    ``curves``: each seed's held-out curve up to the stopping point; ``extension_steps`` and
    ``extension_change``: the steps trained again and how far the arm's mean held-out value
    moved over them (signed: > 0 is better; nan when not run); ``confirmed``: that move was
    within ``min_change``.
    """

    arm: str
    steps: int
    state: TrainingState
    reached: bool
    curves: list[Curve]
    min_change: float
    extension_steps: int = 0
    extension_change: float = math.nan
    extended_curves: list[Curve] = field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        """The budget-extension check passed: another ``EXTEND`` of the run moved the arm by less than min_change."""
        return math.isfinite(self.extension_change) and abs(self.extension_change) < self.min_change

    def describe(self) -> str:
        """One line: the state at the stopping point and the extension check."""
        s = f"{self.arm}: {self.state.short()} at {self.steps} steps per seed" + ("" if self.reached else " (the cap)")
        if self.extension_steps:
            s += (f"; {self.extension_steps} more steps moved it {self.extension_change:+.3g} "
                  f"({'within' if self.confirmed else 'beyond'} min_change {self.min_change:g})")
        return s


def _mean_last(curves: Sequence[Curve]) -> float:
    return sum(c[-1][1] for c in curves) / len(curves)


def train_to_plateau(advance: Sequence[Advance], *, arm: str, chunk: int, max_steps: int, higher_is_better: bool,
                     min_change: float, min_steps: int = 0, margin: float | None = None,
                     chance: float | None = None, extend: float = EXTEND,
                     before_extension: Callable[[], None] | None = None) -> PlateauRun:
    """Train every seed (one ``advance`` per seed) ``chunk`` steps at a time until the arm is
    trained, degrading, or at ``max_steps``; then, if ``extend`` > 0 and the arm was called
    trained, train ``ceil(extend x steps)`` more (in chunks) and record how far the arm's mean
    held-out value moved. The rule's arguments (``higher_is_better``, ``min_change``,
    ``margin``, ``chance``) are :func:`codex_lab.training_state.training_state`'s.
    ``before_extension``: called at the stopping point, before the extension trains on (score
    the models there: the verdict is read where the rule stopped)."""
    if not advance:
        raise ValueError(f"arm {arm}: give one advance function per seed")
    if chunk < 1 or max_steps < chunk:
        raise ValueError(f"arm {arm}: chunk ({chunk}) must be >= 1 and max_steps ({max_steps}) >= chunk")
    steps = 0
    curves: list[Curve] = []
    while True:
        curves = [list(a(chunk)) for a in advance]
        steps += chunk
        st = training_state(curves, higher_is_better=higher_is_better, min_change=min_change, arm=arm, margin=margin,
                            chance=chance)
        if steps >= min_steps and st.state in (TRAINED, DEGRADING):
            break
        if steps + chunk > max_steps:
            break
    run = PlateauRun(arm, steps, st, st.state == TRAINED, curves, min_change)
    if before_extension is not None:
        before_extension()
    if extend > 0 and st.state == TRAINED:
        more = max(chunk, math.ceil(extend * steps / chunk) * chunk)
        done = 0
        ext: list[Curve] = curves
        while done < more:
            ext = [list(a(chunk)) for a in advance]
            done += chunk
        sign = 1.0 if higher_is_better else -1.0
        # change = sign x (mean over seeds of the last value after the extension - at the stopping point)
        run.extension_steps, run.extension_change = done, sign * (_mean_last(ext) - _mean_last(curves))
        run.extended_curves = ext
    return run


__all__ = ["EXTEND", "PlateauRun", "train_to_plateau"]
