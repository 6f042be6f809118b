"""An SLO miss that a run has already decided, whatever its remaining requests do.

Why: a tuner probe is a pass/fail question. Beside a one-core hog the main job's baseline
(llama.cpp at its default threads) spent 79.5 s of a 120 s budget on one point of 6
requests, each ~10 s, to find a P95 TPOT of 681 ms against a 94 ms target, which its first
answer had settled; the config the budget then skipped (threads=2) went unmeasured.

The bound: a run sends at most `planned` requests. The requests still to come can do no
better than zero latency, so the run's final statistic is at least the statistic of the
values seen so far padded with zeros up to `planned` (`lower_bound`). For numpy's linear
percentile (`metrics.stats.summarize`, Hyndman & Fan type 7) dropping a sample's smallest
value never lowers a percentile (its position moves up by 1 - q >= 0), so a run that
ends with fewer values (errors, a request without a second token) is bounded too; the
mean's bound is the sum seen over `planned`; the maximum is its own bound. When a bound is
above its target, the check is missed: `decided_miss` says which, in one line.

Only what the records alone decide is judged: TTFT, TPOT and E2E statistics and the
error rate. ITL (pooled per chunk) and the KV-cache peak are left to the full run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servetune.metrics.pct import QUANTILES, fmt_ms
from servetune.slo import SLO

_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}


def lower_bound(values: Sequence[float], planned: int, stat: str) -> float | None:
    """The least `stat` (p50..p99, mean, max) a run can end with, given the `values` seen
    so far out of at most `planned`: the others at zero. None: nothing seen."""
    if not values:
        return None
    x = np.asarray(values, dtype=float)
    if stat == "max":
        return float(x.max())
    pad = max(planned, len(x))
    if stat == "mean":
        return float(x.sum() / pad)
    q = QUANTILES[stat]
    padded = np.concatenate([np.zeros(pad - len(x)), x])
    return float(np.percentile(padded, q * 100.0))


def decided_miss(
    slo: SLO,
    planned: int,
    seen: int,
    latencies: dict[str, Sequence[float]],
    failed: int,
) -> str | None:
    """The first SLO check the run can no longer meet, as one line, or None. `seen`:
    requests ended so far; `latencies`: their values per metric (`ttft_ms`, `tpot_ms`,
    `e2e_ms`, ms, of those that succeeded); `failed`: how many of them failed."""
    left = max(planned - seen, 0)
    for metric, name in _NAMES.items():
        targets = getattr(slo, metric)
        if targets is None:
            continue
        for stat, target in targets.items():
            low = lower_bound(latencies.get(metric, ()), planned, stat)
            if low is not None and low > target:
                return (
                    f"{stat.upper()} {name} is at least {fmt_ms(low)} ms > {target:,.0f} "
                    f"whatever the {left} requests left do"
                )
    if slo.error_rate is not None and planned > 0 and failed / planned > slo.error_rate:
        return f"{failed} of at most {planned} requests failed (> {slo.error_rate:.0%})"
    return None
