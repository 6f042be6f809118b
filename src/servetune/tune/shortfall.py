"""When no config meets the SLO: the config that came closest, how far it missed (every
check as value vs target and their ratio) and which check binds. That is still an answer
(what to run, and what this hardware can promise), so the tuner reports it as a
best-effort recommendation instead of failing. Pure functions over trial results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from servetune.measure import steady
from servetune.measure.result import PointResult
from servetune.status import TrialStatus
from servetune.tune.trial import TrialResult

# Trials with measured points that can be judged against the SLO.
_MEASURED = (TrialStatus.OK, TrialStatus.NO_SLO)


def ratio(check: dict[str, Any]) -> float:
    """value / target of one SLO check (inf when nothing was measured or the target is 0)."""
    v, t = check.get("value"), check.get("target")
    if v is None:
        return math.inf
    if not t:
        return 0.0 if v == 0 else math.inf
    return float(v) / float(t)


@dataclass(frozen=True)
class Shortfall:
    """A config's distance to the SLO at its closest load point."""

    point: PointResult

    @property
    def checks(self) -> list[dict[str, Any]]:
        """Every check of the point with its ratio, worst first."""
        rows = [{**c, "ratio": ratio(c)} for c in self.point.checks]
        return sorted(rows, key=lambda c: -c["ratio"])

    @property
    def binding(self) -> dict[str, Any] | None:
        """The SLO's own check furthest beyond its target, else the worst steady-state
        check (`measure.steady`: its half-window checks repeat the SLO's targets on half
        the requests, a start-up transient can put them furthest out, and "P95 TTFT" is
        what the user's SLO says); None: no check failed."""
        missed = [c for c in self.checks if not c.get("ok")]
        own = [c for c in missed if c.get("metric") != steady.CHECK]
        return (own or missed)[0] if missed else None

    @property
    def worst(self) -> float:
        """The largest value/target ratio of a failed check (what ranks the configs)."""
        b = self.binding
        if b is not None:
            return b["ratio"]
        # no check failed yet the point did not pass: it did not complete (or no check ran)
        return 1.0 if self.point.passed else math.inf

    def to_json(self) -> dict[str, Any]:
        return {
            "load_kind": self.point.load_kind,
            "load": self.point.load,
            "run_id": self.point.run_id,
            "checks": [_jsonable(c) for c in self.checks],
            "binding": _jsonable(self.binding) if self.binding else None,
            "worst_ratio": None if math.isinf(self.worst) else self.worst,
        }


def _jsonable(c: dict[str, Any]) -> dict[str, Any]:
    return {**c, "ratio": None if math.isinf(c["ratio"]) else round(c["ratio"], 4)}


def shortfall(t: TrialResult) -> Shortfall | None:
    """The trial's point closest to the SLO (smallest worst ratio; the lower load on a
    tie); None when nothing was measured."""
    if t.status not in _MEASURED or not t.points:
        return None
    scored = [(Shortfall(p).worst, p.load, Shortfall(p)) for p in t.points]
    return min(scored, key=lambda s: (s[0], s[1]))[2]


def closest(trials: list[TrialResult], n: int = 3) -> list[tuple[TrialResult, Shortfall]]:
    """The `n` measured configs closest to the SLO, closest first: the best effort first."""
    rows = [(t, sf) for t in trials if (sf := shortfall(t)) is not None]
    rows.sort(key=lambda r: (r[1].worst, r[1].point.load))
    return rows[:n]
