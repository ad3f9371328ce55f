"""Pre-registration: the seeds that tune an experiment's sizes never judge its verdicts.

A sizes object (a lesson's protocol sizes, its schedule and budget) that carries both ``seeds``
(the verdict's) and ``tuning_seeds`` (those the probes that chose the sizes ran on) mixes in
:class:`Preregistered`: building one whose two sets overlap is refused, and
:attr:`Preregistered.preregistration` says which seeds did what, for the report.
"""

from __future__ import annotations

from typing import Sequence


def check_disjoint(seeds: Sequence[int], tuning_seeds: Sequence[int]) -> None:
    """Refuse verdict ``seeds`` that include a tuning seed (ValueError naming them and the fix)."""
    both = sorted(set(seeds) & set(tuning_seeds))
    if both:
        raise ValueError(f"seeds {both} tuned the sizes and would judge the verdict too: choose verdict seeds "
                         f"outside the tuning seeds {tuple(tuning_seeds)}")


class Preregistered:
    """Mixed into a (frozen) dataclass with ``seeds`` and ``tuning_seeds`` fields: the check runs
    when the dataclass is built (``__post_init__``), and :attr:`preregistration` reports it."""

    seeds: tuple[int, ...]
    tuning_seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        check_disjoint(self.seeds, self.tuning_seeds)

    @property
    def preregistration(self) -> str:
        """Which seeds tuned the sizes and which judge the verdicts, for the report."""
        return (f"sizes and rates tuned on seeds {', '.join(map(str, self.tuning_seeds))}; verdicts judged on seeds "
                f"{', '.join(map(str, self.seeds))}")


__all__ = ["Preregistered", "check_disjoint"]
