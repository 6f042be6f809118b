"""The sweet spot the report stars, as the tuner names it: a tune study's own analysis
(what `tune` printed: `TrialResult.sweet_spot`, stored in the study's summary), else
`tune.sweetspot.analyse` (the function the tuner runs) over a config's closed-loop runs.
Seed 000 §3.1's regions are throughput against users in flight; an open-loop run's
achieved req/s grows in step with its output tok/s, so it is no point on that curve."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servetune.report.data import ReportData, RunData, closed_loop
from servetune.status import RunStatus
from servetune.tune.sweetspot import SweetSpot, analyse

MIN_POINTS = 3  # metrics.sweep.sweet_spot's minimum


@dataclass(frozen=True)
class SeriesSweetSpot:
    """The starred sweep: its config, the analysis, and the run behind each load."""

    series: str
    spot: SweetSpot
    runs: dict[float, RunData]  # concurrency -> its closed-loop run (hovers, latencies)
    from_tune: bool  # the tune study's stored analysis, not one made here


def closed_curve(members: Sequence[RunData]) -> dict[float, RunData]:
    """One closed-loop run per concurrency, the first stored (a tune study's search run;
    repetitions left out, as on the latency chart), in load order. A run stopped at its
    decided SLO miss is no point of the curve: its throughput is that of a part of its
    rounds (the tuner leaves it out of its analysis too)."""
    out: dict[float, RunData] = {}
    for r in members:
        users = r.info.concurrency
        if r.info.status == RunStatus.SLO_MISSED:
            continue
        if closed_loop(r.info) and users is not None and users > 0:  # a log axis
            out.setdefault(float(users), r)
    return dict(sorted(out.items()))


def from_json(d: dict[str, Any] | None) -> SweetSpot | None:
    """A stored `SweetSpot.to_json()` back, None when absent or without a knee."""
    if not d or not d.get("loads"):
        return None
    return SweetSpot(
        tuple(float(x) for x in d["loads"]),
        tuple(float(y) for y in d["throughput"]),
        tuple(d["regions"]),
        d.get("knee"),
        str(d.get("reason") or ""),
    )


def analysed(members: Sequence[RunData]) -> SweetSpot | None:
    """The tuner's analysis of a config's closed-loop runs (users, output tok/s)."""
    curve = closed_curve(members)
    if len(curve) < MIN_POINTS:
        return None
    return analyse([(x, r.result.metrics.output_tok_s) for x, r in curve.items()])


def _tuned(data: ReportData) -> SeriesSweetSpot | None:
    """The winner's sweet spot as `tune` printed it, on the series whose closed-loop runs
    it was measured on (the winner's own, or its simulated twin's in a hybrid study)."""
    winner = (data.tune or {}).get("winner") or {}
    spot = from_json(winner.get("sweet_spot"))
    if spot is None:
        return None
    best: tuple[int, str] | None = None
    for name, members in data.series.items():
        tag = members[0].info.tune
        if tag is None or tag.key != winner.get("key"):
            continue
        hits = len(set(closed_curve(members)) & set(spot.loads))
        if hits and (best is None or hits > best[0]):
            best = (hits, name)
    if best is None:
        return None
    name = best[1]
    return SeriesSweetSpot(name, spot, closed_curve(data.series[name]), True)


def report_sweet_spot(data: ReportData) -> SeriesSweetSpot | None:
    """The sweep the report stars: a tune study's winner (its stored analysis), else the
    config with the most closed-loop load points, analysed by the tuner's function."""
    tuned = _tuned(data)
    if tuned is not None:
        return tuned
    curves = {name: closed_curve(m) for name, m in data.series.items()}
    if not curves:
        return None
    name = max(curves, key=lambda n: len(curves[n]))
    spot = analysed(data.series[name])
    return SeriesSweetSpot(name, spot, curves[name], False) if spot is not None else None
