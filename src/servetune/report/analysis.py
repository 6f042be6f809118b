"""The ECDF the report's percentile charts draw, thinned for plotting. The sweep maths
(regions, sweet spot, Pareto front) is `metrics.sweep`, shared with the tuner; the sweet
spot the report stars is the tuner's own analysis (`report.sweetspot`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ecdf(values: Sequence[float], max_points: int = 400) -> tuple[list[float], list[float]]:
    """(sorted values, cumulative fraction), thinned to at most `max_points` while keeping
    the extreme tail (the last 1% is kept whole) so P99 stays readable."""
    v = np.sort(np.asarray(values, dtype=float))
    n = v.size
    if n == 0:
        return [], []
    p = np.arange(1, n + 1) / n
    if n > max_points:
        tail = max(1, n // 100)
        head = np.linspace(0, n - tail - 1, max_points - min(tail, max_points // 2)).astype(int)
        keep = np.unique(np.concatenate((head, np.arange(n - tail, n))))
        v, p = v[keep], p[keep]
    return v.tolist(), p.tolist()
