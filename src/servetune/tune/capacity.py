"""Capacity under the SLO: the highest load whose percentiles and error rate stay within
target, found by galloping (doubling) then bisection on a fixed lattice of loads.

The lattice makes the answer independent of where the search starts: for a config whose
pass/fail is monotone in load, every start gives the same capacity (the largest lattice
point that passes). That is what lets a warm start (the best capacity so far) save probes
without changing any trial's score, and lets a resumed study reuse stored points exactly.
A warm start that fails only says the config is weaker than the best so far: the search
then restarts where a cold one starts (`cold_index`), so a small probe budget spent
halving down from a high start cannot call a config with a capacity `no_slo`.
Concurrency doubles from 1 (seed 000 §3.1: "从batch1开始逐步翻倍"), so the gallop's points
are also the sweet-spot sweep. Pure: `measure` does the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

LoadKind = Literal["concurrency", "rate"]


@dataclass(frozen=True)
class Lattice:
    """Loads the search may visit. Concurrency: 1, 2, 3, ... max. Rate: start x 2^(i/k)."""

    kind: LoadKind
    max_index: int
    start: float = 1.0
    steps_per_doubling: int = 4

    def load(self, i: int) -> float:
        if self.kind == "concurrency":
            return float(i + 1)
        return round(self.start * 2.0 ** (i / self.steps_per_doubling), 6)

    def up(self, i: int) -> int:
        """The index of twice the load."""
        return 2 * (i + 1) - 1 if self.kind == "concurrency" else i + self.steps_per_doubling

    def down(self, i: int) -> int:
        return (i + 1) // 2 - 1 if self.kind == "concurrency" else i - self.steps_per_doubling

    def index_of(self, load: float) -> int:
        """The lattice index at or just below `load` (clamped)."""
        if self.kind == "concurrency":
            i = int(load) - 1
        else:
            i = math.floor(
                math.log2(max(load, 1e-12) / self.start) * self.steps_per_doubling + 1e-9
            )
        return max(0, min(self.max_index, i))


def concurrency_lattice(max_concurrency: int) -> Lattice:
    return Lattice("concurrency", max(0, max_concurrency - 1))


def rate_lattice(start: float, max_rate: float, steps_per_doubling: int = 4) -> Lattice:
    k = steps_per_doubling
    top = math.floor(math.log2(max_rate / start) * k + 1e-9)
    return Lattice("rate", max(0, top), start, k)


@dataclass(frozen=True)
class Probe:
    """One measured load point, reduced to what the search needs."""

    load: float
    passed: bool  # SLO percentiles and error rate all within target
    throughput: float  # output tok/s (for the sweet-spot regions)
    score: float | None  # the objective at this point (None when it did not pass)


@dataclass
class Capacity:
    probes: list[Probe] = field(default_factory=list)  # in the order measured
    capacity: float | None = None  # highest passing load
    first_fail: float | None = None  # lowest failing load above it
    reason: str = ""

    @property
    def best(self) -> Probe | None:
        """The passing probe with the best score (ties: the higher load)."""
        ok = [p for p in self.probes if p.passed and p.score is not None]
        return max(ok, key=lambda p: (p.score, p.load)) if ok else None

    def sorted_probes(self) -> list[Probe]:
        return sorted(self.probes, key=lambda p: p.load)


def search_capacity(
    measure: Callable[[float], Probe],
    lattice: Lattice,
    *,
    start_index: int = 0,
    max_probes: int = 12,
    bisect: bool = True,
    extra_doublings: int = 0,
    cold_index: int | None = None,
) -> Capacity:
    """Gallop from `start_index` (doubling up while the SLO holds, halving down while it
    does not) to bracket the capacity, then bisect the bracket to adjacent lattice points.
    `extra_doublings` keeps doubling past the first failure, so the sweet-spot analysis
    sees the over-saturation region. A failing `start_index` above `cold_index` (a warm
    start) restarts the gallop at `cold_index`, below the failure. Stops early after
    `max_probes` measurements."""
    seen: dict[int, Probe] = {}
    out = Capacity()

    def at(i: int) -> Probe | None:
        if i in seen:
            return seen[i]
        if len(seen) >= max_probes:
            return None
        p = measure(lattice.load(i))
        seen[i] = p
        out.probes.append(p)
        return p

    i = max(0, min(lattice.max_index, start_index))
    first = at(i)
    assert first is not None
    ceiling = lattice.max_index  # the gallop up stops at a load known to fail
    if not first.passed and cold_index is not None and 0 <= cold_index < i and max_probes > 1:
        ceiling, i = i, cold_index
        first = at(i)
        assert first is not None
    lo: int | None = None
    hi: int | None = None
    if first.passed:
        lo = i
        while lo < ceiling:
            j = min(lattice.up(lo), ceiling)
            p = at(j)
            if p is None:
                break
            if p.passed:
                lo = j
            else:
                hi = j
                break
        if hi is None and ceiling in seen and not seen[ceiling].passed:
            hi = ceiling  # the probe budget stopped the gallop below the failed warm start
    else:
        hi = i
        while hi > 0:
            j = max(lattice.down(hi), 0)
            p = at(j)
            if p is None:
                break
            if p.passed:
                lo = j
                break
            hi = j
    if hi is not None:
        top = hi
        for _ in range(extra_doublings):
            j = min(lattice.up(top), lattice.max_index)
            if j == top or at(j) is None:
                break
            top = j
    while bisect and lo is not None and hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        p = at(mid)
        if p is None:
            break
        if p.passed:
            lo = mid
        else:
            hi = mid
    if lo is None:
        out.reason = f"the SLO is missed already at the lowest load ({lattice.load(0):g})"
    else:
        out.capacity = lattice.load(lo)
        if hi is None:
            out.reason = (
                "the SLO held at the highest load tried"
                if lo == lattice.max_index
                else "stopped by the probe budget"
            )
        else:
            out.first_fail = lattice.load(hi)
            out.reason = (
                "bracketed to adjacent loads"
                if hi - lo <= 1
                else f"bracketed [{lattice.load(lo):g}, {lattice.load(hi):g}] (probe budget)"
            )
    return out
