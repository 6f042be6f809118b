"""The concurrency sweet spot (seed 000 §3.1): double the batch from 1, label each point
linear / saturation / over-saturation, and name the knee (the start of saturation).

The region maths is `metrics.sweep` (throughput elasticity between neighbouring
points), shared with the report, so the tuner's knee and the report's starred point
always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servetune.metrics.sweep import classify_regions, sweet_spot


def doubling(limit: int, start: int = 1) -> list[int]:
    """1, 2, 4, ... up to `limit` (inclusive)."""
    out, c = [], max(1, start)
    while c <= limit:
        out.append(c)
        c *= 2
    return out


@dataclass(frozen=True)
class SweetSpot:
    loads: tuple[float, ...]
    throughput: tuple[float, ...]
    regions: tuple[str, ...]
    knee: float | None  # the load at the sweet spot
    reason: str

    def to_json(self) -> dict:
        return {
            "loads": list(self.loads),
            "throughput": list(self.throughput),
            "regions": list(self.regions),
            "knee": self.knee,
            "reason": self.reason,
        }


def analyse(points: Sequence[tuple[float, float]]) -> SweetSpot:
    """Regions and knee of (load, throughput) points (any order; equal loads: last wins)."""
    by_load = dict(sorted(points))
    x = [float(k) for k in by_load]
    y = [float(v) for v in by_load.values()]
    regions = classify_regions(x, y) if x else []
    idx, why = sweet_spot(x, y)
    knee = x[idx] if idx is not None else None
    return SweetSpot(tuple(x), tuple(y), tuple(regions), knee, why)
