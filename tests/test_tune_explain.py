"""The winner's explanation names the binding SLO in words that read after "binding SLO"."""

from __future__ import annotations

from servetune.measure.result import PointResult
from servetune.tune.explain import binding_slo
from servetune.tune.trial import TrialResult, TrialStatus


def _trial(points: list[PointResult], capacity: float | None) -> TrialResult:
    return TrialResult(
        key="k", config={}, label="baseline", backend="real", status=TrialStatus.OK,
        points=points, capacity=capacity,
    )  # fmt: skip


def test_every_load_passed_says_the_capacity_is_a_lower_bound() -> None:
    t = _trial([PointResult("concurrency", 1.0, True, req_s=0.3)], capacity=1.0)
    assert "binding SLO " + binding_slo(t) == (
        "binding SLO not reached: every load tried met the SLO (capacity is a lower bound)"
    )


def test_the_point_above_the_capacity_names_its_missed_check() -> None:
    miss = {"metric": "tpot_ms", "stat": "p95", "target": 598.0, "value": 1200.0, "ok": False}
    points = [
        PointResult("concurrency", 1.0, True, req_s=0.3, completed=6),
        PointResult("concurrency", 2.0, False, req_s=0.2, completed=6, checks=[miss]),
    ]
    line = binding_slo(_trial(points, capacity=1.0))
    assert line == "at 2 users: P95 TPOT 1,200 ms > 598 (n=6, ~max)", line
