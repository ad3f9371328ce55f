"""Student's t distribution without SciPy, for the verdicts' intervals (:mod:`codex_lab.stats`).

The regularised incomplete beta function (the continued fraction of Numerical Recipes 6.4)
gives the t CDF for any real ``df > 0`` (fractional, as in Welch's interval); the quantile is
found by bisection on the upper tail, or by the Cornish-Fisher expansion past ``df = 1e5``.
The normal's CDF and quantile (``statistics.NormalDist``) cover the infinite-df case.
"""

from __future__ import annotations

import math


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


def _normal_cdf(z: float) -> float:
    from statistics import NormalDist

    return NormalDist().cdf(z)
