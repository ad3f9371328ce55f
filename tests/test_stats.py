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
    with pytest.raises(ValueError, match="at least 2 seeds"):
        compare([1.0], [2.0, 3.0])
    with pytest.raises(ValueError, match="NaN"):
        compare([1.0, float("nan")], [2.0, 3.0])


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
