"""Pure maths over a load sweep: seed 000 §3.1's three regions (linear, saturation,
over-saturation), the sweet spot at the start of saturation, and the Pareto front across
configs. The tuner's knee and the report's starred point both come from here, so they
always agree."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LINEAR = "linear"
SATURATION = "saturation"
OVER = "over-saturation"

# Elasticity of throughput to load between neighbouring sweep points:
# (dy / y) / (dx / x). ~1: throughput grows in step with the batch (linear region);
# between the two limits: still growing, but slower (saturation); below FLAT: throughput
# is flat or falling while load keeps rising (over-saturation). Seed 000 §3.1.
LINEAR_MIN = 0.7
FLAT_MAX = 0.15


def elasticities(x: Sequence[float], y: Sequence[float]) -> list[float | None]:
    """e[i] for the step from point i-1 to i (e[0] is None)."""
    out: list[float | None] = [None]
    for i in range(1, len(x)):
        dx = (x[i] - x[i - 1]) / x[i - 1] if x[i - 1] else None
        dy = (y[i] - y[i - 1]) / y[i - 1] if y[i - 1] else None
        out.append(dy / dx if dx and dy is not None else None)
    return out


def classify_regions(x: Sequence[float], y: Sequence[float]) -> list[str]:
    """Region of each point of a sweep sorted by x. Regions only move forward (a noisy
    step back up does not make the curve linear again)."""
    order = [LINEAR, SATURATION, OVER]
    regions: list[str] = []
    current = 0
    for e in elasticities(x, y):
        if e is not None:
            step = 0 if e >= LINEAR_MIN else 1 if e >= FLAT_MAX else 2
            current = max(current, step)
        regions.append(order[current])
    return regions


def sweet_spot(x: Sequence[float], y: Sequence[float]) -> tuple[int | None, str]:
    """Index of the sweet spot — the start of the saturation region, seed 000 §3.1 — and
    why. Without a saturated point, the last linear point before over-saturation."""
    if len(x) < 3:
        return None, "needs at least 3 load points"
    regions = classify_regions(x, y)
    if SATURATION in regions:
        return regions.index(SATURATION), "start of the saturation region"
    if OVER in regions:
        return regions.index(OVER) - 1, "last point before over-saturation"
    return len(x) - 1, "still linear at the highest load: extend the sweep"


def pareto_front(x: Sequence[float], y: Sequence[float]) -> list[int]:
    """Indices of points no other point beats on both x and y (both maximised), sorted
    by x."""
    idx = sorted(range(len(x)), key=lambda i: (-x[i], -y[i]))
    front, best_y = [], -np.inf
    for i in idx:
        if y[i] > best_y:
            front.append(i)
            best_y = y[i]
    return sorted(front, key=lambda i: x[i])
