"""One proportion with its uncertainty: ``k`` successes in ``n`` trials and the Wilson score
interval, good at small ``n`` and at rates near 0 or 1 (re-exported by :mod:`codex_lab.stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
