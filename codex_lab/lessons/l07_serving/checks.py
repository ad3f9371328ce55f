"""Lesson 07 exercises: TTFT/TBT from token timestamps, SLO attainment from a histogram,
and the release-gate decision rule. Each check compares with codex_lab and includes a case
that catches the usual mistake."""

from __future__ import annotations

import math
from typing import Any, Callable

from codex_lab.course.checks import exercise


@exercise("07", "ttft_tbt")
def check_ttft_tbt(fn: Callable[..., Any]) -> None:
    """fn(arrival, token_times) -> (ttft seconds or None, [gaps between tokens])."""
    out = fn(10.0, [10.08, 10.095, 10.125])
    assert isinstance(out, tuple) and len(out) == 2, "return a tuple (ttft, tbt_list)"
    ttft, tbt = out
    assert ttft is not None and math.isclose(ttft, 0.08, abs_tol=1e-9), (
        f"TTFT must be first token time - arrival = 0.08 s, got {ttft}: measure from the request's arrival, "
        "not from the first token")
    assert isinstance(tbt, list) and len(tbt) == 2, (
        f"3 tokens have 2 gaps between them, got {len(tbt) if isinstance(tbt, list) else tbt!r}: the first "
        "token's wait is TTFT, not a TBT")
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(tbt, [0.015, 0.03])), (
        f"TBT must be consecutive differences [0.015, 0.03], got {tbt}")
    one = fn(0.0, [0.5])
    assert math.isclose(one[0], 0.5) and one[1] == [], "one token: TTFT 0.5 and no gaps"
    none = fn(0.0, [])
    assert none[0] is None and none[1] == [], "no tokens: (None, [])"


@exercise("07", "slo_attainment")
def check_slo_attainment(fn: Callable[..., Any]) -> None:
    """fn(buckets [(le, cumulative count)], target) -> share of observations <= target."""
    from codex_lab.serve.metrics import histogram_attainment

    inf = float("inf")
    buckets = [(0.02, 3.0), (0.05, 7.0), (0.1, 9.0), (0.25, 10.0), (inf, 12.0)]
    for target in (0.02, 0.1, 0.25):
        want = histogram_attainment(buckets, target)
        got = fn(buckets, target)
        assert math.isclose(got, want), (
            f"target {target}: expected {want:.4f}, got {got}: Prometheus buckets are cumulative, so the share is "
            "bucket(le=target) / bucket(le=+Inf); do not add the buckets up")
    shuffled = [buckets[i] for i in (3, 0, 4, 2, 1)]
    assert math.isclose(fn(shuffled, 0.1), 0.75), "the buckets may come in any order: find the edge, and the +Inf total"
    try:
        fn(buckets, 0.03)
    except ValueError:
        pass
    else:
        raise AssertionError("0.03 is not a bucket edge: the share there is unknown, raise ValueError")
    empty = fn([(0.1, 0.0), (inf, 0.0)], 0.1)
    assert math.isnan(empty), "no observations: return float('nan'), not 0 or 1"


@exercise("07", "passes_gates")
def check_passes_gates(fn: Callable[..., Any]) -> None:
    """fn(candidate, baseline, tolerance) -> True iff candidate[g] >= baseline[g] - tolerance.get(g, 0) for all g."""
    from codex_lab.serve.gates import gate_decision

    base = {"syntax": 0.5, "functional": 0.25, "style": 0.9, "tbt_attainment": 0.8}
    tol = {"tbt_attainment": 0.1}
    cases = [
        dict(base),
        {**base, "syntax": 0.75},  # better on one gate
        {**base, "functional": 0.125},  # worse on one gate: fail even if better elsewhere
        {**base, "functional": 0.125, "syntax": 1.0, "style": 1.0},
        {**base, "tbt_attainment": 0.75},  # within tolerance
        {**base, "tbt_attainment": 0.6},  # beyond tolerance
        {k: v for k, v in base.items() if k != "style"},  # a gate not measured fails
    ]
    for cand in cases:
        want = gate_decision(cand, base, tolerance=tol)[0]
        got = fn(cand, base, tol)
        assert got is want or got == want, (
            f"candidate {cand} vs baseline {base} (tolerance {tol}): expected {want}, got {got}. The rule: no worse "
            "than the baseline on EVERY gate (an average can hide a regression), and a missing gate fails")
