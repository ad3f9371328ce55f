"""The training-state rule: has an arm of a quality comparison reached a plateau?

A quality verdict compares arms at the end of their training. If an arm is still improving,
the comparison measures the step budget, not the mechanism (8 uptraining steps of a GQA model
say nothing about what GQA costs). So every quality comparison of the course first asks, per
arm, whether its held-out metric has stopped moving by as much as the comparison can resolve;
when any arm has not, the verdict is ``"under-trained: no verdict"``
(:data:`codex_lab.stats.UNDER_TRAINED`), an honest outcome.

The rule (:func:`training_state`), on the held-out evaluation curves of one arm, one curve
per seed, evaluated at the same steps:

1. **per seed**, fit a least-squares line to the seed's last evaluations (the last quarter,
   and never fewer than ``MIN_TAIL`` = 5 of them) and project it over another quarter of the
   run: ``c_i = slope_i x (last step - first step) / 4``, signed so that > 0 means *better*;
   in words: how much more seed i would move if its run went on 25% longer at the rate it
   ends with;
2. a **one-sided 95% upper bound** on the seeds' mean projected change,
   ``bound = mean(c) + t_0.95 x se``, where ``se`` is the larger of two standard errors, each
   with the t of its own degrees of freedom: across seeds, ``sd(c) / sqrt(seeds)``
   (df = seeds - 1), and within seeds, from the lines' residuals, ``(run / 4) x
   sqrt(mean residual variance / sum (x - mean x)^2 / seeds)`` (df = seeds x (tail - 2));
   the first catches seeds that disagree, the second evaluation noise when the seeds happen
   to agree;
3. the **threshold** is what the comparison can resolve: the smaller of ``min_change`` (the
   smallest change the claim cares about) and ``MARGIN_SHARE`` (one half) of the claim's
   margin or of the comparison's interval half-width, when given;
4. **degrading** when the mean projected change is worse than ``-threshold`` and the bound
   is below zero, so that even its optimistic end says the arm gets worse (the held-out metric
   rising: compare an earlier checkpoint; a flat tail whose noise dips is not degrading, it is
   judged on its bound like any other); else **trained** when
   ``bound <= threshold`` and no seed's own ``c_i`` exceeds it: even at the pessimistic end
   of what the seeds show, another quarter of training would move the arm, and each of its
   seeds, by less than the comparison can tell apart; otherwise **under-trained**;
5. **did not learn** when any seed's tail mean is within ``threshold`` of ``chance`` (a seed
   stuck at chance blocks the verdict even if the mean curve moved); when a seed's tail mean
   is below ``LEARN_SHARE`` (one half) of the way from chance to the best seed's of the same
   arm and the seed itself has stopped improving (its projected change at most the threshold;
   one still climbing is late, not failed, and the trend decides) (the same design learned the
   task on another seed, so this seed's plateau is a failed
   optimisation: lesson 02's window + stride reference had two seeds at 0.97 and 0.95 and one
   flat at 0.26 for 6,000 steps, chance 0.125); or when the arm ends below ``LEARN_SHARE`` of
   the way from chance to a ``ceiling`` the same task reaches elsewhere (a plateau of a failed
   optimisation, not of the design);
6. **not trained at a decayed rate**: given the learning rate at each evaluation (``rates``),
   an arm whose fitted tail ran at less than ``ANNEALED_SHARE`` (one half) of its peak rate is
   not called trained, however flat: a curve stops moving when its rate falls, not only when
   the model has learned what it can. Lesson 04's reference showed it: both arms the rule
   called trained over a tail held at 1/30 of the peak rate gained 0.06-0.08 nats/token when
   the same schedule was stretched to 1.5x the steps (its budget-extension check). Hold the
   rate over the judged tail at half the peak or more (the fixed-budget lessons' schedules decay
   to exactly that share and hold it: :func:`held_floor`), or confirm the plateau by that check.

Why a bound on the trend and not the seeds' level spread: the level spread is mostly each
seed's own evaluation sample, which cancels in a paired comparison; it says nothing about
whether the curves still move. Three seeds falling 0.08 per quarter with levels 0.15 apart
are still falling (``tests/test_training_state.py`` shows that case and a flat one). A curve
with fewer than ``MIN_TAIL + 1`` evaluations cannot show a plateau: evaluate more often.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from codex_lab.stats import DEGRADING, MARGIN_SHARE, NOT_LEARNED, TRAINED, UNDER_TRAINED_STATE
from codex_lab.stats.student_t import t_quantile

MIN_TAIL = 5  # evaluations the trend is fitted on, at least
MIN_POINTS = MIN_TAIL + 1  # evaluations per curve: the tail and one before it
TAIL = 0.25  # the last quarter of the evaluations (more when the quarter holds fewer than MIN_TAIL)
LEARN_SHARE = 0.5  # an arm must end at least half-way from chance to the ceiling the task shows elsewhere
LEVEL = 0.95  # the one-sided bound's level
ANNEALED_SHARE = 0.5  # a tail run below half the peak learning rate cannot show a plateau
# A schedule may hold its tail at exactly ANNEALED_SHARE of the peak (the lessons' schedules do):
# the tail's mean rate is a float sum, which can land a few ulps below the share; 1e-9 relative
# is far above that rounding and far below any schedule that actually decays past the share.
_RATE_ROUNDING = 1e-9

Curve = Sequence[tuple[float, float]]  # (step, metric value), one per evaluation


@dataclass(frozen=True)
class TrainingState:
    """Where one arm's training stands (see the module's rule).

    ``change``: the seeds' mean projected change of the metric over another quarter of the run,
    metric units, > 0 = better; ``bound``: its one-sided 95% upper bound; ``tolerance``: the
    threshold the bound is held to (min_change, or half the claim's margin if smaller);
    ``per_seed``: each seed's projected change; ``spread``: standard deviation across seeds
    of ``per_seed`` (0 for one seed); ``final``: the mean curve's last value; ``steps``: the
    last evaluated step.
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
    bound: float = math.nan
    per_seed: tuple[float, ...] = ()
    rate_share: float = math.nan  # the fitted tail's mean learning rate over the peak (nan: rates not given)

    @property
    def trained(self) -> bool:
        """True when the arm reached a plateau (only then is it compared on quality)."""
        return self.state == TRAINED

    def describe(self, fmt: str = ".3g") -> str:
        """``"dense: trained (projected change +0.002, bound +0.006 <= 0.01; 3 seeds, 12 evals to step 600)"``."""
        if self.reason:
            return f"{self.arm}: {self.state} ({self.reason})"
        return (f"{self.arm}: {self.state} (projected change over another quarter {self.change:+{fmt}}, "
                f"95% bound {self.bound:+{fmt}} against {self.tolerance:{fmt}}; {self.n_seeds} seed(s), "
                f"{self.n_points} evaluations to step {self.steps:g})")

    def short(self) -> str:
        """The state alone with its projected change, for tables: ``"trained (+0.002)"``."""
        if self.reason:
            return self.state
        return f"{self.state} ({self.change:+.3g})"


def held_floor(peak_lr: float) -> float:
    """The lowest rate a fixed-budget schedule may decay to and hold over the tail it is judged
    on, for a peak of ``peak_lr``: ``ANNEALED_SHARE x peak_lr`` (rule 6's share). Lessons 02, 03
    and 04 decay their cosine to this floor, so a flat tail there is flat at a rate that can
    still move the model, and the rule can call the arm trained."""
    if not peak_lr > 0:
        raise ValueError(f"peak_lr must be > 0 (the schedule's peak learning rate); got {peak_lr}")
    # floor = ANNEALED_SHARE x peak
    return ANNEALED_SHARE * peak_lr


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


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(slope, residual variance, sum (x - mean x)^2) of the least-squares line through the points."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    # least squares: b = sum (x - mx)(y - my) / sum (x - mx)^2
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    # residual variance s^2 = sum (y - my - b (x - mx))^2 / (n - 2)
    s2 = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (len(xs) - 2) if len(xs) > 2 else 0.0
    return b, s2, sxx


def threshold_for(min_change: float, margin: float | None = None) -> float:
    """The change an arm must stay under: ``min(min_change, MARGIN_SHARE x margin)``."""
    if margin is None or not math.isfinite(margin) or margin <= 0:
        return min_change
    return min(min_change, MARGIN_SHARE * margin)


def training_state(curves: Sequence[Curve] | Sequence[Sequence[float]], *, higher_is_better: bool,
                   min_change: float, arm: str = "arm", tail: float = TAIL, chance: float | None = None,
                   margin: float | None = None, ceiling: float | None = None,
                   rates: Sequence[float] | None = None) -> TrainingState:
    """Judge one arm's training state from its held-out curves (one per seed).

    Args:
        curves: per seed, the evaluations as ``(step, value)`` pairs (or bare values at steps
            0, 1, 2, ...); all seeds evaluated at the same steps; at least ``MIN_POINTS``.
        higher_is_better: True for accuracy / pass@1, False for a loss.
        min_change: the smallest change the claim cares about, in the metric's units (> 0).
        arm: the arm's name, for messages.
        tail: the share of the evaluations the trend is fitted on (at least ``MIN_TAIL`` of them).
        chance: the metric's value for a model that learned nothing (1/8 accuracy with 8
            candidates; ln V nats for a uniform guess over V tokens). Any seed whose tail mean
            is within the threshold of it makes the arm "did not learn".
        margin: the claim's margin or the comparison's interval half-width, metric units: the
            threshold is at most ``MARGIN_SHARE`` of it.
        ceiling: the value the same task reaches elsewhere (a stronger arm, a longer run);
            needs ``chance``. An arm ending less than ``LEARN_SHARE`` of the way from chance
            to it "did not learn the task".
        rates: the learning rate of the update before each evaluation, one per evaluation step
            (:func:`codex_lab.training.loop.rates_at`); with them, a tail run below
            ``ANNEALED_SHARE`` of the peak rate is not called trained (rule 6).
    """
    if not min_change > 0 or not math.isfinite(min_change):
        raise ValueError(f"min_change is the smallest change that matters, a positive number in the metric's "
                         f"units (e.g. 0.01 nats/token); got {min_change}")
    if not 0 < tail <= 1:
        raise ValueError(f"tail is a share of the evaluations in (0, 1], got {tail}")
    if ceiling is not None and chance is None:
        raise ValueError(f"arm {arm}: a ceiling is judged against chance; pass chance= too")
    cs = _as_curves(curves)
    if not cs:
        raise ValueError(f"arm {arm}: no curves given; pass one evaluation curve per seed")
    steps = [s for s, _ in cs[0]]
    if any([s for s, _ in c] != steps for c in cs):
        raise ValueError(f"arm {arm}: every seed's curve must be evaluated at the same steps")
    n, m = len(steps), len(cs)
    thr = threshold_for(min_change, margin)
    if n < MIN_POINTS:
        return TrainingState(arm, UNDER_TRAINED_STATE, math.nan, thr, math.nan,
                             cs[0][-1][1] if n else math.nan, m, n, steps[-1] if n else 0.0,
                             reason=f"{n} evaluation(s): a plateau needs at least {MIN_POINTS} "
                                    f"({MIN_TAIL} in the fitted tail); evaluate more often")
    if any(not math.isfinite(v) for c in cs for _, v in c):
        return TrainingState(arm, DEGRADING, math.nan, thr, math.nan, math.nan, m, n, steps[-1],
                             reason="a held-out value is NaN or infinite: the run diverged")
    k = min(n - 1, max(MIN_TAIL, math.ceil(n * tail)))
    rate_share = math.nan
    if rates is not None:
        if len(rates) != n:
            raise ValueError(f"arm {arm}: {len(rates)} learning rates for {n} evaluations; give the rate at each "
                             "evaluation step (codex_lab.training.loop.rates_at)")
        peak = max(rates)
        # rate share = mean rate over the fitted tail / the peak rate
        rate_share = (sum(rates[-k:]) / k) / peak if peak > 0 else math.nan
    sign = 1.0 if higher_is_better else -1.0
    quarter = TAIL * (steps[-1] - steps[0])
    xs = steps[-k:]
    per_seed, resid = [], []
    for c in cs:
        b, s2, sxx = _line(xs, [v for _, v in c[-k:]])
        # c_i = slope_i x (a quarter of the run's steps), signed so that > 0 is an improvement
        per_seed.append(sign * b * quarter)
        resid.append(s2)
    mean_c = sum(per_seed) / m
    # within seeds: se_w = quarter x sqrt(mean s_i^2 / sxx / m), df = m (k - 2)
    se_w = quarter * math.sqrt(sum(resid) / m / sxx / m) if sxx > 0 else 0.0
    margin_w = t_quantile(LEVEL, m * (k - 2)) * se_w
    if m > 1:
        # across seeds: se_b = sd(c) / sqrt(m), df = m - 1
        spread = math.sqrt(sum((x - mean_c) ** 2 for x in per_seed) / (m - 1))
        margin_b = t_quantile(LEVEL, m - 1) * spread / math.sqrt(m)
    else:
        spread, margin_b = 0.0, 0.0
    # bound = mean(c) + max(t_w se_w, t_b se_b): the one-sided 95% upper bound of the mean projected change
    bound = mean_c + max(margin_w, margin_b)
    mean = [sum(c[i][1] for c in cs) / m for i in range(n)]
    final = mean[-1]
    common = dict(tolerance=thr, spread=spread, final=final, n_seeds=m, n_points=n, steps=steps[-1],
                  bound=bound, per_seed=tuple(per_seed), rate_share=rate_share)
    if chance is not None:
        tails = [sum(v for _, v in c[-k:]) / k for c in cs]
        stuck = [i for i, t in enumerate(tails) if sign * (t - chance) <= thr]
        if stuck:
            return TrainingState(arm, NOT_LEARNED, mean_c, **common,
                                 reason=f"seed(s) {', '.join(str(i) for i in stuck)} of {m} end within {thr:.3g} of "
                                        f"chance {chance:.3g} (tail means {', '.join(f'{tails[i]:.3g}' for i in stuck)}): "
                                        "nothing learned there")
        best = max(tails, key=lambda t: sign * t)
        if m > 1:
            # a seed's learned share = (its tail mean - chance) / (the best seed's tail mean - chance); a seed
            # behind that is still improving by more than the threshold is late, not failed: the trend rule judges it
            behind = [i for i, t in enumerate(tails)
                      if (t - chance) / (best - chance) < LEARN_SHARE and per_seed[i] <= thr]
            if behind:
                return TrainingState(arm, NOT_LEARNED, mean_c, **common,
                                     reason=f"seed(s) {', '.join(str(i) for i in behind)} of {m} end at "
                                            f"{', '.join(f'{tails[i]:.3g}' for i in behind)}, less than "
                                            f"{LEARN_SHARE:.0%} of the way from chance {chance:.3g} to {best:.3g}, which "
                                            "another seed of the same arm reaches: that optimisation failed, so the "
                                            "arm's mean is not the design's plateau")
        if ceiling is not None and sign * (ceiling - chance) > 0:
            # learned share = (final - chance) / (ceiling - chance)
            share = (final - chance) / (ceiling - chance)
            if share < LEARN_SHARE:
                return TrainingState(arm, NOT_LEARNED, mean_c, **common,
                                     reason=f"ends at {final:.3g}, {share:.0%} of the way from chance {chance:.3g} to "
                                            f"{ceiling:.3g}, which the same task reaches elsewhere: the optimisation "
                                            "failed, not the design")
    # degrading only when credibly worse: its projected change beyond -threshold and even the bound's
    # optimistic end below 0; a flat, noisy tail that dips is judged trained or under-trained on its bound
    if mean_c < -thr and bound < 0:
        state = DEGRADING
    elif bound <= thr and max(per_seed) <= thr:
        if rate_share < ANNEALED_SHARE * (1.0 - _RATE_ROUNDING):  # (nan compares False: no rates, no rule 6)
            return TrainingState(arm, UNDER_TRAINED_STATE, mean_c, **common,
                                 reason=f"flat (projected change over another quarter {mean_c:+.3g}, 95% bound "
                                        f"{bound:+.3g} against {thr:.3g}), but its fitted tail ran at "
                                        f"{rate_share:.0%} of its peak learning rate: a curve flattens when the rate "
                                        f"falls, so this is not a plateau; hold the rate at {ANNEALED_SHARE:.0%} of "
                                        "the peak or more over the tail, or confirm it with the budget-extension check")
        state = TRAINED
    else:
        state = UNDER_TRAINED_STATE
    return TrainingState(arm, state, mean_c, **common)


def all_trained(states: Sequence[TrainingState] | Mapping[str, TrainingState]) -> bool:
    """True when every arm reached a plateau."""
    vals = list(states.values()) if isinstance(states, Mapping) else list(states)
    return bool(vals) and all(s.trained for s in vals)


def states_text(states: Sequence[TrainingState] | Mapping[str, TrainingState]) -> str:
    """The arms' states for a claims table: ``"dense: trained (+0.002); moe: under-trained (+0.08)"``."""
    vals = list(states.values()) if isinstance(states, Mapping) else list(states)
    return "; ".join(f"{s.arm}: {s.short()}" for s in vals)
