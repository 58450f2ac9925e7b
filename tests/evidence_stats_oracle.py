"""Hand-written statistics, kept as the tests' independent cross-check of
``benchmarks/evidence/stats.py`` (which uses scipy.stats and statsmodels):
the t quantile from the incomplete beta function, the exact sign test, the
Wilcoxon signed-rank test (exact by counting sign assignments, or normal with
the tie correction), a percentile bootstrap and Holm's step-down correction.

Only the standard library and numpy, so that it shares no code with what it
checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

# Differences are rounded to this many decimals before the rank and sign tests,
# so that float noise from subtracting two errors neither splits a tie nor
# turns a zero difference into a tiny positive or negative one.
TIE_DECIMALS = 9

# Up to this many non-zero differences the Wilcoxon p-value is exact; above
# it, the normal approximation with the tie correction.
WILCOXON_EXACT_MAX = 20


# --- Student's t -------------------------------------------------------------------
def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 1000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            step = c * d
            fraction *= step
        if abs(step - 1.0) < eps:
            break
    return fraction


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_upper_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom.

    Bisection on the upper tail (computed from the incomplete beta function),
    to well below 1e-6; symmetric about 0."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"the quantile's probability must lie strictly between 0 and 1, not {p}")
    if int(df) != df or df < 1:
        raise ValueError(f"the degrees of freedom must be a positive integer, not {df}")
    tail = min(p, 1.0 - p)  # the quantile's tail: 1 - p is exact for p >= 0.5, p itself below
    low, high = 0.0, 1.0
    while t_upper_tail(high, df) > tail:  # bracket the quantile
        low, high = high, 2.0 * high
    while high - low > 1e-12 * max(1.0, high):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if t_upper_tail(middle, df) > tail else (low, middle)
    magnitude = 0.5 * (low + high)
    return magnitude if p >= 0.5 else -magnitude


# --- input checks ------------------------------------------------------------------
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


def _check_bootstrap(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"the confidence must lie strictly between 0 and 1, not {confidence}")
    if resamples < 1:
        raise ValueError(f"the bootstrap needs at least 1 resample, not {resamples}")


def _resampled_seeds(n: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` rows of ``n`` seed indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentile_interval(values: np.ndarray, confidence: float) -> Tuple[float, float]:
    low, high = np.quantile(values, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(low), float(high)


# --- sign and signed-rank tests ------------------------------------------------------
def _nonzero_differences(differences: np.ndarray) -> np.ndarray:
    rounded = np.round(differences, TIE_DECIMALS)
    return rounded[rounded != 0.0]


def sign_test_p(differences: np.ndarray) -> float:
    """Exact two-sided sign test: zeros dropped, the count of positive
    differences against Binomial(n, 1/2)."""
    nonzero = _nonzero_differences(differences)
    n = len(nonzero)
    if n == 0:
        return 1.0
    positives = int((nonzero > 0).sum())
    smaller = min(positives, n - positives)
    tail = sum(math.comb(n, i) for i in range(smaller + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def _average_ranks(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n of ``values`` (ties get their average rank) and the size of
    each group of ties."""
    _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)
    return (last_rank - (counts - 1) / 2.0)[group.ravel()], counts


def _exact_signed_rank_p(ranks: np.ndarray, w_plus: float) -> float:
    """P-value of W+ over all 2^n equally likely sign assignments of the ranks.

    The assignments are counted, not listed: doubled ranks are integers (average
    ranks are whole or halves), and the count of assignments reaching each sum
    is built one rank at a time (the rank's sign is + or -)."""
    doubled = np.rint(2.0 * ranks).astype(np.int64)
    counts = np.zeros(int(doubled.sum()) + 1, dtype=np.int64)
    counts[0] = 1
    for rank in doubled:
        with_rank = np.zeros_like(counts)
        with_rank[rank:] = counts[:-rank]
        counts = counts + with_rank
    observed = int(round(2.0 * w_plus))
    total = float(counts.sum())  # 2^n
    at_most, at_least = counts[:observed + 1].sum() / total, counts[observed:].sum() / total
    return float(min(1.0, 2.0 * min(at_most, at_least)))


def _normal_signed_rank_p(n: int, tie_counts: np.ndarray, w_plus: float) -> float:
    """Normal approximation of the two-sided p-value of W+, with the variance
    corrected for ties and no continuity correction."""
    mean = n * (n + 1) / 4.0
    variance = n * (n + 1) * (2 * n + 1) / 24.0 - float((tie_counts ** 3 - tie_counts).sum()) / 48.0
    z = (w_plus - mean) / math.sqrt(variance)
    return min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))


def wilcoxon_p(differences: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value: zeros dropped (Wilcoxon's
    method), average ranks of |d| for ties, W+ = the sum of the positive
    differences' ranks; exact up to ``WILCOXON_EXACT_MAX`` non-zero differences."""
    nonzero = _nonzero_differences(differences)
    n = len(nonzero)
    if n == 0:
        return 1.0
    ranks, tie_counts = _average_ranks(np.abs(nonzero))
    w_plus = float(ranks[nonzero > 0].sum())
    if n <= WILCOXON_EXACT_MAX:
        return _exact_signed_rank_p(ranks, w_plus)
    return _normal_signed_rank_p(n, tie_counts, w_plus)


# --- paired difference -------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """Method a against method b over n paired seeds (differences a - b)."""

    n: int
    mean: float
    sd: float  # sample standard deviation of the differences (ddof=1)
    t_interval: Tuple[float, float]
    bootstrap_interval: Tuple[float, float]
    sign_p: float
    wilcoxon_p: float
    p: float  # the p-value the report uses: Wilcoxon's


def paired_difference(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                      resamples: int = 10000, seed: int = 0) -> Difference:
    """Compare ``a`` and ``b``, one value per seed, paired by index.

    The t interval is mean +- t_{(1+confidence)/2, n-1} * sd / sqrt(n); the
    bootstrap interval is the percentile interval of the mean difference over
    ``resamples`` resamplings of the pairs, drawn by numpy's Generator seeded
    with ``seed`` (the same inputs give the same interval)."""
    _check_bootstrap(confidence, resamples)
    a_values, b_values = _paired_arrays(a, b)
    differences = a_values - b_values
    n = len(differences)
    mean, sd = float(differences.mean()), float(differences.std(ddof=1))
    half_width = t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    resampled_means = differences[_resampled_seeds(n, resamples, seed)].mean(axis=1)
    wilcoxon = wilcoxon_p(differences)
    return Difference(n=n, mean=mean, sd=sd, t_interval=(mean - half_width, mean + half_width),
                      bootstrap_interval=_percentile_interval(resampled_means, confidence),
                      sign_p=sign_test_p(differences), wilcoxon_p=wilcoxon, p=wilcoxon)


def verdict(interval: Tuple[float, float], target: float) -> str:
    """Against ``target``: met when the whole interval lies at or above it,
    missed when it lies below, otherwise not decided by this run."""
    low, high = interval
    return "met" if low >= target else "missed" if high < target else "not decided by this run"


# --- multiple comparisons ------------------------------------------------------------
def holm(p_values: Sequence[float]) -> List[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    Step-down: the i-th smallest of m p-values is multiplied by m - i + 1,
    each adjusted value is at least the one before it, and none exceeds 1."""
    values = [float(p) for p in p_values]
    if not all(0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie between 0 and 1, not {values}")
    m = len(values)
    adjusted = [0.0] * m
    running_max = 0.0
    for step, index in enumerate(sorted(range(m), key=values.__getitem__)):
        running_max = max(running_max, min(1.0, (m - step) * values[index]))
        adjusted[index] = running_max
    return adjusted


# --- recovery ratio ------------------------------------------------------------------
@dataclass(frozen=True)
class Ratio:
    """How much of ASGD's loss against SGD delay compensation recovers."""

    value: float
    interval: Tuple[float, float]
    defined: bool  # False when ASGD is not worse than SGD on average


def recovery_ratio(asgd: Sequence[float], dc: Sequence[float], sgd: Sequence[float], *,
                   confidence: float = 0.95, resamples: int = 10000, seed: int = 0) -> Ratio:
    """R = (mean(asgd) - mean(dc)) / (mean(asgd) - mean(sgd)), seeds paired by index.

    R = 1: the delay-compensated method is as good as SGD; 0: no better than
    ASGD. R is undefined when ASGD is not worse than SGD (the denominator is
    <= 0): then ``value`` and the interval are nan and ``defined`` is False.

    The interval is the percentile bootstrap over resamplings of the seed
    indices, the three methods resampled together. Resamples whose denominator
    is exactly zero are dropped; those with a negative one are kept, since
    they are part of the uncertainty about the ratio (they widen the interval)."""
    _check_bootstrap(confidence, resamples)
    asgd_values, dc_values, sgd_values = _paired_arrays(asgd, dc, sgd)
    recovered, lost = asgd_values - dc_values, asgd_values - sgd_values  # per seed
    if lost.mean() <= 0.0:
        return Ratio(value=math.nan, interval=(math.nan, math.nan), defined=False)
    indices = _resampled_seeds(len(lost), resamples, seed)
    resampled_recovered, resampled_lost = recovered[indices].mean(axis=1), lost[indices].mean(axis=1)
    kept = resampled_lost != 0.0
    interval = (_percentile_interval(resampled_recovered[kept] / resampled_lost[kept], confidence)
                if kept.any() else (math.nan, math.nan))
    return Ratio(value=float(recovered.mean() / lost.mean()), interval=interval, defined=True)


# --- words ---------------------------------------------------------------------------
def classify(interval: Tuple[float, float], adjusted_p: float, *, alpha: float = 0.05) -> str:
    """"above 0" or "below 0" when the interval excludes 0 on that side and the
    adjusted p-value is below ``alpha``; "within noise" otherwise."""
    low, high = interval
    if adjusted_p < alpha and low > 0:
        return "above 0"
    if adjusted_p < alpha and high < 0:
        return "below 0"
    return "within noise"
