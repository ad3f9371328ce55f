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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace
from typing import Any, Sequence

HOLDS, FAILS, NOT_RESOLVED = "holds", "fails", "not resolved"
UNDER_TRAINED = "under-trained: no verdict"  # an arm has not reached a plateau (codex_lab.training_state)
FAILS_AS_STATED = "fails as stated"  # the article's stated figure or parameters are contradicted by the measurement
# the one verdict vocabulary of the course: every lesson's claims and the capstone's use these
VERDICTS: tuple[str, ...] = (HOLDS, FAILS, FAILS_AS_STATED, NOT_RESOLVED, UNDER_TRAINED)
MIN_SEEDS = 3  # the course's rule: a quality comparison runs at least 3 seeds per arm
VERDICT_RULE = ("holds: the 95% interval of the difference excludes zero in the claimed direction; "
                "fails: it excludes zero in the other direction; otherwise not resolved; "
                "under-trained: no verdict when an arm has not reached a plateau")
NONINFERIORITY_RULE = ("holds: the one-sided 95% bound of the quality cost is below the margin; fails: the whole "
                       "90% interval of the cost lies above the margin; otherwise not resolved; "
                       "under-trained: no verdict when an arm has not reached a plateau")


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (Numerical Recipes 6.4)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > 1e-300 else 1e-300
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > 1e-300 else 1e-300
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    # ln of x^a (1-x)^b / (a B(a, b))
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1.0 - x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom (df may be fractional, as in Welch)."""
    # P(T <= t) = 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 for t >= 0
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t: the t with ``t_cdf(t, df) == p`` (relative error < 1e-10).

    Any ``df > 0`` including ``math.inf`` (the normal). Bisection on the upper tail
    ``(1 - p)`` so that p near 1 (levels like 0.9999 at df = 1, t ~ 6e3) keeps its precision,
    with the bracket widened until it holds the answer; for df > 1e5 the Cornish-Fisher
    expansion below (its next term is ~ z^7 / df^3 < 1e-13), where the beta function's
    continued fraction needs more than its 300 terms.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if p == 0.5:
        return 0.0
    # symmetry: t_p = -t_{1-p}; work with the smaller tail as given (1 - p loses its digits near 0)
    sign, tail = (1.0, 1.0 - p) if p > 0.5 else (-1.0, p)
    if df > 1e5:
        z = -_normal_quantile(tail)
        # Cornish-Fisher: t = z + (z^3 + z) / (4 df) + (5 z^5 + 16 z^3 + 3 z) / (96 df^2)
        return sign * (z + (z ** 3 + z) / (4.0 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96.0 * df * df))

    def upper(t: float) -> float:
        # P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2 for t >= 0
        return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1.0
    while upper(hi) > tail:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            raise ValueError(f"t quantile for p={p}, df={df} is beyond floating point range")
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if upper(mid) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return sign * 0.5 * (lo + hi)


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

    @property
    def half_width(self) -> float:
        """Half the interval's width: the smallest effect this many seeds can resolve, roughly."""
        return (self.hi - self.lo) / 2.0

    def describe(self, fmt: str = "+.3f") -> str:
        """One line: the difference, its interval, the seeds and the verdict, in words."""
        pct = f"{self.level:.0%}"
        s = f"{self.metric}: difference {self.diff:{fmt}} ({pct} CI [{self.lo:{fmt}}, {self.hi:{fmt}}], seeds {self.n_a} vs {self.n_b}"
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


def _normal_cdf(z: float) -> float:
    from statistics import NormalDist

    return NormalDist().cdf(z)


def judge_trained(c: Comparison, states: Sequence[Any]) -> Comparison:
    """Apply the training-state rule: when any arm has not reached a plateau, the verdict is
    :data:`UNDER_TRAINED` (the interval is still reported, as a measurement of the budget).

    ``states``: the arms' :class:`codex_lab.training_state.TrainingState`.
    """
    states = tuple(states)
    if not states:
        raise ValueError("judge_trained needs the arms' training states (codex_lab.training_state.training_state)")
    bad = [s for s in states if not s.trained]
    if not bad:
        return replace(c, states=states)
    why = "; ".join(s.describe() for s in bad)
    return replace(c, verdict=UNDER_TRAINED, states=states,
                   note=f"the interval measures the budget, not the mechanism: {why}")


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

    idx = [i for i, c in enumerate(comparisons) if c.verdict != UNDER_TRAINED and math.isfinite(c.p_value)]
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


# ---------------------------------------------------------------- one proportion, two timings


@dataclass(frozen=True)
class Proportion:
    """``k`` successes in ``n`` trials: the share and its Wilson score interval (``level``)."""

    k: int
    n: int
    lo: float
    hi: float
    level: float = 0.95

    @property
    def rate(self) -> float:
        """k / n."""
        return self.k / self.n

    def describe(self) -> str:
        """``"12/40 = 30% (95% CI 18%-45%)"``."""
        return f"{self.k}/{self.n} = {self.rate:.0%} ({self.level:.0%} CI {self.lo:.0%}-{self.hi:.0%})"


def wilson_interval(k: int, n: int, *, level: float = 0.95) -> Proportion:
    """Wilson score interval of a binomial proportion (Wilson 1927): good at small ``n`` and
    at rates near 0 or 1, where the normal (Wald) interval collapses to a point.

    ``k`` successes of ``n`` independent trials (0 <= k <= n, n >= 1).
    """
    import numbers

    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in (k, n)):
        raise ValueError(f"k and n are counts (integers), got k={k!r}, n={n!r}")
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level is the interval's coverage, a fraction in (0, 1) such as 0.95; got {level}")
    from statistics import NormalDist

    z = NormalDist().inv_cdf((1.0 + level) / 2.0)
    p = k / n
    # centre = (p + z^2 / 2n) / (1 + z^2 / n);  half = z sqrt(p(1-p)/n + z^2 / 4n^2) / (1 + z^2 / n)
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends: rounding leaves ~1e-17 otherwise
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Proportion(k, n, lo, hi, level)


@dataclass(frozen=True)
class TimingRatio:
    """How many times faster ``b`` ran than ``a`` over interleaved rounds.

    ``speedup``: the median over rounds of a_i / b_i (> 1: b is faster); ``lo``/``hi``: the
    smallest and largest per-round ratio (the spread); ``rounds``: how many rounds.
    """

    a: str
    b: str
    speedup: float
    lo: float
    hi: float
    rounds: int

    @property
    def within_spread(self) -> bool:
        """True when some rounds had b faster and some a faster: no difference measured."""
        return self.lo <= 1.0 <= self.hi

    def describe(self) -> str:
        """One line: the median ratio, the per-round range, and whether 1.0 lies inside it."""
        s = (f"{self.b} ran {self.speedup:.2f}x the speed of {self.a} "
             f"(per-round range {self.lo:.2f}-{self.hi:.2f}x over {self.rounds} interleaved rounds)")
        if self.within_spread:
            return s + ": inside the spread, no difference measured"
        return s + (f": {self.b} faster in every round" if self.lo > 1.0 else f": {self.b} slower in every round")


def timing_ratio(a_ms: Sequence[float], b_ms: Sequence[float], *, a: str = "a", b: str = "b") -> TimingRatio:
    """Compare two timings taken round by round (``codex_lab.runtime.interleaved_times``).

    Round i ran both, close in time, so a_i / b_i cancels the machine's slow and fast spells
    that a median of each would not. Needs the same number of rounds (>= 2) for both.
    """
    if len(a_ms) != len(b_ms) or len(a_ms) < 2:
        raise ValueError(f"need the same number (>= 2) of interleaved rounds, got {len(a_ms)} and {len(b_ms)}; "
                         "time both with interleaved_times(..., repeats >= 2)")
    if any(not (x > 0 and math.isfinite(x)) for x in list(a_ms) + list(b_ms)):
        raise ValueError("timings must be positive and finite (milliseconds)")
    r = sorted(x / y for x, y in zip(a_ms, b_ms))
    n = len(r)
    # median of the per-round ratios
    med = r[n // 2] if n % 2 else 0.5 * (r[n // 2 - 1] + r[n // 2])
    return TimingRatio(a, b, med, r[0], r[-1], n)
