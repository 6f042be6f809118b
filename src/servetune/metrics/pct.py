"""Percentiles as people read them: every one with the number of requests it rests on,
and a tail percentile that the sample is too small to estimate flagged as the maximum.

The rule: the q-quantile of a sample means something only when the sample is expected to
hold at least one value above it, n (1 - q) >= 1, so P90 needs n >= 10, P95 n >= 20 and
P99 n >= 100. Below that the estimate is the largest value (or, with numpy's linear
method, Hyndman & Fan 1996 type 7, an interpolation between the two largest): a "P99" of
16 requests is their maximum. (The same count rule as Gil Tene's "How NOT to measure
latency": a percentile needs more samples than 1 / (1 - q).)

One helper for the report and every CLI table (`runs show`, `bench`, `tune`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# The quantile each percentile name stands for.
QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}
MAX_FLAG = "~max"  # said after n when the percentile is the sample's maximum


def min_samples(stat: str) -> int:
    """Requests a percentile needs to be more than the maximum: ceil(1 / (1 - q))."""
    q = QUANTILES.get(stat.lower())
    return 1 if q is None else math.ceil(round(1.0 / (1.0 - q), 9))


def is_max_only(stat: str, n: int | None) -> bool:
    """True when `n` requests are too few for `stat` (it is their maximum)."""
    return n is not None and 0 < n < min_samples(stat)


def sample_note(stat: str, n: int | None) -> str:
    """`n=16`, or `n=16, ~max` when the percentile is the maximum; `n=?` when unknown."""
    if n is None:
        return "n=?"
    return f"n={n:,}, {MAX_FLAG}" if is_max_only(stat, n) else f"n={n:,}"


def fmt_ms(v: float | None) -> str:
    """Milliseconds to 3 significant figures (thousands with separators); None as '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def pct_text(stat: str, value: float | None, n: int | None, unit: str = " ms") -> str:
    """`P95 812 ms (n=16, ~max)`: one percentile with its sample size; `P95 -` when none."""
    if value is None:
        return f"{stat.upper()} -"
    return f"{stat.upper()} {fmt_ms(value)}{unit} ({sample_note(stat, n)})"


def dist_text(
    dist: Mapping[str, Any] | Any | None,
    stats: tuple[str, ...] = ("p50", "p95", "p99"),
    unit: str = "",
    n: int | None = None,
) -> str:
    """`12 / 40 / 80 (n=120)` for a Dist (or its dict): the values, one n (its count, or
    `n` when the dict has none), and the percentiles that are only the maximum named
    (`n=16; P95, P99 ~max`)."""
    d = dist if isinstance(dist, Mapping) else (dist.model_dump() if dist is not None else {})
    if not d or all(d.get(s) is None for s in stats):
        return "-"
    n = d.get("count") or n
    values = " / ".join(fmt_ms(d.get(s)) for s in stats) + unit
    flagged = [s.upper() for s in stats if is_max_only(s, n)]
    tail = f"; {', '.join(flagged)} {MAX_FLAG}" if flagged else ""
    return f"{values} (n={'?' if n is None else f'{n:,}'}{tail})"


def pct_cell(stat: str, value: float | None, n: int | None, digits: str = "") -> str:
    """A table cell beside an `n` column: `812`, or `812 ~max` when the sample is too
    small for `stat`. `digits` is a format spec (`.1f`); default `fmt_ms`."""
    if value is None:
        return "-"
    text = format(value, digits) if digits else fmt_ms(value)
    return f"{text} {MAX_FLAG}" if is_max_only(stat, n) else text


def upper_bound_rank(n: int, q: float, confidence: float) -> int:
    """The rank k (1-based) of the order statistic that bounds the q-quantile from above
    with `confidence`, distribution-free: X_(k) >= the true quantile whenever fewer than
    k of the n values fall below it, which has probability P(Binomial(n, q) <= k - 1)
    (the order-statistic interval, e.g. Hahn & Meeker, "Statistical Intervals", 1991,
    ch. 5). The smallest such k; n when even the maximum is short of `confidence` (then
    the bound holds with 1 - q^n: the maximum of 30 bounds P95 with 79%)."""
    if n <= 0:
        return 0
    if not 0.0 < q < 1.0:
        return n
    log_q, log_p = math.log(q), math.log1p(-q)
    cdf = 0.0
    for j in range(n + 1):  # P(Bin(n, q) <= j), summed in log space to stay finite
        cdf += math.exp(
            math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
            + j * log_q + (n - j) * log_p
        )  # fmt: skip
        if cdf >= confidence:
            return min(j + 1, n)
    return n
