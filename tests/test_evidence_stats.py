"""The evidence's statistics against independent computations: scipy where it
has the same quantity, hand-worked cases and brute-force enumeration otherwise."""

import itertools
import math
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "evidence"))
from stats import classify, holm, paired_difference, recovery_ratio, t_quantile, wilcoxon_p  # noqa: E402


def paired_sample(n, shift, seed):
    """Errors of two methods on n seeds: b = a + shift + noise, no ties."""
    rng = np.random.default_rng(seed)
    a = rng.normal(10.0, 1.0, n)
    return a, a + shift + rng.normal(0.0, 0.5, n)


# --- t quantile and t interval ---------------------------------------------------------
@pytest.mark.parametrize("p", [0.9, 0.975, 0.995])
def test_t_quantile_matches_scipy(p):
    for df in range(1, 41):
        assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), abs=1e-8), df


def test_t_quantile_is_symmetric_and_zero_at_the_median():
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-12)
    assert t_quantile(0.025, 7) == pytest.approx(-t_quantile(0.975, 7), abs=1e-12)


def test_t_interval_matches_scipy():
    a, b = paired_sample(9, -0.4, seed=3)
    d = a - b
    expected = scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    result = paired_difference(a, b)
    assert result.n == 9
    assert result.mean == pytest.approx(d.mean())
    assert result.sd == pytest.approx(d.std(ddof=1))
    assert result.t_interval == pytest.approx(expected, abs=1e-9)


# --- sign and signed-rank tests ----------------------------------------------------------
@pytest.mark.parametrize("n, shift, seed", [(5, 0.0, 0), (8, 0.3, 1), (12, -0.2, 2), (20, 0.1, 3)])
def test_sign_and_wilcoxon_p_match_scipy(n, shift, seed):
    a, b = paired_sample(n, shift, seed)
    d = a - b
    result = paired_difference(a, b)
    assert result.sign_p == pytest.approx(scipy_stats.binomtest(int((d > 0).sum()), n, 0.5).pvalue, rel=1e-12)
    assert result.wilcoxon_p == pytest.approx(scipy_stats.wilcoxon(d, method="exact").pvalue, rel=1e-12)
    assert result.p == result.wilcoxon_p


def test_sign_test_hand_case():
    # 1 positive of 5 non-zero (the zero is dropped): P(X <= 1) = (1 + 5) / 32,
    # p = 2 * 6 / 32 = 0.375.
    result = paired_difference([1, 2, 3, 4, 5, 6], [0, 3, 4, 5, 6, 6])
    assert result.sign_p == pytest.approx(0.375, rel=1e-12)


def test_exact_wilcoxon_with_ties_and_zeros_matches_enumeration():
    d = np.array([0.5, -0.5, 1.0, 1.0, -2.0, 0.0, 3.0, 1.0])  # ties in |d| and one zero
    nonzero = d[d != 0]
    ranks = scipy_stats.rankdata(np.abs(nonzero))  # average ranks
    observed = ranks[nonzero > 0].sum()
    sums = [sum(r for r, plus in zip(ranks, signs) if plus)
            for signs in itertools.product([False, True], repeat=len(ranks))]
    at_most = sum(s <= observed + 1e-9 for s in sums) / len(sums)
    at_least = sum(s >= observed - 1e-9 for s in sums) / len(sums)
    assert wilcoxon_p(d) == pytest.approx(min(1.0, 2 * min(at_most, at_least)), rel=1e-12)


def test_wilcoxon_normal_approximation_above_20_matches_scipy():
    d = np.round(np.random.default_rng(4).normal(0.2, 1.0, 30), 1)  # ties and zeros
    expected = scipy_stats.wilcoxon(d, method="approx", zero_method="wilcox", correction=False).pvalue
    assert wilcoxon_p(d) == pytest.approx(expected, rel=1e-9)


def test_float_noise_from_subtraction_is_a_tie():
    # 0.3 - 0.1 and 0.5 - 0.7 differ in |d| in the last bits but are the same 0.2.
    # Non-zero ranks 1.5, 1.5, 3, 4; W+ = 1.5 + 3 + 4 = 8.5; sums >= 8.5: {1.5, 3, 4}
    # twice and all four, 3 of 16; p = 2 * 3 / 16 = 0.375 (split ties would give
    # W+ = 9 and p = 0.25).
    a, b = [0.3, 0.5, 1.0, 2.0, 3.0], [0.1, 0.7, 1.0, 1.0, 1.0]
    assert 0.3 - 0.1 != -(0.5 - 0.7)
    assert wilcoxon_p(np.subtract(a, b)) == pytest.approx(0.375, rel=1e-12)


def test_all_zero_differences():
    result = paired_difference([3.0, 4.0, 5.0], [3.0, 4.0, 5.0])
    assert (result.mean, result.sd) == (0.0, 0.0)
    assert result.t_interval == (0.0, 0.0) and result.bootstrap_interval == (0.0, 0.0)
    assert (result.sign_p, result.wilcoxon_p, result.p) == (1.0, 1.0, 1.0)


# --- bootstrap ---------------------------------------------------------------------------
def test_bootstrap_is_deterministic_in_its_seed():
    a, b = paired_sample(10, 0.2, seed=5)
    assert paired_difference(a, b, seed=7).bootstrap_interval == paired_difference(a, b, seed=7).bootstrap_interval
    assert paired_difference(a, b, seed=7).bootstrap_interval != paired_difference(a, b, seed=8).bootstrap_interval


def test_bootstrap_interval_contains_the_mean_and_narrows_with_more_seeds():
    widths = []
    for n in (8, 200):
        a, b = paired_sample(n, 0.2, seed=6)
        result = paired_difference(a, b, resamples=4000)
        low, high = result.bootstrap_interval
        assert low < result.mean < high
        assert result.t_interval[0] < result.mean < result.t_interval[1]
        widths.append(high - low)
    assert widths[1] < widths[0] / 2


def test_bootstrap_interval_is_close_to_the_t_interval_on_normal_data():
    a, b = paired_sample(200, 0.2, seed=9)
    result = paired_difference(a, b, resamples=4000)
    t_width = result.t_interval[1] - result.t_interval[0]
    boot_width = result.bootstrap_interval[1] - result.bootstrap_interval[0]
    assert boot_width == pytest.approx(t_width, rel=0.15)


# --- Holm --------------------------------------------------------------------------------
def test_holm_hand_case():
    # sorted: 0.005 * 4 = 0.02, 0.01 * 3 = 0.03, 0.03 * 2 = 0.06, 0.04 * 1 = 0.04 -> max(0.06, 0.04) = 0.06;
    # back in the input order [0.01, 0.04, 0.03, 0.005]:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_caps_at_one_and_keeps_edge_cases():
    # 0.5 * 2 = 1.0, 0.6 * 1 = 0.6 -> raised to 1.0 (monotone).
    assert holm([0.6, 0.5]) == [1.0, 1.0]
    assert holm([0.3]) == [0.3]
    assert holm([]) == []


def test_holm_rejects_values_that_are_not_probabilities():
    with pytest.raises(ValueError, match="between 0 and 1"):
        holm([0.1, 1.5])


# --- recovery ratio ----------------------------------------------------------------------
def test_recovery_ratio_hand_case():
    # means 11, 10, 9: R = (11 - 10) / (11 - 9) = 0.5, and every resample gives 1 / 2.
    ratio = recovery_ratio([10, 11, 12], [9, 10, 11], [8, 9, 10])
    assert ratio.defined and ratio.value == 0.5
    assert ratio.interval[0] <= 0.5 <= ratio.interval[1]


def test_recovery_ratio_interval_is_deterministic_and_contains_the_value():
    rng = np.random.default_rng(10)
    sgd = rng.normal(10.0, 0.5, 10)
    asgd, dc = sgd + 2.0 + rng.normal(0, 0.3, 10), sgd + 1.0 + rng.normal(0, 0.3, 10)
    ratio = recovery_ratio(asgd, dc, sgd, seed=3)
    assert ratio == recovery_ratio(asgd, dc, sgd, seed=3)
    assert ratio.interval[0] < ratio.value < ratio.interval[1]
    assert 0.0 < ratio.value < 1.0


@pytest.mark.parametrize("asgd", [[8, 9, 10], [7, 8, 9]])  # as good as SGD, better than SGD
def test_recovery_ratio_is_undefined_when_asgd_is_not_worse_than_sgd(asgd):
    ratio = recovery_ratio(asgd, [9, 10, 11], [8, 9, 10])
    assert not ratio.defined
    assert math.isnan(ratio.value) and all(math.isnan(x) for x in ratio.interval)


# --- errors and words --------------------------------------------------------------------
def test_bad_input_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="lengths"):
        paired_difference([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_difference([1], [2])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1, math.nan], [2, 3])
    with pytest.raises(ValueError, match="lengths"):
        recovery_ratio([1, 2], [1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="confidence"):
        paired_difference([1, 2], [2, 3], confidence=95)
    with pytest.raises(ValueError, match="positive integer"):
        t_quantile(0.9, 0)


def test_classify():
    assert classify((0.1, 0.5), 0.01) == "above 0"
    assert classify((-0.5, -0.1), 0.01) == "below 0"
    assert classify((0.1, 0.5), 0.2) == "within noise"  # excludes 0 but not significant after adjustment
    assert classify((-0.1, 0.5), 0.01) == "within noise"
    assert classify((math.nan, math.nan), 0.01) == "within noise"
    assert classify((0.1, 0.5), 0.03, alpha=0.01) == "within noise"
