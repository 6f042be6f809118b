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
    """Region of each point of a sweep sorted by x. Regions move forward (a noisy step back
    up does not make the curve linear again), with one way back: out of over-saturation
    into saturation when throughput then grows past its best so far at a saturation rate
    or more (`_grows_past_best`). Over-saturation is throughput that has stopped growing;
    a flat step that more load then climbs past (llama.cpp with 4 slots beside a busy
    core: 1.43, 1.58, 2.18, 2.23 req/s at 1, 2, 4, 8 users) was a plateau, not the
    ceiling, and calling the +38% point over-saturated put the sweet spot at 1 user."""
    order = [LINEAR, SATURATION, OVER]
    regions: list[str] = []
    current = 0
    for i, e in enumerate(elasticities(x, y)):
        if e is not None:
            step = 0 if e >= LINEAR_MIN else 1 if e >= FLAT_MAX else 2
            if current == 2 and step < 2 and _grows_past_best(x, y, i):
                current = 1
            else:
                current = max(current, step)
        regions.append(order[current])
    return regions


def _grows_past_best(x: Sequence[float], y: Sequence[float], i: int) -> bool:
    """Point i's throughput is above every earlier point's, and its elasticity against the
    best of them is a saturation rate or more (not a noisy tick above a flat line)."""
    best = max(range(i), key=lambda j: y[j])
    if y[i] <= y[best] or not y[best] or not x[best] or x[i] == x[best]:
        return False
    return ((y[i] - y[best]) / y[best]) / ((x[i] - x[best]) / x[best]) >= FLAT_MAX


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
