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

An arm whose held-out value turns worse (over-fitting: a small task fine-tuned alone) has passed
its best: with ``snapshot``/``restore`` its seeds go back to the chunk end where the arm's mean
held-out value was best, and the arm is compared there (early stopping on validation, never on
test); :func:`plateau_state` calls that checkpoint trained and says so.

Each seed is driven through one function, ``advance(n) -> curve``, that trains ``n`` more steps
and returns the seed's whole held-out curve so far ((step, value) pairs), for example a
:class:`codex_lab.training.finetune.FinetuneSession` wrapped to return its mean validation
loss per evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from codex_lab.parallel import call_all
from codex_lab.stats import DEGRADING, TRAINED, UNDER_TRAINED_STATE
from codex_lab.training_state import TrainingState, training_state

Curve = list[tuple[float, float]]
Advance = Callable[[int], Curve]
EXTEND = 0.5  # the budget-extension check trains half the steps again


@dataclass
class PlateauRun:
    """One arm trained to its plateau.

    ``steps``: optimiser steps per seed at the stopping point (the verdict's); ``state``: the
    arm's training state there; ``reached``: the rule stopped the arm (trained, or degrading) before ``max_steps``;
    ``curves``: each seed's held-out curve up to the stopping point; ``extension_steps`` and
    ``extension_change``: the steps trained again and how far the arm's mean held-out value
    moved over them (signed: > 0 is better; nan when not run); ``confirmed``: more training did
    not improve the arm by ``min_change`` or more (it moved less, or it got worse: past its
    plateau, as an arm compared at its best checkpoint is). Only a gain means the arm was still
    learning: the check exists to catch a false plateau, never to call an improving arm trained.
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
    best_step: int | None = None  # early stopping: the checkpoint the arm is compared at (None: the last step)
    false_stops: list[int] = field(default_factory=list)  # ``confirm``: stopping points the extension overruled

    @property
    def confirmed(self) -> bool:
        """The budget-extension check passed: another ``EXTEND`` of the run did not improve the arm by min_change or more."""
        return math.isfinite(self.extension_change) and self.extension_change < self.min_change

    @property
    def judged(self) -> TrainingState:
        """The state the verdicts use: :attr:`state` (the rule's at the stopping point), overruled
        when the budget-extension check found the arm still learning (:func:`overruled_by_extension`)."""
        return overruled_by_extension(self.state, steps=self.steps, extension_steps=self.extension_steps,
                                      change=self.extension_change, min_change=self.min_change)

    def describe(self) -> str:
        """One line: the state at the stopping point and the extension check."""
        s = f"{self.arm}: {self.state.short()} at {self.steps} steps per seed" + ("" if self.reached else " (the cap)")
        if self.false_stops:
            s += f" (the extension found it still learning at step {', '.join(map(str, self.false_stops))})"
        if self.best_step is not None:
            s += f", compared at its best checkpoint, step {self.best_step} (it got worse after)"
        if self.extension_steps:
            s += f"; {self.extension_steps} more steps: {extension_words(self.extension_change, self.min_change)}"
        return s


def extension_words(change: float, min_change: float) -> str:
    """The budget-extension check in words, from ``change`` (> 0: the arm got better)."""
    if change >= min_change:
        return f"it improved by {change:.3g} (>= min_change {min_change:g}): still learning, not confirmed"
    if change <= -min_change:
        return f"it got worse by {-change:.3g}: past its plateau (confirmed: more training does not help)"
    return f"it moved by less than min_change {min_change:g} (confirmed)"


def plateau_line(arm: str, state: TrainingState, steps: int, *, reached: bool, extension_steps: int,
                 extension_change: float, min_change: float, higher_is_better: bool = False,
                 metric: str = "held-out loss", unit: str = " nats/token", note: str = "",
                 false_stops: Sequence[int] = ()) -> str:
    """One line for an arm trained to its plateau, its seeds in lockstep: its state at the
    stopping point, its steps (``note``, or "(the cap)" when not ``reached``), the stopping points
    the extension overruled (``false_stops``: ``train_to_plateau(confirm=True)``) and the
    budget-extension check (``extension_change`` > 0: better), the metric's own move printed."""
    overruled = (f" (the extension found it still learning at step {', '.join(map(str, false_stops))}, so it "
                 "trained on)") if false_stops else ""
    s = f"{arm}: {state.short()} at {steps} steps per seed" + overruled + (note or ("" if reached else " (the cap)"))
    if extension_steps:
        # the metric moved by +change where higher is better, by -change where lower is
        moved = extension_change if higher_is_better else -extension_change
        s += (f"; {extension_steps} more steps changed its {metric} by {moved:+.3g}{unit}: "
              f"{extension_words(extension_change, min_change)}")
    return s


def overruled_by_extension(state: TrainingState, *, steps: int, extension_steps: int, change: float,
                           min_change: float) -> TrainingState:
    """The budget-extension check overrules the rule: an arm called trained at ``steps`` whose
    ``extension_steps`` more steps improved it by ``change`` >= ``min_change`` (> 0: better) was
    still learning, so it is under-trained; any other state is returned as it is."""
    if state.trained and extension_steps and math.isfinite(change) and change >= min_change:
        return replace(state, state=UNDER_TRAINED_STATE, reason=(
            f"called trained at step {steps}, but {extension_steps} more steps improved its held-out value by "
            f"{change:.3g} (>= min_change {min_change:g}): still learning"))
    return state


def _mean_last(curves: Sequence[Curve]) -> float:
    return sum(c[-1][1] for c in curves) / len(curves)


def best_step(curves: Sequence[Curve], *, higher_is_better: bool, every: int) -> tuple[float, float]:
    """(step, mean value) of the best mean held-out value over the seeds, among the evaluations
    at multiples of ``every`` steps after step 0 (the chunk ends, where a run can be restored)."""
    steps = [s for s, _ in curves[0]]
    sign = 1.0 if higher_is_better else -1.0
    cands = [(i, s) for i, s in enumerate(steps) if s > 0 and round(s) % every == 0]
    if not cands:
        raise ValueError(f"no evaluation at a multiple of {every} steps")
    i, s = max(cands, key=lambda t: sign * sum(c[t[0]][1] for c in curves))
    return s, sum(c[i][1] for c in curves) / len(curves)


def plateau_state(curves: Sequence[Curve], *, higher_is_better: bool, min_change: float, arm: str, every: int,
                  margin: float | None = None, chance: float | None = None) -> TrainingState:
    """The training-state rule, with early stopping: an arm the rule calls "degrading" whose best
    chunk-end evaluation (:func:`best_step`) lies before its last is past its best, and is
    "trained" at that checkpoint (the reason says where and by how much it then got worse)."""
    st = training_state(curves, higher_is_better=higher_is_better, min_change=min_change, arm=arm, margin=margin,
                        chance=chance)
    if st.state != DEGRADING or not all(math.isfinite(v) for c in curves for _, v in c):
        return st
    step, value = best_step(curves, higher_is_better=higher_is_better, every=every)
    if step >= curves[0][-1][0]:
        return st
    return replace(st, state=TRAINED, final=value,
                   reason=f"past its best: the mean held-out value was {value:.4g} at step {step:g} and then worsened to "
                          f"{_mean_last(curves):.4g} by step {curves[0][-1][0]:g} (projected change {st.change:+.3g} per "
                          f"quarter); compared at its best checkpoint, step {step:g} (early stopping on validation)")


def train_to_plateau(advance: Sequence[Advance], *, arm: str, chunk: int, max_steps: int, higher_is_better: bool,
                     min_change: float, min_steps: int = 0, margin: float | None = None,
                     chance: float | None = None, extend: float = EXTEND,
                     before_extension: Callable[[], None] | None = None,
                     snapshot: Callable[[], Any] | None = None, restore: Callable[[Any], None] | None = None,
                     confirm: bool = False) -> PlateauRun:
    """Train every seed (one ``advance`` per seed) ``chunk`` steps at a time until the arm is
    trained, degrading, or at ``max_steps``; then, if ``extend`` > 0 and the arm was called
    trained, train ``ceil(extend x steps)`` more (in chunks) and record how far the arm's mean
    held-out value moved. The rule's arguments (``higher_is_better``, ``min_change``,
    ``margin``, ``chance``) are :func:`codex_lab.training_state.training_state`'s.
    ``before_extension``: called at the stopping point, before the extension trains on (score
    the models there: the verdict is read where the rule stopped). ``snapshot()`` (after each
    chunk) and ``restore(snap)``: with both, an arm that turns worse is restored to the chunk end
    of its best mean held-out value and judged there (:func:`plateau_state`).

    ``confirm``: the extension decides instead of only being reported. An arm the extension finds
    still learning (it improved by ``min_change`` or more) is not stopped there: training goes on
    from the extension's end, judged chunk by chunk again, until a stopping point the extension
    confirms or the cap (``false_stops`` lists the stopping points the extension overruled, and
    ``before_extension`` is called again at each new stopping point)."""
    if not advance:
        raise ValueError(f"arm {arm}: give one advance function per seed")
    if chunk < 1 or max_steps < chunk:
        raise ValueError(f"arm {arm}: chunk ({chunk}) must be >= 1 and max_steps ({max_steps}) >= chunk")
    steps = 0
    curves: list[Curve] = []
    sign = 1.0 if higher_is_better else -1.0
    best: tuple[float, int, Any] | None = None  # (mean value, step, snapshot) at the best chunk end so far
    early = snapshot is not None and restore is not None
    false_stops: list[int] = []
    while True:
        while True:
            curves = [list(c) for c in call_all(advance, chunk)]  # remote seeds side by side
            steps += chunk
            if early and (best is None or sign * _mean_last(curves) > sign * best[0]):
                best = (_mean_last(curves), steps, snapshot())  # type: ignore[misc]
            st = training_state(curves, higher_is_better=higher_is_better, min_change=min_change, arm=arm,
                                margin=margin, chance=chance)
            if steps >= min_steps and st.state in (TRAINED, DEGRADING):
                break
            if steps + chunk > max_steps:
                break
        if early and st.state == DEGRADING:
            st = plateau_state(curves, higher_is_better=higher_is_better, min_change=min_change, arm=arm, every=chunk,
                               margin=margin, chance=chance)
            if st.state == TRAINED and best is not None and best[1] < steps:
                restore(best[2])  # type: ignore[misc]
                run = PlateauRun(arm, steps, st, True, curves, min_change, best_step=best[1], false_stops=false_stops)
                if before_extension is not None:
                    before_extension()
                return run  # no extension: the rise itself showed that more training does not help
        # reached: the rule stopped it (trained or degrading), not the cap
        run = PlateauRun(arm, steps, st, st.state in (TRAINED, DEGRADING), curves, min_change, false_stops=false_stops)
        if before_extension is not None:
            before_extension()
        if not (extend > 0 and st.state == TRAINED):
            return run
        more = max(chunk, math.ceil(extend * steps / chunk) * chunk)
        done = 0
        ext: list[Curve] = curves
        while done < more:
            ext = [list(c) for c in call_all(advance, chunk)]
            done += chunk
        # change = sign x (mean over seeds of the last value after the extension - at the stopping point)
        run.extension_steps, run.extension_change = done, sign * (_mean_last(ext) - _mean_last(curves))
        run.extended_curves = ext
        if not (confirm and run.extension_change >= min_change and steps + done + chunk <= max_steps):
            return run
        # still learning: the extension's steps are part of the run, and judging goes on from their end
        false_stops.append(steps)
        steps += done
        if early and (best is None or sign * _mean_last(ext) > sign * best[0]):
            best = (_mean_last(ext), steps, snapshot())  # type: ignore[misc]


__all__ = ["EXTEND", "PlateauRun", "best_step", "extension_words", "overruled_by_extension", "plateau_line",
           "plateau_state", "train_to_plateau"]
