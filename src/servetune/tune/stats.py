"""Confidence intervals for repeated measurements (finalists are re-run >= 3 times)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95% Student t quantiles t(0.975, df), df = 1..30 (standard tables, e.g.
# NIST/SEMATECH e-Handbook 1.3.6.7.2); above 30 the normal 1.96 is within 2%.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_json(self) -> dict[str, float]:
        return {"n": self.n, "mean": self.mean, "low": self.low, "high": self.high}


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval: mean +/- t(0.975, n-1) * s / sqrt(n)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = sum(values) / n
    if n == 1:
        return Interval(1, m, m, m)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = t975(n - 1) * s / math.sqrt(n)
    return Interval(n, m, m - h, m + h)


def interval_of(ci: dict[str, float]) -> Interval:
    """An `Interval` from its JSON form (a trial's `ci`, which carries other keys too)."""
    return Interval(int(ci["n"]), ci["mean"], ci["low"], ci["high"])


def _var_of_mean(ci: Interval) -> float:
    """s^2 / n, recovered from the interval: half width = t(0.975, n-1) s / sqrt(n)."""
    if ci.n < 2:
        return 0.0
    return (ci.half_width / t975(ci.n - 1)) ** 2


def differ(a: Interval, b: Interval) -> bool:
    """Whether two repeated measurements differ at 95%, two-sided: Welch's unequal-variance
    t-test (Welch 1947), t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b) against
    t(0.975, df) with the Welch-Satterthwaite df. A single value (n = 1) is a point: against
    one, the test is the one-sample t-test (the point outside the other's 95% interval)."""
    va, vb = _var_of_mean(a), _var_of_mean(b)
    se2 = va + vb
    if se2 == 0.0:
        return a.mean != b.mean
    den = sum(v * v / (ci.n - 1) for v, ci in ((va, a), (vb, b)) if ci.n > 1)
    df = se2 * se2 / den
    return abs(a.mean - b.mean) / math.sqrt(se2) > t975(max(int(df), 1))
