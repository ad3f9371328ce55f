"""The training-state rule: has an arm of a quality comparison reached a plateau?

A quality verdict compares arms at the end of their training. If an arm is still improving,
the comparison measures the step budget, not the mechanism (8 uptraining steps of a GQA model
say nothing about what GQA costs). So every quality comparison of the course first asks, per
arm, whether its held-out metric has stopped moving; when any arm has not, the verdict is
``"under-trained: no verdict"`` (:data:`codex_lab.stats.UNDER_TRAINED`), an honest outcome.

The rule (:func:`training_state`), on the held-out evaluation curves of one arm, one curve
per seed, evaluated at the same steps:

1. average the seeds' curves (the mean curve: seed noise shrinks by sqrt(seeds));
2. fit a least-squares line to the last quarter of the mean curve's evaluations (at least
   3 of them) and project its slope over a quarter of the run:
   ``change = slope x (last step - first step) / 4``, signed so that > 0 means *better*;
   in words: how much more the metric would move if the run went on 25% longer at the
   rate it ends with;
3. the tolerance is the larger of the standard error of the arm's mean,
   ``spread / sqrt(seeds)`` (spread: the standard deviation across seeds of each seed's mean
   over that last quarter), and ``min_change``, the smallest change the claim cares about,
   in the metric's units (e.g. 0.01 nats/token);
4. **trained** when ``|change| <= tolerance``; **under-trained** when ``change > tolerance``
   (still improving by more than the seeds differ: another quarter of training would move
   the arm by more than the comparison can resolve); **degrading** when
   ``change < -tolerance`` (getting worse: over-fitting or an unstable run; compare an
   earlier checkpoint or fix the run), which also gives no verdict.

Why this rule: the comparison's interval is built from the standard error of each arm's
mean (its half-width is ~2 to 4 x spread / sqrt(seeds)); an arm whose trend over the next
quarter of training exceeds that standard error would move its own mean by more than the
mean is known, so the verdict would belong to the budget. (The raw spread would be too lax:
with noisy seeds or a per-seed evaluation sample, a curve still falling by several times its
mean's uncertainty would pass.) ``min_change`` keeps a
deterministic arm (zero spread) from being called under-trained for a drift nobody cares
about. A curve with fewer than 4 evaluations cannot show a plateau: under-trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

TRAINED, UNDER_TRAINED_STATE, DEGRADING = "trained", "under-trained", "degrading"
MIN_POINTS = 4  # evaluations per curve; the tail fit needs >= 3 of them and one before it
TAIL = 0.25  # the last quarter of the evaluations

Curve = Sequence[tuple[float, float]]  # (step, metric value), one per evaluation


@dataclass(frozen=True)
class TrainingState:
    """Where one arm's training stands (see the module's rule).

    ``change``: the projected change of the metric over another quarter of the run, metric
    units, > 0 = better; ``tolerance``: max(spread / sqrt(seeds), min_change); ``spread``: standard
    deviation across seeds of the tail means (0 for one seed); ``final``: the mean curve's
    last value; ``steps``: the last evaluated step.
    """

    arm: str
    state: str
    change: float
    tolerance: float
    spread: float
    final: float
    n_seeds: int
    n_points: int
    steps: float
    reason: str = ""

    @property
    def trained(self) -> bool:
        """True when the arm reached a plateau (only then is it compared on quality)."""
        return self.state == TRAINED

    def describe(self, fmt: str = ".3g") -> str:
        """``"dense: trained (change over another quarter +0.002, tolerance 0.01; 3 seeds, 12 evals to step 600)"``."""
        if self.reason:
            return f"{self.arm}: {self.state} ({self.reason})"
        return (f"{self.arm}: {self.state} (change over another quarter of the run {self.change:+{fmt}}, "
                f"tolerance {self.tolerance:{fmt}}; {self.n_seeds} seed(s), {self.n_points} evaluations to step {self.steps:g})")

    def short(self) -> str:
        """The state alone with its projected change, for tables: ``"trained (+0.002)"``."""
        if self.reason:
            return self.state
        return f"{self.state} ({self.change:+.3g})"


def _as_curves(curves: Sequence[Curve] | Sequence[Sequence[float]]) -> list[list[tuple[float, float]]]:
    out = []
    for i, c in enumerate(curves):
        pts = []
        for j, p in enumerate(c):
            if isinstance(p, (tuple, list)):
                if len(p) != 2:
                    raise ValueError(f"curve {i}, point {j}: give (step, value) pairs, got {p!r}")
                s, v = float(p[0]), float(p[1])
            else:
                s, v = float(j), float(p)  # a bare list of values: evaluations at steps 0, 1, 2, ...
            pts.append((s, v))
        out.append(sorted(pts))
    return out


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    # least squares: b = sum (x - mx)(y - my) / sum (x - mx)^2
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0


def training_state(curves: Sequence[Curve] | Sequence[Sequence[float]], *, higher_is_better: bool,
                   min_change: float, arm: str = "arm", tail: float = TAIL, chance: float | None = None) -> TrainingState:
    """Judge one arm's training state from its held-out curves (one per seed).

    Args:
        curves: per seed, the evaluations as ``(step, value)`` pairs (or bare values at steps
            0, 1, 2, ...); all seeds evaluated at the same steps.
        higher_is_better: True for accuracy / pass@1, False for a loss.
        min_change: the smallest change the claim cares about, in the metric's units (> 0).
        arm: the arm's name, for messages.
        tail: the share of the evaluations the trend is fitted on (0.25: the last quarter).
        chance: the metric's value for a model that learned nothing (e.g. 1/8 accuracy with
            8 candidates; ln V nats for a uniform guess over V tokens). A curve flat at chance
            is not a plateau of learning: when the mean curve ends within two tolerances of
            ``chance``, the arm is under-trained ("flat at chance").
    """
    if not min_change > 0 or not math.isfinite(min_change):
        raise ValueError(f"min_change is the smallest change that matters, a positive number in the metric's "
                         f"units (e.g. 0.01 nats/token); got {min_change}")
    if not 0 < tail <= 1:
        raise ValueError(f"tail is a share of the evaluations in (0, 1], got {tail}")
    cs = _as_curves(curves)
    if not cs:
        raise ValueError(f"arm {arm}: no curves given; pass one evaluation curve per seed")
    steps = [s for s, _ in cs[0]]
    if any([s for s, _ in c] != steps for c in cs):
        raise ValueError(f"arm {arm}: every seed's curve must be evaluated at the same steps")
    n = len(steps)
    if n < MIN_POINTS:
        return TrainingState(arm, UNDER_TRAINED_STATE, math.nan, math.nan, math.nan,
                             cs[0][-1][1] if n else math.nan, len(cs), n, steps[-1] if n else 0.0,
                             reason=f"{n} evaluation(s): a plateau needs at least {MIN_POINTS}; evaluate more often")
    if any(not math.isfinite(v) for c in cs for _, v in c):
        return TrainingState(arm, DEGRADING, math.nan, math.nan, math.nan, math.nan, len(cs), n, steps[-1],
                             reason="a held-out value is NaN or infinite: the run diverged")
    k = min(n - 1, max(3, math.ceil(n * tail)))
    mean = [sum(c[i][1] for c in cs) / len(cs) for i in range(n)]
    rate = _slope(steps[-k:], mean[-k:])
    sign = 1.0 if higher_is_better else -1.0
    # change = slope x (a quarter of the run's steps), signed so that > 0 is an improvement
    change = sign * rate * TAIL * (steps[-1] - steps[0])
    tails = [sum(v for _, v in c[-k:]) / k for c in cs]
    if len(cs) > 1:
        mt = sum(tails) / len(tails)
        # spread = sample standard deviation across seeds of each seed's tail mean
        spread = math.sqrt(sum((t - mt) ** 2 for t in tails) / (len(tails) - 1))
    else:
        spread = 0.0
    # tolerance = max(standard error of the arm's mean, min_change) = max(spread / sqrt(seeds), min_change)
    tol = max(spread / math.sqrt(len(cs)), min_change)
    state = TRAINED if abs(change) <= tol else (UNDER_TRAINED_STATE if change > 0 else DEGRADING)
    sign_gain = sign * (mean[-1] - chance) if chance is not None else math.inf
    # learned = better than chance by more than two tolerances (the seeds' spread or min_change)
    if state == TRAINED and sign_gain <= 2 * tol:
        return TrainingState(arm, UNDER_TRAINED_STATE, change, tol, spread, mean[-1], len(cs), n, steps[-1],
                             reason=f"flat at chance: ends at {mean[-1]:.3g} against chance {chance:.3g} "
                                    f"(within 2 x tolerance {tol:.3g}); nothing learned yet")
    return TrainingState(arm, state, change, tol, spread, mean[-1], len(cs), n, steps[-1])


def all_trained(states: Sequence[TrainingState] | Mapping[str, TrainingState]) -> bool:
    """True when every arm reached a plateau."""
    vals = list(states.values()) if isinstance(states, Mapping) else list(states)
    return bool(vals) and all(s.trained for s in vals)


def states_text(states: Sequence[TrainingState] | Mapping[str, TrainingState]) -> str:
    """The arms' states for a claims table: ``"dense: trained (+0.002); moe: under-trained (+0.08)"``."""
    vals = list(states.values()) if isinstance(states, Mapping) else list(states)
    return "; ".join(f"{s.arm}: {s.short()}" for s in vals)
