"""Summary statistics and the goodness-of-fit test used to check the arrival process."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from servetune.results.schema import Dist


def summarize(values: Sequence[float] | np.ndarray) -> Dist:
    """count/mean/std/min/P50/P90/P95/P99/max. Percentiles: numpy's linear method
    (Hyndman & Fan type 7), the one vLLM's bench_serve and SGLang's bench_serving use."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Dist()
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99]).tolist()
    return Dist(
        count=int(x.size),
        mean=float(x.mean()),
        std=float(x.std()),
        min=float(x.min()),
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        max=float(x.max()),
    )


def ks_exponential(gaps: Sequence[float] | np.ndarray, rate: float) -> tuple[float, float]:
    """One-sample Kolmogorov-Smirnov test of `gaps` against Exponential(rate).

    Returns (D, p). D = sup |F_n(x) - F(x)| with F(x) = 1 - exp(-rate x); p from the
    asymptotic Kolmogorov distribution with Stephens' small-sample correction
    (Stephens 1970: lambda = (sqrt(n) + 0.12 + 0.11/sqrt(n)) D).
    """
    x = np.sort(np.asarray(gaps, dtype=float))
    n = x.size
    if n == 0:
        return 0.0, 1.0
    cdf = 1.0 - np.exp(-rate * x)
    i = np.arange(1, n + 1)
    d = float(max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    # Q_KS(lambda) = 2 sum_{j>=1} (-1)^(j-1) exp(-2 j^2 lambda^2)
    p = 2.0 * sum((-1) ** (j - 1) * math.exp(-2.0 * j * j * lam * lam) for j in range(1, 101))
    return d, float(min(1.0, max(0.0, p)))
