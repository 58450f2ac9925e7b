"""The evidence's statistics (``benchmarks/evidence/stats.py``: scipy.stats and
statsmodels) against independent computations: the hand-written oracle
(``tests/evidence_stats_oracle.py``, the module they replaced), a BCa
interval written here from its formula, hand-worked cases and brute-force
enumeration."""

import itertools
import math
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

import evidence_stats_oracle as oracle
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "evidence"))
from stats import (  # noqa: E402
    divergence_test, holm, holm_levels, mean_interval, paired_difference, sign_test, verdict, wilcoxon,
)


def paired_sample(n, shift, seed):
    """Errors of two methods on n seeds: b = a + shift + noise, no ties."""
    rng = np.random.default_rng(seed)
    a = rng.normal(10.0, 1.0, n)
    return a, a + shift + rng.normal(0.0, 0.5, n)


# --- t interval and t test -------------------------------------------------------------
@pytest.mark.parametrize("n, shift, seed", [(3, 0.0, 0), (10, 0.3, 1), (25, -0.2, 2)])
def test_t_interval_equals_the_oracle(n, shift, seed):
    a, b = paired_sample(n, shift, seed)
    ours, hand = paired_difference(a, b), oracle.paired_difference(a, b)
    assert ours.n == hand.n and ours.mean == pytest.approx(hand.mean) and ours.sd == pytest.approx(hand.sd)
    assert ours.t_interval == pytest.approx(hand.t_interval, abs=1e-8)


def test_t_p_equals_the_oracles_t_distribution():
    a, b = paired_sample(10, 0.4, 3)
    d = a - b
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    result = paired_difference(a, b)
    assert result.t_p == pytest.approx(2 * oracle.t_upper_tail(abs(t), len(d) - 1), rel=1e-8)
    assert result.p == result.t_p, "the verdicts rest on the t test"


# --- sign and signed-rank tests ----------------------------------------------------------
@pytest.mark.parametrize("n, shift, seed", [(5, 0.0, 0), (10, 0.3, 1), (12, -0.2, 2), (20, 0.1, 3)])
def test_sign_and_exact_wilcoxon_equal_the_oracle(n, shift, seed):
    a, b = paired_sample(n, shift, seed)
    result = paired_difference(a, b)
    assert result.sign_p == pytest.approx(oracle.sign_test_p(a - b), rel=1e-12)
    assert result.wilcoxon_method == "exact"
    assert result.wilcoxon_p == pytest.approx(oracle.wilcoxon_p(a - b), rel=1e-12)


def test_wilcoxon_with_ties_is_the_normal_approximation_of_the_oracle():
    d = np.round(np.random.default_rng(4).normal(0.2, 1.0, 30), 1)  # ties and zeros
    p, method = wilcoxon(d)
    assert method == "normal approximation"
    assert p == pytest.approx(oracle._normal_signed_rank_p(*_ranks_and_w(d)), rel=1e-9)


def _ranks_and_w(d):
    nonzero = d[d != 0]
    ranks, counts = oracle._average_ranks(np.abs(nonzero))
    return len(nonzero), counts, float(ranks[nonzero > 0].sum())


def test_exact_wilcoxon_equals_enumeration():
    d = np.array([0.5, -0.7, 1.1, 1.3, -2.0, 3.0, 0.2, 0.9])
    ranks = scipy_stats.rankdata(np.abs(d))
    observed = ranks[d > 0].sum()
    sums = [sum(r for r, plus in zip(ranks, signs) if plus) for signs in itertools.product([False, True], repeat=8)]
    tail = min(sum(s <= observed for s in sums), sum(s >= observed for s in sums)) / len(sums)
    assert wilcoxon(d) == (pytest.approx(min(1.0, 2 * tail), rel=1e-12), "exact")


def test_float_noise_from_subtraction_is_a_tie_and_a_zero_is_dropped():
    a, b = [0.3, 0.5, 1.0, 2.0, 3.0], [0.1, 0.7, 1.0, 1.0, 1.0]
    assert 0.3 - 0.1 != -(0.5 - 0.7)
    p, method = wilcoxon(np.subtract(a, b))
    assert method == "normal approximation"  # the two 0.2s are one tie
    assert sign_test(np.subtract(a, b)) == pytest.approx(oracle.sign_test_p(np.subtract(a, b)))


def test_no_spread_gives_a_point_interval_and_a_decided_p():
    same = paired_difference([3.0, 4.0, 5.0], [3.0, 4.0, 5.0])
    assert same.t_interval == same.bca_interval == (0.0, 0.0) and (same.p, same.wilcoxon_p, same.sign_p) == (1, 1, 1)
    shifted = paired_difference([3.0, 4.0, 5.0], [2.0, 3.0, 4.0])
    assert shifted.t_interval == (1.0, 1.0) and shifted.p == 0.0


# --- BCa bootstrap -----------------------------------------------------------------------
def bca_by_hand(d, confidence=0.95, resamples=40000, seed=11):
    """Efron's BCa interval of the mean, from its formula: bias z0 from the
    share of resampled means below the mean, acceleration from the jackknife."""
    rng = np.random.default_rng(seed)
    n = len(d)
    means = d[rng.integers(0, n, (resamples, n))].mean(axis=1)
    normal = scipy_stats.norm
    z0 = normal.ppf((means < d.mean()).mean())
    jack = np.array([np.delete(d, i).mean() for i in range(n)])
    u = jack.mean() - jack
    a = (u ** 3).sum() / (6 * ((u ** 2).sum()) ** 1.5)
    bounds = []
    for alpha in ((1 - confidence) / 2, (1 + confidence) / 2):
        z = normal.ppf(alpha)
        bounds.append(np.quantile(means, normal.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))))
    return tuple(bounds)


@pytest.mark.parametrize("seed", [5, 6])
def test_bca_interval_equals_the_formula_by_hand(seed):
    rng = np.random.default_rng(seed)
    d = rng.exponential(1.0, 10) - 0.5  # skewed: BCa moves away from the percentile interval
    result = paired_difference(d, np.zeros(10), resamples=40000)
    assert result.bca_interval == pytest.approx(bca_by_hand(d), abs=0.03)
    percentile = oracle.paired_difference(d, np.zeros(10), resamples=40000).bootstrap_interval
    assert result.bca_interval != pytest.approx(percentile, abs=0.005), "BCa is not the percentile interval"


def test_bootstrap_is_deterministic_in_its_seed():
    a, b = paired_sample(10, 0.2, seed=5)
    assert paired_difference(a, b, seed=7).bca_interval == paired_difference(a, b, seed=7).bca_interval
    assert paired_difference(a, b, seed=7).bca_interval != paired_difference(a, b, seed=8).bca_interval


# --- Holm and McNemar --------------------------------------------------------------------
@pytest.mark.parametrize("p", [[0.01, 0.04, 0.03, 0.005], [0.6, 0.5], [0.3], [], [0.001] * 5 + [0.9, 0.02]])
def test_holm_equals_the_oracle(p):
    assert holm(p) == pytest.approx(oracle.holm(p))


def test_holm_hand_case_and_refusal():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    with pytest.raises(ValueError, match="between 0 and 1"):
        holm([0.1, 1.5])


def test_holm_levels_hand_case():
    # sorted: 0.005 (1 - 0.05/4), 0.01 (1 - 0.05/3), 0.03 >= 0.05/2 stops Holm: it and 0.04 keep 1 - 0.05/2
    assert holm_levels([0.01, 0.04, 0.03, 0.005]) == pytest.approx([1 - 0.05 / 3, 1 - 0.05 / 2, 1 - 0.05 / 2,
                                                                     1 - 0.05 / 4])
    assert holm_levels([]) == [] and holm_levels([0.2]) == [0.95]
    with pytest.raises(ValueError, match="between 0 and 1"):
        holm_levels([0.1, -0.1])


@pytest.mark.parametrize("seed", range(6))
def test_a_t_interval_at_its_holm_level_excludes_zero_exactly_where_the_oracles_holm_rejects(seed):
    """Families of paired comparisons with effects from none to large: the
    interval at the level ``holm_levels`` gives lies off 0 exactly where the
    hand-written Holm adjustment is below 0.05."""
    rng = np.random.default_rng(seed)
    pairs = [paired_sample(10, shift, seed * 100 + i) for i, shift in enumerate(rng.uniform(-0.8, 0.8, 12))]
    p = [paired_difference(a, b, resamples=100).p for a, b in pairs]
    adjusted = oracle.holm(p)
    levels = holm_levels(p)
    rejected = 0
    for (a, b), level, q in zip(pairs, levels, adjusted):
        low, high = paired_difference(a, b, confidence=level, resamples=100).t_interval
        assert (low > 0 or high < 0) == (q < 0.05), (low, high, q)
        rejected += q < 0.05
    assert 0 < rejected < len(p) or seed > 2, "the families mix rejected and kept comparisons"


def test_divergence_test_is_the_exact_mcnemar_on_discordant_seeds():
    a = [True, True, True, True, False, False, False, True, False, False]
    b = [False, False, False, False, False, False, False, True, True, False]
    only_a, only_b, p = divergence_test(a, b)
    assert (only_a, only_b) == (4, 1)
    assert p == pytest.approx(2 * (1 + 5) / 32)  # P(X <= 1 of 5) doubled
    assert divergence_test([True, False], [True, False]) is None, "no discordant seed: nothing to test"
    with pytest.raises(ValueError, match="one per seed"):
        divergence_test([True], [True, False])


# --- the rest ----------------------------------------------------------------------------
def test_mean_interval_equals_the_oracles_t_quantile():
    values = [1.0, 2.0, 4.0, 7.0]
    mean, half = mean_interval(values)
    assert mean == 3.5
    assert half == pytest.approx(oracle.t_quantile(0.975, 3) * np.std(values, ddof=1) / 2)
    assert mean_interval([5.0]) == (5.0, 0.0)


def test_bad_input_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="lengths"):
        paired_difference([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_difference([1], [2])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1, math.nan], [2, 3])
    with pytest.raises(ValueError, match="confidence"):
        paired_difference([1, 2], [2, 3], confidence=95)


def test_verdict_of_an_interval_against_a_target():
    assert verdict((0.1, 0.5), 0.0) == "met"
    assert verdict((-0.5, -0.1), 0.0) == "missed"
    assert verdict((-0.1, 0.5), 0.0) == "not decided by this run"
