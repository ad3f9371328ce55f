"""Two timings compared round by round: the median per-round speed ratio and its spread
(:class:`TimingRatio`, re-exported by :mod:`codex_lab.stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


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
