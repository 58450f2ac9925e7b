"""Statistics for comparing training methods on paired seeds, from scipy.stats
and statsmodels.

One seed is one pair: the same seed gives both methods the same initial
weights, batches and delays, so a method's effect is read from the per-seed
differences (percentage points), not from two separate spreads.

* ``paired_difference``: the mean difference; the paired t test
  (``scipy.stats.ttest_rel``) with its interval; the BCa bootstrap interval of
  the mean (``scipy.stats.bootstrap``); the Wilcoxon signed-rank test
  (``scipy.stats.wilcoxon``, zeros dropped, exact or normal, the method kept);
  the exact sign test (``scipy.stats.binomtest``).  ``p``, the p-value a
  verdict rests on, is the t test's (see ``docs/results/PLAN.md``, section 6).
* ``divergence_test``: the exact McNemar test on paired did-not-train flags.
* ``holm``: Holm's step-down adjustment of a family of p-values
  (``statsmodels.stats.multitest.multipletests``); ``holm_levels``: the
  confidence level of each test's interval that agrees with Holm's verdict
  (the interval of a t test excludes 0 exactly where Holm rejects it).
* ``mean_interval``: a mean and the half-width of its t interval.
* ``verdict``: an interval against a target, in words.

The hand-written versions this module replaced are kept in
``tests/evidence_stats_oracle.py`` as the tests' independent cross-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

# Differences are rounded to this many decimals before the rank and sign tests,
# so that float noise from subtracting two errors neither splits a tie nor
# turns a zero difference into a tiny positive or negative one.
TIE_DECIMALS = 9

#: Up to this many non-zero differences, without ties, the Wilcoxon p-value is exact.
WILCOXON_EXACT_MAX = 50


@dataclass(frozen=True)
class Difference:
    """Method a against method b over n paired seeds (differences a - b)."""

    n: int
    mean: float
    sd: float  # sample standard deviation of the differences (ddof=1)
    t_interval: Tuple[float, float]
    t_p: float  # two-sided paired t test
    bca_interval: Tuple[float, float]  # nan where the bootstrap distribution is degenerate
    wilcoxon_p: float
    wilcoxon_method: str  # "exact" or "normal approximation"
    sign_p: float
    p: float  # the p-value a verdict rests on: the t test's


def _paired_arrays(*sequences: Sequence[float]) -> List[np.ndarray]:
    """The sequences as float arrays, after checking that they pair up."""
    arrays = [np.asarray(s, dtype=float) for s in sequences]
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"paired samples need one value per seed in each, but the lengths are "
                         f"{[len(a) for a in arrays]}")
    if lengths.pop() < 2:
        raise ValueError("paired samples need at least 2 seeds")
    if not all(np.isfinite(a).all() for a in arrays):
        raise ValueError("paired samples must be finite numbers (no nan or inf)")
    return arrays


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"the confidence level must lie strictly between 0 and 1, not {confidence}")
    if int(resamples) != resamples or resamples < 100:
        raise ValueError(f"the bootstrap needs a whole number of at least 100 resamples, not {resamples}")


def wilcoxon(differences: np.ndarray) -> Tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p-value and how it was computed: zeros
    dropped (Wilcoxon's method), exact where no ties remain among up to
    ``WILCOXON_EXACT_MAX`` differences, otherwise the normal approximation
    with the tie correction of the variance and no continuity correction."""
    rounded = np.round(differences, TIE_DECIMALS)
    nonzero = rounded[rounded != 0.0]
    if len(nonzero) == 0:
        return 1.0, "no non-zero difference"
    ties = len(np.unique(np.abs(nonzero))) < len(nonzero)
    exact = len(nonzero) <= WILCOXON_EXACT_MAX and not ties
    p = stats.wilcoxon(nonzero, zero_method="wilcox", correction=False,
                       method="exact" if exact else "approx").pvalue
    return float(min(1.0, p)), "exact" if exact else "normal approximation"


def sign_test(differences: np.ndarray) -> float:
    """Exact two-sided sign test: zeros dropped, positives against Binomial(n, 1/2)."""
    rounded = np.round(differences, TIE_DECIMALS)
    nonzero = rounded[rounded != 0.0]
    if len(nonzero) == 0:
        return 1.0
    return float(stats.binomtest(int((nonzero > 0).sum()), len(nonzero), 0.5).pvalue)


def paired_difference(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                      resamples: int = 10000, seed: int = 0) -> Difference:
    """Compare ``a`` and ``b``, one value per seed, paired by index.

    The bootstrap resamples the per-seed differences ``resamples`` times
    with numpy's generator seeded with ``seed`` (the same inputs give the
    same interval).  Where every difference is the same, the spread is zero:
    both intervals are that value and p is 1 where it is 0, else 0."""
    _check(confidence, resamples)
    a_values, b_values = _paired_arrays(a, b)
    d = a_values - b_values
    n, mean, sd = len(d), float(d.mean()), float(d.std(ddof=1))
    w_p, w_method = wilcoxon(d)
    if np.ptp(np.round(d, TIE_DECIMALS)) == 0.0:  # no spread: the t test and the bootstrap have nothing to say
        point = (mean, mean)
        t_p = 1.0 if round(mean, TIE_DECIMALS) == 0.0 else 0.0
        return Difference(n, mean, 0.0, point, t_p, point, w_p, w_method, sign_test(d), t_p)
    t = stats.ttest_rel(a_values, b_values)
    low, high = t.confidence_interval(confidence)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = stats.bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=confidence, method="BCa",
                               rng=np.random.default_rng(seed))
    bca = (float(boot.confidence_interval.low), float(boot.confidence_interval.high))
    return Difference(n, mean, sd, (float(low), float(high)), float(t.pvalue), bca, w_p, w_method,
                      sign_test(d), float(t.pvalue))


def divergence_test(a_failed: Sequence[bool], b_failed: Sequence[bool]) -> Optional[Tuple[int, int, float]]:
    """The exact McNemar test of paired did-not-train flags: (seeds where
    only a failed, seeds where only b failed, two-sided p), or ``None``
    where no seed is discordant (nothing to test)."""
    if len(a_failed) != len(b_failed):
        raise ValueError(f"paired flags need one per seed in each, not {len(a_failed)} and {len(b_failed)}")
    only_a = sum(1 for x, y in zip(a_failed, b_failed) if x and not y)
    only_b = sum(1 for x, y in zip(a_failed, b_failed) if y and not x)
    if only_a + only_b == 0:
        return None
    return only_a, only_b, float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm-Bonferroni adjusted p-values, in the input order."""
    values = [float(p) for p in p_values]
    if not all(0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie between 0 and 1, not {values}")
    if not values:
        return []
    return [float(p) for p in multipletests(values, method="holm")[1]]


def holm_levels(p_values: Sequence[float], alpha: float = 0.05) -> List[float]:
    """The confidence level of each test's interval, in the input order, that
    agrees with Holm's step-down at ``alpha``: the test with the i-th smallest
    p of m is tested at alpha / (m - i + 1), and once one is not rejected
    every later test keeps that level (Holm stops there).  A two-sided t
    interval at the level returned excludes 0 exactly where Holm's adjusted
    p is below ``alpha``."""
    values = [float(p) for p in p_values]
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, not {alpha}")
    if not all(0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie between 0 and 1, not {values}")
    m = len(values)
    levels = [0.0] * m
    stopped: Optional[float] = None
    for rank, i in enumerate(sorted(range(m), key=lambda j: values[j])):
        level = stopped if stopped is not None else alpha / (m - rank)
        if stopped is None and values[i] >= level:
            stopped = level
        levels[i] = 1.0 - level
    return levels


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Tuple[float, float]:
    """The mean and the half-width of its t interval (0 for one value)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), float(stats.t.ppf((1 + confidence) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def verdict(interval: Tuple[float, float], target: float) -> str:
    """Against ``target``: met when the whole interval lies at or above it,
    missed when it lies below, otherwise not decided by this run."""
    low, high = interval
    return "met" if low >= target else "missed" if high < target else "not decided by this run"
