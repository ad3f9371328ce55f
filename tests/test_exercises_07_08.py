"""Lessons 07 and 08 exercise checks against wrong answers.

One test per exercise: the reference solution passes, and each plausible wrong answer
fails with feedback that names its bug (the keyword asserted is part of that message).
A weakened check lets one of these through and fails here. The lesson 08 project's
scorecard is tested on made-up measurements (the pipeline itself runs in the notebooks).
"""

from __future__ import annotations

import math
from pathlib import Path

from codex_lab.course.checks import load_all
from codex_lab.course.exercises import load_definitions
from codex_lab.course.grading import ERROR, FAILED, PASSED, run_check
from codex_lab.lessons.l08_capstone import scorecard as sc

ROOT = Path(__file__).resolve().parents[1]


def _solution(lesson: str):
    return load_definitions(next((ROOT / "solutions").glob(f"{lesson}_*.py")))


def _grade(lesson: str, name: str, fn):
    return run_check(load_all()[(lesson, name)], fn)


def _assert_wrong(lesson: str, name: str, wrongs: dict[str, tuple], *, solution: bool = True) -> None:
    if solution:
        ok = _grade(lesson, name, getattr(_solution(lesson), name))
        assert ok.status == PASSED, ok.message
    for label, (fn, keyword) in wrongs.items():
        r = _grade(lesson, name, fn)
        assert r.status in (FAILED, ERROR), f"wrong answer {label!r} passed"
        assert keyword.lower() in r.message.lower(), f"{label}: feedback {r.message!r} does not name the bug ({keyword!r})"


# ====================================================================== lesson 07
def test_ttft_tbt_wrong_answers():
    def from_first_token(arrival, times):
        return (0.0, [b - a for a, b in zip(times, times[1:])]) if times else (None, [])

    def gaps_include_ttft(arrival, times):
        if not times:
            return None, []
        pts = [arrival] + list(times)
        return times[0] - arrival, [b - a for a, b in zip(pts, pts[1:])]

    def gaps_as_tuple(arrival, times):
        if not times:
            return None, []
        return times[0] - arrival, tuple(b - a for a, b in zip(times, times[1:]))

    def times_since_arrival(arrival, times):
        if not times:
            return None, []
        return times[0] - arrival, [t - arrival for t in times[1:]]

    def zero_when_empty(arrival, times):
        if not times:
            return 0.0, []
        return times[0] - arrival, [b - a for a, b in zip(times, times[1:])]

    def last_token(arrival, times):
        if not times:
            return None, []
        return times[-1] - arrival, [b - a for a, b in zip(times, times[1:])]

    _assert_wrong("07", "ttft_tbt", {
        "TTFT from the first token": (from_first_token, "arrival"),
        "first wait counted as a gap": (gaps_include_ttft, "the first gap is the TTFT"),
        "gaps as a tuple": (gaps_as_tuple, "list"),
        "times since arrival": (times_since_arrival, "consecutive"),
        "TTFT 0 with no tokens": (zero_when_empty, "unknown, not 0"),
        "last token": (last_token, "last token"),
    })


def test_slo_attainment_wrong_answers():
    def summed(buckets, target):
        b = sorted(buckets)
        return sum(c for le, c in b if le <= target) / b[-1][1]

    def by_position(buckets, target):
        d = dict(buckets)
        if target not in d:
            raise ValueError(target)
        return d[target] / buckets[-1][1]

    def interpolate(buckets, target):
        b = sorted(buckets)
        return (max((c for le, c in b if le <= target), default=0.0) / b[-1][1]) if b[-1][1] else math.nan

    def zero_when_empty(buckets, target):
        d = dict(buckets)
        if target not in d:
            raise ValueError(target)
        return d[target] / d[float("inf")] if d[float("inf")] else 0.0

    def largest_finite(buckets, target):
        d = dict(buckets)
        if target not in d:
            raise ValueError(target)
        total = max(c for le, c in d.items() if math.isfinite(le))
        return d[target] / total if total else math.nan

    def bucket_below(buckets, target):
        b = sorted(buckets)
        edges = [le for le, _ in b]
        if target not in edges:
            raise ValueError(target)
        i = edges.index(target)
        return (b[i - 1][1] if i else 0.0) / b[-1][1] if b[-1][1] else math.nan

    _assert_wrong("07", "slo_attainment", {
        "adds the cumulative buckets": (summed, "cumulative"),
        "total by position": (by_position, "by their edges"),
        "no ValueError between edges": (interpolate, "ValueError"),
        "0 when empty": (zero_when_empty, "nan"),
        "largest finite bucket as total": (largest_finite, "+Inf"),
        "bucket below the target": (bucket_below, "edge IS the target"),
    })


def test_passes_gates_wrong_answers():
    def average(c, b, t):
        gates = list(b)
        return sum(c.get(g, 0.0) for g in gates) / len(gates) >= sum(b.values()) / len(gates) - 1e-12

    def nan_slips_through(c, b, t):
        return not any(g not in c or c[g] < v - t.get(g, 0.0) for g, v in b.items())

    def missing_ignored(c, b, t):
        return all(c[g] >= v - t.get(g, 0.0) for g, v in b.items() if g in c)

    def strict(c, b, t):
        return all(g in c and c[g] > v - t.get(g, 0.0) for g, v in b.items())

    def no_tolerance(c, b, t):
        return all(g in c and c[g] >= v for g, v in b.items())

    def tolerance_everywhere(c, b, t):
        tol = max(t.values(), default=0.0)
        return all(g in c and c[g] >= v - tol for g, v in b.items())

    _assert_wrong("07", "passes_gates", {
        "average over gates": (average, "every gate"),
        "NaN passes": (nan_slips_through, "NaN"),
        "missing gate ignored": (missing_ignored, "no number"),
        "strict >": (strict, ">="),
        "tolerance ignored": (no_tolerance, "tolerance"),
        "one tolerance for all gates": (tolerance_everywhere, "tolerance.get(g, 0)"),
    })
