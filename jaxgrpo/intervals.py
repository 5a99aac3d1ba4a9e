"""95% confidence intervals for the figures jaxgrpo reports: accuracy over questions, pass@k over
questions, a metric's mean over seeds. numpy only (no scipy).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

Z_95 = 1.959963984540054  # the standard normal's 0.975 quantile

# Student's t 0.975 quantiles for 1..30 degrees of freedom; beyond 30 the normal's is within 4%.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
          2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
          2.045, 2.042)


class Interval(NamedTuple):
    """An estimate and its 95% confidence interval [low, high]."""

    value: float
    low: float
    high: float

    def format(self, digits: int = 3) -> str:
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> Interval:
    """Wilson score interval of a binomial proportion (Wilson, 1927): unlike the normal one it stays in
    [0, 1] and is not empty at 0 or n successes.

        center = (p + z^2 / 2n) / (1 + z^2 / n),  half = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)
    """
    if trials <= 0:
        raise ValueError(f"a proportion needs at least one trial, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denominator = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return Interval(p, max(0.0, center - half), min(1.0, center + half))


def t_quantile_975(df: int) -> float:
    """Student's t 0.975 quantile (a two-sided 95% interval) for `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"a t-interval needs at least 2 values (1 degree of freedom), got df={df}")
    return _T_975[df - 1] if df <= len(_T_975) else Z_95


def t_interval(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval of independent values (e.g. one per seed): mean +- t(n-1) s / sqrt(n).

    A single value has no spread to estimate: its interval is (nan, nan).
    """
    x = np.asarray(values, np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, float("nan"), float("nan"))
    half = t_quantile_975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half)


def bootstrap_interval(per_question: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> Interval:
    """Mean over questions and its 95% percentile-bootstrap interval, resampling questions (Efron, 1979).

    Used for pass@k, whose per-question values are not 0/1 and whose questions are the unit of sampling.
    """
    x = np.asarray(per_question, np.float64)
    if x.size == 0:
        raise ValueError("a bootstrap interval needs at least one question")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return Interval(float(x.mean()), float(low), float(high))
