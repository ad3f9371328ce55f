"""Quality verdicts with their uncertainty: a difference between two arms, its 95% interval,
and the course's verdict rule written in code.

Every quality comparison in the course (sparse vs dense on long-range recall, GQA group sizes,
MoE vs dense, balanced vs single-task fine-tuning) runs several seeds per arm and reports

    diff = mean(b) - mean(a)          (b: the arm the claim favours, a: the baseline)

with a 95% interval from Welch's t (unequal variances; exact quantiles of Student's t, no
SciPy). The rule (COURSE.md, "Verdicts with their uncertainty"):

- ``"holds"`` when the interval excludes zero in the claimed direction;
- ``"fails"`` when it excludes zero in the other direction;
- otherwise ``"not resolved"``, stated with the interval: the effect is smaller than the
  interval's half-width at this scale.

``paired=True`` uses the per-seed differences (the same seed, data order and initial weights
in both arms), a one-sample t interval: tighter when seeds share most of their noise.

The distribution math (Student's t without SciPy) is :mod:`codex_lab.stats.student_t`; one
binomial proportion is :mod:`codex_lab.stats.proportion`, two timings compared round by round
:mod:`codex_lab.stats.speedup`; their names are re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace
from typing import Any, Sequence

from codex_lab.stats.proportion import Proportion, wilson_interval
from codex_lab.stats.speedup import TimingRatio, timing_ratio
from codex_lab.stats.student_t import _normal_cdf, t_cdf, t_quantile

HOLDS, FAILS, NOT_RESOLVED = "holds", "fails", "not resolved"
UNDER_TRAINED = "under-trained: no verdict"  # an arm has not reached a plateau (codex_lab.training_state)
DID_NOT_LEARN = "did not learn the task: no verdict"  # an arm (or a seed) stayed at chance, or far below the task's ceiling
FAILS_AS_STATED = "fails as stated"  # the article's stated figure or parameters are contradicted by the measurement
# the one verdict vocabulary of the course: every lesson's claims and the capstone's use these
VERDICTS: tuple[str, ...] = (HOLDS, FAILS, FAILS_AS_STATED, NOT_RESOLVED, UNDER_TRAINED, DID_NOT_LEARN)
NO_VERDICT: tuple[str, ...] = (UNDER_TRAINED, DID_NOT_LEARN)  # the training-state rule withheld the verdict
# the training-state rule's states (codex_lab.training_state judges them; the verdicts here read them)
TRAINED, UNDER_TRAINED_STATE, DEGRADING, NOT_LEARNED = "trained", "under-trained", "degrading", "did not learn"
MARGIN_SHARE = 0.5  # an arm may move by at most half the claim's margin (or interval half-width) over another quarter
MIN_SEEDS = 3  # the course's rule: a quality comparison runs at least 3 seeds per arm
VERDICT_RULE = ("holds: the 95% interval of the difference excludes zero in the claimed direction; "
                "fails: it excludes zero in the other direction; otherwise not resolved; "
                "under-trained: no verdict when an arm has not reached a plateau; did not learn the task: no verdict "
                "when an arm stayed at chance")
NONINFERIORITY_RULE = ("holds: the one-sided 95% bound of the quality cost is below the margin; fails: the whole "
                       "90% interval of the cost lies above the margin; otherwise not resolved; "
                       "under-trained: no verdict when an arm has not reached a plateau")


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    # unbiased sample variance: sum (x - m)^2 / (n - 1)
    v = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return m, v


@dataclass(frozen=True)
class Comparison:
    """The difference ``b - a`` between two arms, its 95% interval and the verdict.

    ``diff``, ``lo`` and ``hi`` are in the metric's own units (accuracy, nats, pass@1);
    ``verdict`` is one of ``holds``, ``fails``, ``not resolved``; ``n_a``/``n_b`` the seeds.
    """

    metric: str
    diff: float
    lo: float
    hi: float
    verdict: str
    n_a: int
    n_b: int
    higher_is_better: bool
    level: float = 0.95
    kind: str = "superiority"  # or "non-inferiority" (a "keeps quality" claim, with ``margin``)
    margin: float = math.nan  # non-inferiority margin, metric units (a cost below it counts as "kept")
    p_value: float = math.nan  # two-sided (superiority) or one-sided against the margin (non-inferiority)
    note: str = ""  # why the verdict is what it is, when the interval alone does not say
    measured_verdict: str = ""  # what the interval says, before the training-state rule / Holm
    states: tuple[Any, ...] = ()  # the arms' TrainingState, when judged with judge_trained
    role: str = "primary"  # "primary", "secondary (Holm over m)" or "exploratory"
    df: float = math.nan  # degrees of freedom of the t behind the interval (inf: normal)
    unit: str = "seeds"  # what n_a and n_b count ("problems" for a paired gate over one problem set)

    @property
    def half_width(self) -> float:
        """Half the interval's width: the smallest effect this many seeds can resolve, roughly."""
        return (self.hi - self.lo) / 2.0

    def describe(self, fmt: str = "+.3f") -> str:
        """One line: the difference, its interval, the seeds and the verdict, in words."""
        pct = f"{self.level:.0%}"
        s = f"{self.metric}: difference {self.diff:{fmt}} ({pct} CI [{self.lo:{fmt}}, {self.hi:{fmt}}], {self.unit} {self.n_a} vs {self.n_b}"
        if self.kind == "non-inferiority":
            s += f", non-inferiority margin {self.margin:.3g}"
        if self.role != "primary":
            s += f", {self.role}"
        s += f") -> {self.verdict}"
        if self.verdict == NOT_RESOLVED and not self.note:
            s += f" (the effect is smaller than {self.half_width:.3g} at this scale)"
        if self.note:
            s += f" ({self.note})"
        if self.states:
            s += "; arms: " + "; ".join(f"{st.arm} {st.short()}" for st in self.states)
        return s


def verdict_from_interval(lo: float, hi: float, *, claimed_positive: bool = True) -> str:
    """The course's verdict rule: ``holds`` / ``fails`` / ``not resolved`` from an interval.

    ``claimed_positive``: the claim says the difference is > 0 (else < 0).
    """
    if math.isnan(lo) or math.isnan(hi):
        raise ValueError(f"interval [{lo}, {hi}] has a NaN end; compute it from finite values")
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] is reversed")
    if lo > 0:
        return HOLDS if claimed_positive else FAILS
    if hi < 0:
        return FAILS if claimed_positive else HOLDS
    return NOT_RESOLVED


def compare(a: Sequence[float], b: Sequence[float], *, metric: str = "metric", higher_is_better: bool = True,
            paired: bool = False, level: float = 0.95, eval_se: tuple[float, float] | None = None) -> Comparison:
    """Compare arm ``b`` (the claimed-better one) against baseline ``a``, one value per seed.

    Args:
        a, b: per-seed values of the metric for the baseline and the claimed-better arm
            (at least :data:`MIN_SEEDS` = 3 each: the course's rule, enforced here).
        metric: the metric's name, for :meth:`Comparison.describe`.
        higher_is_better: True for accuracy / pass@1, False for a loss: the claim "b is better"
            is then ``mean(b) - mean(a) < 0``.
        paired: seeds are paired (same index, same seed); uses the per-seed differences.
        level: interval coverage (0.95).
        eval_se: the standard errors of each arm's *mean* due to the evaluation sample (e.g.
            sqrt(p (1 - p) / problems) for a pass rate on a fixed problem set), when every seed
            is scored on the same sample: added in quadrature to the seeds' standard error, so an
            evaluation set too small to tell the arms apart widens the interval.

    With no variance at all (every seed equal in both arms, or a constant paired difference,
    and no ``eval_se``) the interval would have zero width: the verdict is then
    "not resolved" with the note "no variance measured", never "holds".
    """
    a, b = _values(a, "a"), _values(b, "b")
    if len(a) < MIN_SEEDS or len(b) < MIN_SEEDS:
        raise ValueError(f"need at least {MIN_SEEDS} seeds per arm for a verdict (the course's rule), got "
                         f"{len(a)} and {len(b)}; run more seeds")
    if any(not math.isfinite(x) for x in a + b):
        raise ValueError("a per-seed value is NaN or infinite; a run diverged: fix it before comparing")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level is the interval's coverage, a fraction in (0, 1) such as 0.95; got {level}")
    ea, eb = _eval_se(eval_se)
    # The interval scales with the data: compute it on x / s (s = the largest |value|) and scale
    # back, so squares of 1e200 do not overflow nor squares of 1e-200 underflow to zero variance.
    s = max(abs(x) for x in a + b) or 1.0
    m, se, df = _scaled_se([x / s for x in a], [x / s for x in b], paired=paired, eval_se=(ea / s, eb / s))
    # on values of order 1, a standard error below 1e-12 is float rounding of identical values
    no_variance = se < 1e-12
    m, se = m * s, se * s
    if no_variance:
        return Comparison(metric, m, m, m, NOT_RESOLVED, len(a), len(b), higher_is_better, level,
                          note="no variance measured: every seed gave the same value; vary the seeds' "
                               "initialisation, data order and evaluation sample, or give eval_se",
                          measured_verdict=NOT_RESOLVED, p_value=math.nan)
    half = t_quantile((1.0 + level) / 2.0, df) * se
    lo, hi = m - half, m + half
    # two-sided p of "no difference": 2 P(T > |m| / se)
    p = 2.0 * (1.0 - (t_cdf(abs(m) / se, df) if math.isfinite(df) else _normal_cdf(abs(m) / se)))
    v = verdict_from_interval(lo, hi, claimed_positive=higher_is_better)
    return Comparison(metric, m, lo, hi, v, len(a), len(b), higher_is_better, level, p_value=p, measured_verdict=v,
                      df=df)


def noninferiority(a: Sequence[float], b: Sequence[float], *, margin: float, metric: str = "metric",
                   higher_is_better: bool = True, paired: bool = False, level: float = 0.95,
                   eval_se: tuple[float, float] | None = None) -> Comparison:
    """A "``b`` keeps ``a``'s quality" claim, tested for non-inferiority with a stated margin.

    The superiority rule of :func:`compare` can never confirm "keeps quality": a
    difference too small to resolve is "not resolved", however many seeds. Instead
    (Schuirmann's one-sided test, the non-inferiority half of TOST): with the cost
    ``c = mean(a) - mean(b)`` when higher is better (``mean(b) - mean(a)`` for a loss),

    - **holds** when the one-sided ``level`` upper bound of the cost is below ``margin``
      (b is worse by less than the margin: quality kept);
    - **fails** when the one-sided lower bound is above ``margin`` (b is worse by more than
      the margin);
    - else **not resolved**.

    The reported interval is the two-sided ``2 level - 1`` (90%) interval of ``b - a``,
    whose ends are those one-sided bounds. ``margin`` is in the metric's units (> 0) and
    must be declared before the run (e.g. 0.05 nats/token).
    """
    if not margin > 0 or not math.isfinite(margin):
        raise ValueError(f"margin is the largest quality cost that still counts as 'kept', a positive number in "
                         f"the metric's units (e.g. 0.05 nats/token); got {margin}")
    if not 0.5 < level < 1.0:
        raise ValueError(f"level is the one-sided bound's coverage, a fraction in (0.5, 1) such as 0.95; got {level}")
    base = compare(a, b, metric=metric, higher_is_better=higher_is_better, paired=paired, level=round(2 * level - 1, 12),
                   eval_se=eval_se)
    sign = 1.0 if higher_is_better else -1.0
    if base.note:  # no variance measured
        return replace(base, kind="non-inferiority", margin=margin)
    # cost = -(b - a) when higher is better, (b - a) for a loss
    cost_lo, cost_hi = sorted((-sign * base.lo, -sign * base.hi))
    # the two-sided (2 level - 1) interval's half-width is t_{level, df} x se
    se = base.half_width / t_quantile(level, base.df)
    cost = -sign * base.diff
    # one-sided p of H0 "cost >= margin": P(T < (cost - margin) / se)
    p = t_cdf((cost - margin) / se, base.df) if math.isfinite(base.df) else _normal_cdf((cost - margin) / se)
    v = HOLDS if cost_hi < margin else (FAILS if cost_lo > margin else NOT_RESOLVED)
    note = "" if v != NOT_RESOLVED else f"the cost's bounds [{cost_lo:+.3g}, {cost_hi:+.3g}] straddle the margin {margin:.3g}"
    return replace(base, verdict=v, measured_verdict=v, kind="non-inferiority", margin=margin, p_value=p, note=note)


def judge_trained(c: Comparison, states: Sequence[Any], *, same_metric: bool = True) -> Comparison:
    """Apply the training-state rule: when any arm has not reached a plateau, the verdict is
    :data:`UNDER_TRAINED` (:data:`DID_NOT_LEARN` when an arm stayed at chance or far below the
    task's ceiling); the interval is still reported, as a measurement of the budget.

    Besides each arm's own state, an arm counts as trained here only when its projected change
    over another quarter of the run (the state's one-sided 95% ``bound``) is at most half of
    what this comparison resolves: its non-inferiority margin, or its interval's half-width
    (``codex_lab.training_state.MARGIN_SHARE``). An arm moving by more than that could move
    the verdict.

    ``states``: the arms' :class:`codex_lab.training_state.TrainingState`. ``same_metric``: the
    states' curves measure the comparison's metric (False: e.g. a validation loss behind a
    pass@1 comparison; the bound and the interval are then in different units, and each arm is
    held to its own ``min_change`` only).
    """
    states = tuple(states)
    if not states:
        raise ValueError("judge_trained needs the arms' training states (codex_lab.training_state.training_state)")
    scale = c.margin if c.kind == "non-inferiority" and math.isfinite(c.margin) else c.half_width
    what = "margin" if c.kind == "non-inferiority" and math.isfinite(c.margin) else "interval half-width"
    # limit = MARGIN_SHARE x (the margin, or the interval's half-width)
    limit = MARGIN_SHARE * scale if same_metric and math.isfinite(scale) and scale > 0 else math.inf
    judged = []
    for s in states:
        bound = getattr(s, "bound", math.nan)
        if s.state == TRAINED and math.isfinite(bound) and bound > limit:
            s = replace(s, state=UNDER_TRAINED_STATE, tolerance=limit,
                        reason=f"projected change over another quarter {s.change:+.3g} (95% bound {bound:+.3g}) exceeds "
                               f"half this comparison's {what}, {limit:.3g}: more training could move the verdict")
        judged.append(s)
    states = tuple(judged)
    bad = [s for s in states if not s.trained]
    if not bad:
        return replace(c, states=states)
    verdict = DID_NOT_LEARN if any(s.state == NOT_LEARNED for s in bad) else UNDER_TRAINED
    # one short line: each arm's state (and its projected change) follows in describe()'s "arms:"; the
    # reasons in full stay on the states (``c.states[i].describe()``), which reports list once, not per verdict
    note = ("an arm did not learn the task on at least one seed: the interval measures that, not the mechanism"
            if verdict == DID_NOT_LEARN else "the interval measures the budget, not the mechanism")
    return replace(c, verdict=verdict, states=states, note=note)


def holm(comparisons: Sequence[Comparison], *, alpha: float = 0.05) -> list[Comparison]:
    """Holm's step-down correction of secondary comparisons for multiplicity.

    A claim names one pre-declared primary comparison (judged alone, uncorrected); its
    secondary comparisons are judged together here: sorted by p-value, the i-th smallest
    (from 1) keeps its verdict only if ``p_(j) (m - j + 1) < alpha`` for every j <= i; the
    rest become "not resolved" with the adjusted p in the note. Under-trained comparisons
    keep that verdict and take no part (their p measures the budget).
    """
    def p_of(c: Comparison) -> float:
        # the p-value of the hypothesis the verdict rejects: a non-inferiority "fails" rejects
        # "cost <= margin", whose one-sided p is 1 - p("cost >= margin")
        return 1.0 - c.p_value if c.kind == "non-inferiority" and c.verdict == FAILS else c.p_value

    idx = [i for i, c in enumerate(comparisons) if c.verdict not in NO_VERDICT and math.isfinite(c.p_value)]
    m = len(idx)
    role = f"secondary (Holm over {m})" if m else "secondary (none trained: no correction)"
    out = [replace(c, role=role) for c in comparisons]
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: p_of(comparisons[i]))):
        # adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j))
        running = max(running, min(1.0, (m - rank) * p_of(comparisons[i])))
        c = out[i]
        if running >= alpha and c.verdict in (HOLDS, FAILS):
            out[i] = replace(c, verdict=NOT_RESOLVED, note=f"Holm-adjusted p = {running:.3g} >= {alpha}")
        else:
            out[i] = replace(c, note=(c.note + "; " if c.note else "") + f"Holm-adjusted p = {running:.3g}")
    return out


def check_stated(measured: float, stated_lo: float, stated_hi: float) -> str:
    """Verdict on an article's stated figure: :data:`HOLDS` when the measurement lies in the
    stated range ``[stated_lo, stated_hi]``, else :data:`FAILS_AS_STATED` (the report then says
    what does hold). A cost figure is exact (bytes, exponents): no interval is needed."""
    if any(math.isnan(x) for x in (measured, stated_lo, stated_hi)):
        raise ValueError("check_stated needs finite figures")
    if stated_lo > stated_hi:
        raise ValueError(f"stated range [{stated_lo}, {stated_hi}] is reversed")
    return HOLDS if stated_lo <= measured <= stated_hi else FAILS_AS_STATED


def _eval_se(eval_se: tuple[float, float] | None) -> tuple[float, float]:
    if eval_se is None:
        return 0.0, 0.0
    try:
        ea, eb = (float(x) for x in eval_se)
    except (TypeError, ValueError):
        raise ValueError(f"eval_se is (se of arm a's mean, se of arm b's mean), got {eval_se!r}") from None
    if not (ea >= 0 and eb >= 0 and math.isfinite(ea) and math.isfinite(eb)):
        raise ValueError(f"eval_se must be finite and >= 0, got {eval_se!r}")
    return ea, eb


def _values(xs: Sequence[float], arm: str) -> list[float]:
    """Per-seed values as floats, or one ValueError naming the arm and the bad entry."""
    if isinstance(xs, (str, bytes)):
        raise ValueError(f"arm {arm} must be a sequence of numbers (one per seed), got the string {xs!r}")
    try:
        return [float(x) for x in xs]
    except (TypeError, ValueError) as e:
        raise ValueError(f"arm {arm} must hold one number per seed: {e}") from None


def _scaled_se(a: list[float], b: list[float], *, paired: bool,
               eval_se: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float, float]:
    """(difference b - a, its standard error, degrees of freedom) for values of order 1."""
    ea, eb = eval_se
    extra = ea * ea + eb * eb
    if paired:
        if len(a) != len(b):
            raise ValueError(f"paired comparison needs as many seeds per arm, got {len(a)} and {len(b)}")
        d = [y - x for x, y in zip(a, b)]
        m, v = _mean_var(d)
        # se = sd(d) / sqrt(n) (one-sample t on the per-seed differences), df = n - 1
        se2, df = v / len(d), float(len(d) - 1)
    else:
        ma, va = _mean_var(a)
        mb, vb = _mean_var(b)
        m = mb - ma
        # Welch: se^2 = va/na + vb/nb, df = se^4 / ((va/na)^2/(na-1) + (vb/nb)^2/(nb-1))
        sa, sb = va / len(a), vb / len(b)
        se2 = sa + sb
        denom = (sa * sa / (len(a) - 1) if sa else 0.0) + (sb * sb / (len(b) - 1) if sb else 0.0)
        df = (se2 * se2 / denom) if denom > 0 else float(len(a) + len(b) - 2)
    if se2 == 0.0 and extra > 0:
        df = math.inf  # only the evaluation sample's (binomial, normal) noise is left
    # the evaluation sample's noise adds in quadrature: se^2 = se_seeds^2 + se_eval_a^2 + se_eval_b^2
    return m, math.sqrt(se2 + extra), df


def _scaled_interval(a: list[float], b: list[float], *, paired: bool, level: float) -> tuple[float, float, float]:
    """(difference, lo, hi) of b - a for values of order 1, any n >= 2 (tests hold it to SciPy)."""
    m, se, df = _scaled_se(a, b, paired=paired)
    half = t_quantile((1.0 + level) / 2.0, df) * se if se > 0 else 0.0
    return m, m - half, m + half


__all__ = [
    "DID_NOT_LEARN", "FAILS", "FAILS_AS_STATED", "HOLDS", "MIN_SEEDS", "NO_VERDICT", "NONINFERIORITY_RULE", "NOT_RESOLVED", "UNDER_TRAINED", "VERDICTS",
    "VERDICT_RULE", "Comparison", "Proportion", "TimingRatio", "check_stated", "compare", "holm", "judge_trained",
    "noninferiority", "t_cdf", "t_quantile", "timing_ratio", "verdict_from_interval", "wilson_interval",
]
