"""The verdict rule and its 95% interval (codex_lab.stats)."""

from __future__ import annotations

import math

import pytest

from codex_lab.stats import FAILS, HOLDS, NOT_RESOLVED, compare, t_cdf, t_quantile, verdict_from_interval


@pytest.mark.parametrize("df,q975", [(1, 12.7062047), (2, 4.30265273), (4, 2.77644511), (10, 2.22813885),
                                     (30, 2.04227246)])
def test_t_quantiles_match_the_printed_tables(df, q975):
    # table values to 8 significant digits; bisection stops at 1e-10, the beta function is
    # accurate to ~1e-12 here, so 1e-6 leaves a wide margin and still catches a wrong formula
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-6)
    assert t_cdf(q975, df) == pytest.approx(0.975, abs=1e-7)
    assert t_cdf(0.0, df) == pytest.approx(0.5, abs=1e-12)


def test_large_df_approaches_the_normal():
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)


def test_rule_on_intervals():
    assert verdict_from_interval(0.1, 0.3) == HOLDS
    assert verdict_from_interval(-0.3, -0.1) == FAILS
    assert verdict_from_interval(-0.1, 0.3) == NOT_RESOLVED
    assert verdict_from_interval(-0.3, -0.1, claimed_positive=False) == HOLDS
    with pytest.raises(ValueError):
        verdict_from_interval(1.0, 0.0)


def test_welch_interval_by_hand():
    a, b = [1.0, 2.0, 3.0], [14.0, 16.0, 18.0]
    c = compare(a, b)
    # means 2 and 16, variances 1 and 4: se = sqrt(1/3 + 4/3), df = se^4 / ((1/3)^2/2 + (4/3)^2/2)
    se = math.sqrt(5 / 3)
    df = se ** 4 / ((1 / 9) / 2 + (16 / 9) / 2)
    half = t_quantile(0.975, df) * se
    assert c.diff == pytest.approx(14.0)
    assert c.lo == pytest.approx(14.0 - half) and c.hi == pytest.approx(14.0 + half)
    assert c.verdict == HOLDS and "holds" in c.describe()


def test_lower_is_better_flips_the_direction():
    assert compare([1.0, 1.1, 1.05], [0.7, 0.75, 0.8], higher_is_better=False).verdict == HOLDS
    assert compare([1.0, 1.1, 1.05], [1.3, 1.35, 1.4], higher_is_better=False).verdict == FAILS


def test_overlapping_arms_are_not_resolved_and_say_by_how_much():
    c = compare([0.1, 0.2, 0.15], [0.12, 0.19, 0.16])
    assert c.verdict == NOT_RESOLVED and "smaller than" in c.describe()


def test_paired_uses_per_seed_differences():
    # a shared seed effect of +-1 drowns the +0.1 gain unpaired but not paired
    a, b = [0.0, 1.0, 2.0, 3.0], [0.1, 1.1, 2.1, 3.15]
    assert compare(a, b).verdict == NOT_RESOLVED
    assert compare(a, b, paired=True).verdict == HOLDS


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least 3 seeds"):
        compare([1.0], [2.0, 3.0])
    # the course's rule (>= 3 seeds) is the package's, not the callers'
    with pytest.raises(ValueError, match="at least 3 seeds"):
        compare([1.0, 2.0], [2.0, 3.0])
    with pytest.raises(ValueError, match="NaN"):
        compare([1.0, float("nan"), 2.0], [2.0, 3.0, 4.0])


def test_wilson_interval_matches_a_worked_example_and_its_edges():
    from codex_lab.stats import wilson_interval

    # Newcombe (1998), Statistics in Medicine 17, table I: 81/263 -> 0.2553 to 0.3662
    p = wilson_interval(81, 263)
    assert p.lo == pytest.approx(0.2553, abs=5e-5) and p.hi == pytest.approx(0.3662, abs=5e-5)
    # 0 of 10: the interval still has width (Wald's would be [0, 0])
    z = wilson_interval(0, 10)
    assert z.lo == 0.0 and z.hi == pytest.approx(0.2775, abs=5e-4)
    assert wilson_interval(10, 10).hi == 1.0 and "10/10" in wilson_interval(10, 10).describe()
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(3, 2)


def test_timing_ratio_uses_per_round_ratios_and_says_when_inside_the_spread():
    from codex_lab.stats import timing_ratio

    t = timing_ratio([10.0, 20.0, 12.0], [5.0, 10.0, 6.0], a="slow", b="fast")
    assert t.speedup == pytest.approx(2.0) and (t.lo, t.hi) == (2.0, 2.0) and not t.within_spread
    assert "faster in every round" in t.describe()
    mixed = timing_ratio([10.0, 10.0, 10.0, 10.0], [9.0, 11.0, 9.5, 12.0])
    assert mixed.within_spread and "no difference measured" in mixed.describe()
    assert mixed.speedup == pytest.approx((10 / 9.5 + 10 / 11) / 2)
    with pytest.raises(ValueError, match="interleaved rounds"):
        timing_ratio([1.0], [1.0])


# ---------------------------------------------------------------- review: edges a peer suite would try


@pytest.mark.parametrize("df", [0.5, 1, 1.5, 2, 3.7, 30, 1e3, 9e4, 2e5, 1e9, 1e12])
@pytest.mark.parametrize("p", [1e-9, 1e-6, 0.025, 0.5, 0.6, 0.975, 0.9995, 1 - 1e-9])
def test_t_quantile_agrees_with_scipy_everywhere(df, p):
    stats = pytest.importorskip("scipy.stats")
    # relative 1e-8: the bisection stops at 1e-12 relative; the beta function and the
    # Cornish-Fisher branch (df > 1e5, next term ~z^7/df^3) are good to ~1e-12 here. The old
    # code clamped |t| at 1000 (df=1, p=1e-6 is -318310) and drifted by 5e-5 at df=1e12.
    ref = float(stats.t.ppf(p, df))
    assert t_quantile(p, df) == pytest.approx(ref, rel=1e-8, abs=1e-12)


def test_t_quantile_of_infinite_df_is_the_normal_and_of_a_half_is_zero():
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963984540054, abs=1e-12)
    assert t_quantile(0.5, 3.0) == 0.0
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.975, float("nan"))


def test_a_high_level_at_few_seeds_is_not_clamped():
    # n = 2 per arm with one spread arm: df = 1, so the 99.99% quantile is 6366.2 (not 1000):
    # the interval must be about 6.4x wider than a clamped quantile would make it (the
    # interval's engine, below compare's >= 3 seeds rule)
    from codex_lab.stats import _scaled_interval

    _, lo, hi = _scaled_interval([0.0, 1.0], [10.0, 10.0], paired=False, level=0.9999)
    se = math.sqrt(0.5 / 2)
    assert (hi - lo) / 2 == pytest.approx(6366.1977 * se, rel=1e-6)


@pytest.mark.parametrize("scale", [1e-200, 1e-170, 1.0, 1e80, 1e200])
def test_welch_interval_is_scale_free(scale):
    # the interval of (a, b) * s is the interval of (a, b) times s: before, 1e80 overflowed
    # (OverflowError) and 1e-170 underflowed to zero variance (a zero-width "holds")
    a, b = [1.0, 3.0, 2.0], [1.1, 2.9, 2.2]
    ref = compare(a, b)
    c = compare([x * scale for x in a], [x * scale for x in b])
    assert c.lo == pytest.approx(ref.lo * scale, rel=1e-9) and c.hi == pytest.approx(ref.hi * scale, rel=1e-9)
    assert c.verdict == ref.verdict == NOT_RESOLVED


def test_welch_matches_scipy_on_random_arms():
    stats = pytest.importorskip("scipy.stats")
    import random

    rng = random.Random(0)
    for _ in range(20):
        na, nb = rng.randint(3, 9), rng.randint(3, 9)
        a = [rng.gauss(0, rng.uniform(0.1, 3)) for _ in range(na)]
        b = [rng.gauss(0.5, rng.uniform(0.1, 3)) for _ in range(nb)]
        ref = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
        c = compare(a, b)
        # 1e-8 relative: both compute the same closed form; only the quantile's method differs
        assert c.lo == pytest.approx(float(ref.low), rel=1e-8) and c.hi == pytest.approx(float(ref.high), rel=1e-8)
        if na == nb:
            pref = stats.ttest_rel(b, a).confidence_interval(0.95)
            pc = compare(a, b, paired=True)
            assert pc.lo == pytest.approx(float(pref.low), rel=1e-8)
            assert pc.hi == pytest.approx(float(pref.high), rel=1e-8)


def test_zero_variance_arms_and_paired_constant_differences():
    # identical deterministic arms: no difference, nothing resolved (not a crash, not "holds")
    assert compare([0.5] * 3, [0.5] * 3).verdict == NOT_RESOLVED
    assert compare([0.5] * 3, [0.5] * 3, paired=True).verdict == NOT_RESOLVED
    # a constant per-seed gain has zero seed variance: no variance was measured, so no verdict
    # (a zero-width interval would say "holds" on any deterministic pipeline)
    c = compare([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], paired=True)
    assert c.diff == pytest.approx(0.5) and c.verdict == NOT_RESOLVED and "no variance measured" in c.describe()
    assert compare([0.5] * 3, [0.6] * 3).verdict == NOT_RESOLVED
    # the evaluation sample's noise, when given, makes the interval honest again
    c = compare([0.5] * 3, [0.6] * 3, eval_se=(0.02, 0.02))
    # se = sqrt(0.02^2 + 0.02^2) = 0.0283, normal quantile 1.96: half-width 0.0554
    assert c.half_width == pytest.approx(1.959964 * math.sqrt(0.0008), rel=1e-6) and c.verdict == HOLDS
    c = compare([0.5] * 3, [0.52] * 3, eval_se=(0.02, 0.02))
    assert c.verdict == NOT_RESOLVED and not c.note


@pytest.mark.parametrize("a,b,match", [
    ("abc", [1.0, 2.0], "arm a must be a sequence"),
    ([None, 1.0], [1.0, 2.0], "arm a must hold one number"),
    ([1.0, 2.0], ["x", 2.0], "arm b must hold one number"),
    ([1.0, float("inf"), 2.0], [1.0, 2.0, 3.0], "NaN or infinite"),
])
def test_non_numeric_arms_are_one_value_error(a, b, match):
    with pytest.raises(ValueError, match=match):
        compare(a, b)


@pytest.mark.parametrize("level", [95, 1.0, 0.0, -0.5, float("nan")])
def test_a_level_outside_zero_one_is_named(level):
    with pytest.raises(ValueError, match="level is the interval's coverage"):
        compare([1.0, 2.0, 3.0], [2.0, 3.0, 4.0], level=level)


def test_a_nan_interval_has_no_verdict():
    with pytest.raises(ValueError, match="NaN"):
        verdict_from_interval(float("nan"), 1.0)


@pytest.mark.parametrize("k,n,level,match", [(2.5, 10, 0.95, "counts"), (True, 10, 0.95, "counts"),
                                             (3, 10, 95, "coverage"), (11, 10, 0.95, "0 <= k <= n")])
def test_wilson_refuses_non_counts_and_levels_outside_zero_one(k, n, level, match):
    from codex_lab.stats import wilson_interval

    with pytest.raises(ValueError, match=match):
        wilson_interval(k, n, level=level)


def test_wilson_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    from codex_lab.stats import wilson_interval

    # scipy's binomtest(k, n).proportion_ci(method="wilson") is the same score interval
    for k, n in [(0, 1), (1, 1), (0, 7), (3, 7), (81, 263), (999, 1000)]:
        ref = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        p = wilson_interval(k, n)
        assert p.lo == pytest.approx(ref.low, abs=1e-12) and p.hi == pytest.approx(ref.high, abs=1e-12)


# ---------------------------------------------------------------- non-inferiority, Holm, training state


def test_noninferiority_against_scipy_one_sided_bounds():
    stats = pytest.importorskip("scipy.stats")
    from codex_lab.stats import noninferiority

    a = [2.10, 2.05, 2.12, 2.08, 2.11]  # baseline loss per seed
    b = [2.13, 2.06, 2.15, 2.10, 2.12]  # candidate loss, paired by seed
    c = noninferiority(a, b, margin=0.05, higher_is_better=False, paired=True)
    d = [y - x for x, y in zip(a, b)]
    ref = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    # the reported interval is the two-sided 90% one (its ends are the one-sided 95% bounds);
    # 1e-8 relative: the same closed form, only the t quantile's method differs
    assert c.lo == pytest.approx(float(ref.low), rel=1e-8) and c.hi == pytest.approx(float(ref.high), rel=1e-8)
    # one-sided p of H0 "cost >= margin": SciPy's t-test of d against 0.05, alternative "less"
    p = stats.ttest_1samp(d, 0.05, alternative="less").pvalue
    assert c.p_value == pytest.approx(float(p), rel=1e-6)
    assert c.verdict == HOLDS and c.kind == "non-inferiority" and "margin 0.05" in c.describe()


def test_noninferiority_fails_holds_and_straddles():
    from codex_lab.stats import noninferiority

    base = [1.00, 1.02, 0.98, 1.01]
    worse = [1.20, 1.23, 1.18, 1.21]  # +0.2 nats/token: far beyond a 0.05 margin
    assert noninferiority(base, worse, margin=0.05, higher_is_better=False, paired=True).verdict == FAILS
    better = [0.90, 0.93, 0.87, 0.91]  # lower loss: quality kept (and then some)
    assert noninferiority(base, better, margin=0.05, higher_is_better=False, paired=True).verdict == HOLDS
    near = [1.04, 1.10, 0.99, 1.07]  # cost ~0.05 with spread: bounds straddle the margin
    c = noninferiority(base, near, margin=0.05, higher_is_better=False, paired=True)
    assert c.verdict == NOT_RESOLVED and "straddle the margin" in c.describe()
    # accuracy (higher is better): a 0.3 drop with a 0.05 margin fails
    assert noninferiority([0.9, 0.92, 0.91], [0.6, 0.62, 0.61], margin=0.05).verdict == FAILS
    with pytest.raises(ValueError, match="margin"):
        noninferiority(base, near, margin=0.0)


def test_superiority_cannot_confirm_kept_quality_but_noninferiority_can():
    from codex_lab.stats import noninferiority

    # equal arms with seed noise: "b is better" is not resolved however it is run, while the
    # equivalence question ("worse by less than 0.05?") has an answer
    a = [1.000, 1.010, 0.990, 1.005, 0.995]
    b = [1.002, 1.008, 0.992, 1.004, 0.996]
    assert compare(a, b, higher_is_better=False, paired=True).verdict == NOT_RESOLVED
    assert noninferiority(a, b, margin=0.05, higher_is_better=False, paired=True).verdict == HOLDS


def test_holm_adjusts_secondary_comparisons():
    from codex_lab.stats import holm

    strong = compare([1.0, 1.1, 1.2], [2.0, 2.1, 2.3])  # p ~ 0.001
    weak = compare([1.0, 1.3, 1.1, 0.9, 1.2], [1.3, 1.5, 1.35, 1.1, 1.5])  # p ~ 0.04 alone
    assert weak.verdict == HOLDS and 0.01 < weak.p_value < 0.05
    out = holm([strong, weak, compare([1.0, 1.2, 1.1], [1.05, 1.15, 1.1])])
    # three comparisons: the weak one's adjusted p = max(3 p_1, 2 p_2) > 0.05 -> not resolved
    assert out[0].verdict == HOLDS and out[1].verdict == NOT_RESOLVED and "Holm-adjusted p" in out[1].describe()
    assert all("Holm over 3" in c.role for c in out)
    # alone (m = 1) Holm is the uncorrected test
    assert holm([weak])[0].verdict == HOLDS


def test_holm_agrees_with_statsmodels_formula():
    # Holm's adjusted p by hand on known p-values (Holm 1979): sorted 0.01, 0.02, 0.04 with m = 3
    # -> 0.03, max(0.03, 0.04) = 0.04, max(0.04, 0.04) = 0.04
    from dataclasses import replace

    from codex_lab.stats import holm

    base = compare([1.0, 1.1, 1.2], [2.0, 2.1, 2.3])
    cs = [replace(base, p_value=p) for p in (0.04, 0.01, 0.02)]
    adj = [float(c.note.split("= ")[-1].split(" ")[0]) for c in holm(cs)]
    assert adj == pytest.approx([0.04, 0.03, 0.04])


def test_judge_trained_withholds_the_verdict():
    from codex_lab.stats import UNDER_TRAINED, judge_trained
    from codex_lab.training_state import training_state

    c = compare([1.0, 1.1, 1.05], [0.7, 0.75, 0.8], higher_is_better=False)
    flat = training_state([[(s, 1.0 + 0.001 * (s % 2)) for s in range(0, 100, 10)]] * 3,
                          higher_is_better=False, min_change=0.01, arm="base")
    rising = training_state([[(s, 3.0 - 0.01 * s) for s in range(0, 100, 10)]] * 3,
                            higher_is_better=False, min_change=0.01, arm="gqa")
    assert judge_trained(c, [flat, flat]).verdict == HOLDS
    j = judge_trained(c, [flat, rising])
    assert j.verdict == UNDER_TRAINED and j.measured_verdict == HOLDS and "gqa under-trained" in j.describe()
    assert len(j.describe()) <= 300  # one short line: the reasons in full live on the states


def test_check_stated():
    from codex_lab.stats import FAILS_AS_STATED, check_stated

    assert check_stated(0.75, 0.35, 0.45) == FAILS_AS_STATED  # GQA "about 40%" vs 75% at g = 4
    assert check_stated(0.40, 0.35, 0.45) == HOLDS
    assert check_stated(1.99, 1.45, 1.55) == FAILS_AS_STATED  # O(N sqrt N) vs exponent 1.99


def test_holm_keeps_a_clear_noninferiority_failure():
    """A non-inferiority 'fails' rejects 'cost <= margin': Holm must use that test's p, not p('cost >= margin') ~ 1
    (a lesson-01 secondary with its whole interval past the margin was demoted to 'not resolved')."""
    from codex_lab.stats import holm, noninferiority

    base = [1.00, 1.02, 0.98, 1.01, 0.99]
    far = [1.13, 1.14, 1.10, 1.12, 1.11]  # cost ~0.12, far past a 0.05 margin
    kept = [1.00, 1.03, 0.98, 1.02, 0.99]
    c_far = noninferiority(base, far, margin=0.05, higher_is_better=False, paired=True)
    c_kept = noninferiority(base, kept, margin=0.05, higher_is_better=False, paired=True)
    assert (c_far.verdict, c_kept.verdict) == (FAILS, HOLDS) and c_far.p_value > 0.99
    out = holm([c_far, c_kept])
    assert [c.verdict for c in out] == [FAILS, HOLDS]
