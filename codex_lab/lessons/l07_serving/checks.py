"""Lesson 07 exercises: TTFT/TBT from token timestamps, SLO attainment from a histogram,
and the release-gate decision rule.

Each check computes its expected values itself (the package functions that answer an
exercise, ``histogram_attainment`` and ``gate_decision``, are what the learner rewrites: they
are forbidden to the learner's code while the check runs), names the bug behind each wrong
answer it can recognise, and gives points per part (``case``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from codex_lab.course.check_tools import as_bool, as_float, as_int, pyrng
from codex_lab.course.checks import case, exercise


def _close(a: Any, b: float) -> bool:
    a = as_float(a)
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(a, b, abs_tol=1e-9)


@exercise("07", "ttft_tbt", points=3)
def check_ttft_tbt(fn: Callable[..., Any]) -> None:
    """fn(arrival, token_times) -> (ttft seconds or None, [gaps between tokens])."""
    out = fn(10.0, [10.08, 10.095, 10.125])
    assert isinstance(out, tuple) and len(out) == 2, (
        f"return a pair (ttft, gaps), got {type(out).__name__}{'' if not isinstance(out, (list, tuple)) else f' of length {len(out)}'}")
    ttft, tbt = out
    with case(1, "TTFT from the arrival"):
        _check_ttft(ttft)
    with case(1, "gaps between consecutive tokens"):
        _check_gaps(tbt)
    with case(1, "one token, no tokens"):
        one = fn(0.0, [0.5])
        assert _close(one[0], 0.5) and list(one[1]) == [], f"one token: TTFT 0.5 and no gaps, got {one!r}"
        none = fn(0.0, [])
        assert none[0] is None and list(none[1]) == [], (
            f"no tokens: return (None, []); there is no first token, so TTFT is unknown, not 0 (got {none!r})")
        r = pyrng("07.ttft_tbt")  # timestamps drawn for this run: answers hard-coded for the ones above fail
        for _ in range(3):
            arrival = round(r.uniform(0, 1000), 3)
            times = [arrival + r.uniform(0.01, 0.3)]
            for _ in range(r.randint(1, 6)):
                times.append(times[-1] + r.uniform(0.005, 0.05))
            got = fn(arrival, list(times))
            # ttft = t_0 - arrival; gaps_i = t_{i+1} - t_i
            want = (times[0] - arrival, [b - a for a, b in zip(times, times[1:])])
            ok = (isinstance(got, tuple) and len(got) == 2 and _close(got[0], want[0]) and isinstance(got[1], list)
                  and len(got[1]) == len(want[1]) and all(_close(a, b) for a, b in zip(got[1], want[1])))
            assert ok, (f"on timestamps drawn for this run ({len(times)} tokens): got {got!r}, expected {want!r}; the "
                        "answer must hold for any arrival and token times")


def _check_ttft(ttft: Any) -> None:
    assert not _close(ttft, 0.0), "TTFT is 0: measure from the request's arrival (token_times[0] - arrival), not from the first token"
    assert not _close(ttft, 0.125), "TTFT 0.125 is the LAST token's time - arrival (the end-to-end latency); use the first token"
    assert _close(ttft, 0.08), f"TTFT must be first token time - arrival = 0.08 s, got {ttft!r}"


def _check_gaps(tbt: Any) -> None:
    if isinstance(tbt, tuple):
        raise AssertionError("the gaps are right only if they come as a list: return list(...) (got a tuple)")
    assert isinstance(tbt, list), f"return the gaps as a list of floats, got {type(tbt).__name__}"
    if len(tbt) == 3 and _close(tbt[0], 0.08):
        raise AssertionError("the first gap is the TTFT (arrival -> first token): the gaps are between consecutive "
                             "tokens, so 3 tokens have 2")
    assert len(tbt) == 2, f"3 tokens have 2 gaps between consecutive tokens, got {len(tbt)}: {tbt}"
    if _close(tbt[0], 0.095) or _close(tbt[1], 0.125):
        raise AssertionError(f"got {tbt}: those are times since arrival; TBT is the difference between consecutive token times")
    if _close(tbt[0], -0.015):
        raise AssertionError(f"got {tbt}: negative gaps; subtract the earlier time from the later one")
    assert _close(tbt[0], 0.015) and _close(tbt[1], 0.03), f"TBT must be the consecutive differences [0.015, 0.03], got {tbt}"


@exercise("07", "slo_attainment", points=3, forbid=("codex_lab.serve.metrics.histogram_attainment",))
def check_slo_attainment(fn: Callable[..., Any]) -> None:
    """fn(buckets [(le, cumulative count)], target) -> share of observations <= target."""
    inf = float("inf")
    # cumulative counts: 3 observations <= 0.02, 7 <= 0.05, ..., 12 in total (+Inf)
    buckets = [(0.02, 3.0), (0.05, 7.0), (0.1, 9.0), (0.25, 10.0), (inf, 12.0)]
    with case(1, "cumulative buckets"):
        _check_shares(fn, buckets)
    with case(1, "buckets in any order"):
        shuffled = [buckets[i] for i in (3, 0, 4, 2, 1)]
        got = fn(shuffled, 0.1)
        assert _close(got, 0.75), (
            f"buckets in another order gave {got!r} instead of 0.75: find the target's bucket and the +Inf total by their "
            "edges, not by position (or sort first)")
    with case(1, "not an edge; no observations"):
        try:
            bad = fn(list(buckets), 0.03)
        except ValueError:
            pass
        else:
            raise AssertionError(f"0.03 is not a bucket edge, so the share there is unknown; raise ValueError (got {bad!r}: "
                                 "do not round to a neighbouring bucket or interpolate)")
        empty = fn([(0.1, 0.0), (inf, 0.0)], 0.1)
        assert isinstance(empty, float) and math.isnan(empty), (
            f"no observations: return float('nan'), got {empty!r}: 0 would read as 'every request missed', 1 as 'all met'")


def _check_shares(fn: Callable[..., Any], buckets: list[tuple[float, float]]) -> None:
    for target, want in ((0.1, 9 / 12), (0.02, 3 / 12), (0.25, 10 / 12)):  # 0.1 first: its wrong values are telling
        got = fn(list(buckets), target)
        if target == 0.1 and _close(got, (3 + 7 + 9) / 12) or _close(got, (3 + 7 + 9) / 41):
            raise AssertionError("you added the buckets up: Prometheus buckets are already cumulative, so the share is "
                                 "bucket(le=target) / bucket(le=+Inf)")
        if target == 0.1 and _close(got, 9 / 10):
            raise AssertionError("the total is the +Inf bucket (12), not the largest finite edge's count (10)")
        if target == 0.1 and _close(got, 7 / 12):
            raise AssertionError("0.1 s gives 7/12: that is the bucket below the target; use the bucket whose edge IS the target")
        assert _close(got, want), f"target {target}: expected bucket(le={target}) / bucket(le=+Inf) = {want:.4f}, got {got!r}"


@exercise("07", "passes_gates", points=3, forbid=("codex_lab.serve.gates.gate_decision",))
def check_passes_gates(fn: Callable[..., Any]) -> None:
    """fn(candidate, baseline, tolerance) -> True iff candidate[g] >= baseline[g] - tolerance.get(g, 0) for all g."""
    base = {"syntax": 0.5, "functional": 0.25, "style": 0.9, "tbt_attainment": 0.8}
    tol = {"tbt_attainment": 0.1}
    zero = {**base, "security": 0.0}  # a gate whose baseline is 0.0: a missing number must still fail
    B = (base, tol)
    cases = [  # (candidate, (baseline, tolerance), expected, the bug a wrong answer here shows)
        (dict(base), B, True, "a candidate equal to the baseline is no worse: use >=, not >"),
        ({**base, "syntax": 0.75}, B, True, "better on one gate and equal elsewhere passes"),
        ({**base, "functional": 0.125}, B, False, "worse on one gate fails"),
        ({**base, "functional": 0.125, "syntax": 1.0, "style": 1.0}, B, False,
         "a regression on one gate must not hide behind gains on others: check EVERY gate, do not average"),
        ({**base, "tbt_attainment": 0.75}, B, True, "tbt_attainment 0.75 is within its tolerance 0.1 of 0.8: subtract the "
                                                     "tolerance from the baseline"),
        ({**base, "tbt_attainment": 0.6}, B, False, "tbt_attainment 0.6 is beyond its tolerance (0.8 - 0.1 = 0.7)"),
        ({**base, "style": 0.85}, B, False, "style has no tolerance (tolerance.get(g, 0)): 0.85 < 0.9 fails"),
        ({**base, "tbt_attainment": 0.71}, B, True, "the tolerance is absolute: tbt_attainment 0.71 >= 0.8 - 0.1 = 0.7 "
                                                     "passes; baseline * (1 - tolerance) = 0.72 reads it as relative"),
    ]
    r = pyrng("07.passes_gates")  # scores drawn for this run: a table of the cases above fails
    for _ in range(4):
        b = {g: round(r.uniform(0.2, 0.9), 3) for g in ("syntax", "functional", "style")}
        t = {"style": round(r.uniform(0.0, 0.1), 3)}
        c = {g: round(v + r.uniform(-0.15, 0.1), 3) + 0.0005 for g, v in b.items()}  # never a tie with b - t
        # passes = all_g candidate[g] >= baseline[g] - tolerance.get(g, 0)
        cases.append((c, (b, t), all(c[g] >= b[g] - t.get(g, 0.0) for g in b), "scores drawn for this run"))
    edge = [
        ({k: v for k, v in base.items() if k != "style"}, B, False, "a gate the candidate has no number for fails"),
        ({k: v for k, v in base.items()}, (zero, tol), False, "a gate the candidate has no number for fails, even when "
         "the baseline scored 0.0 there: a missing gate is not a score of 0.0 (do not use candidate.get(g, 0.0))"),
        ({**base, "functional": float("nan")}, B, False,
         "a NaN score (a gate that did not run) fails: every comparison with NaN is False, so `cand < base - tol` "
         "lets it through; test that the candidate is >= the bar instead, or check math.isnan"),
        ({**base, "extra_gate": 0.0}, B, True, "only the baseline's gates count; an extra number on the candidate is ignored"),
    ]
    for points, label, group in ((2, "every gate, each with its tolerance", cases), (1, "missing, NaN and extra gates", edge)):
        with case(points, label):
            for cand, (bl, tl), want, why in group:
                got = as_bool(fn(dict(cand), dict(bl), dict(tl)))
                assert isinstance(got, bool), f"return True or False, got {got!r}"
                assert got == want, f"candidate {cand} vs baseline {bl} (tolerance {tl}): expected {want}, got {got}: {why}"


# ------------------------------------------------------------------ exercise 4 (derive it)
def _max_batch(a_ms: float, b_ms: float, tbt_ms: float, *, strict: bool = False, no_base: bool = False,
               ceil: bool = False, at_target: bool = False, per_ms: bool = False) -> tuple[int, float]:
    """The reference: the largest B with t(B) = a + b B <= T, and B x 1000 / t(B) tokens/s; each
    keyword switches on one plausible mistake."""
    a = 0.0 if no_base else a_ms
    # B = floor((T - a) / b), the largest batch whose step time a + b B is at most T (1e-9: slack
    # for the division; the grader's boundary cases are exact in binary, 20 = 4 + 2 x 8, and its
    # drawn cases stay 1e-3 of a row away from a boundary, so a loop over B agrees with the floor)
    x = (tbt_ms - a) / b_ms
    n = math.ceil(x - 1e-9) if ceil else math.floor(x + 1e-9)
    if strict and abs(x - round(x)) < 1e-9:
        n -= 1
    n = max(0, n)
    if n == 0:
        return 0, 0.0
    # tokens/s = B tokens per step / step time: B x 1000 / (a + b B) (the real a, whatever the mistake)
    step = tbt_ms if at_target else a_ms + b_ms * n
    return n, n * (1.0 if per_ms else 1000.0) / step


@exercise("07", "max_batch_under_tbt", points=3)
def check_max_batch_under_tbt(fn: Callable[..., Any]) -> None:
    """fn(a_ms, b_ms, tbt_ms) -> (largest batch meeting the TBT target, tokens/s at that batch)."""
    r = pyrng("07.max_batch_under_tbt")  # step costs drawn for this run: a table of answers fails
    drawn = []
    while len(drawn) < 6:
        a, b, t = round(r.uniform(2, 40), 3), round(r.uniform(0.2, 6), 3), round(r.uniform(10, 120), 3)
        x = (t - a) / b
        if abs(x - round(x)) > 1e-3:  # no drawn case sits on a boundary (those are the fixed cases below)
            drawn.append((a, b, t))
    groups = [
        (2, "the largest batch and its tokens/s", [(10.0, 2.0, 31.0), (4.0, 0.5, 20.25), *drawn]),
        (1, "a batch exactly at the target, and a target no batch meets",
         [(4.0, 2.0, 20.0), (0.5, 0.25, 2.0), (25.0, 3.0, 27.0), (30.0, 1.0, 20.0)]),
    ]
    mistakes = {
        "a stream whose time between tokens equals the target meets it (at most T, not under T)": dict(strict=True),
        "every step also pays the fixed part a (the weights read once per step): B = floor((T - a) / b)": dict(no_base=True),
        "round down: the batch one above the largest that fits has a step time over the target": dict(ceil=True),
        "tokens/s comes from the step time at that batch, a + b B, not from the target": dict(at_target=True),
        "the times are in milliseconds: tokens per second is B x 1000 / (a + b B)": dict(per_ms=True),
    }
    for points, label, cases in groups:
        with case(points, label):
            for a, b, t in cases:
                out = fn(a, b, t)
                assert isinstance(out, tuple) and len(out) == 2, (
                    f"return a pair (batch, tokens_per_s), got {type(out).__name__}")
                n, tps = as_int(out[0]), out[1]
                assert isinstance(n, int) and not isinstance(n, bool), f"the batch is a whole number (int), got {n!r}"
                want = _max_batch(a, b, t)
                tps_f = as_float(tps)
                tps_f = float(tps_f) if isinstance(tps_f, int) and not isinstance(tps_f, bool) else tps_f
                # 1e-6 relative: a float64 division; the reference and any closed form agree far closer
                if n == want[0] and isinstance(tps_f, float) and math.isclose(tps_f, want[1], rel_tol=1e-6, abs_tol=1e-9):
                    continue
                for msg, kw in mistakes.items():
                    bad = _max_batch(a, b, t, **kw)
                    if bad != want and n == bad[0] and isinstance(tps_f, float) and math.isclose(
                            tps_f, bad[1], rel_tol=1e-6, abs_tol=1e-9):
                        raise AssertionError(f"max_batch_under_tbt({a}, {b}, {t}): {msg}")
                raise AssertionError(f"max_batch_under_tbt(a={a}, b={b}, tbt={t}) returned {out!r}, expected "
                                     f"({want[0]}, {want[1]:.4f}): the largest B with a + b B <= T, and B x 1000 / "
                                     "(a + b B) tokens/s (0 and 0.0 when even one stream misses)")
