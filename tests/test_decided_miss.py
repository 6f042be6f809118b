"""A point whose SLO miss is already decided stops (`metrics.decided`): the bound is
sound (no run that continues could end below it), a tuner probe against the mock stops
at it with its own status, and a point that could still pass, or a bench run that did not
ask, runs whole."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servetune.bench.runner import BenchOptions, run_point
from servetune.metrics.decided import decided_miss, lower_bound
from servetune.metrics.stats import summarize
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.slo import parse_slo
from servetune.status import RunStatus
from servetune.tune.space import parse_space
from servetune.tune.tuner import Tuner
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer
from sim_as_real import SimAsReal, hybrid_settings, serve_real_with

STATS = ("p50", "p90", "p95", "p99", "mean", "max")
ms = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    seen=st.lists(ms, min_size=1, max_size=30),
    later=st.lists(ms, max_size=30),
    extra=st.integers(min_value=0, max_value=10),
    stat=st.sampled_from(STATS),
)
def test_no_run_ends_below_its_bound(seen, later, extra, stat) -> None:
    """Whatever the requests left do (any latency, or none: a failure, a one-token
    answer), the run's final statistic is at least the bound taken on the way."""
    planned = len(seen) + len(later) + extra  # `extra`: requests that end with no value
    final = getattr(summarize(seen + later), stat)
    assert final >= lower_bound(seen, planned, stat) - 1e-9 * max(1.0, final)


def test_the_bound_is_the_padded_sample_and_reads_the_hog_case() -> None:
    """The main job beside a hog: 6 requests planned, the first at 681 ms TPOT: the P95
    is at least 0.75 x 681 = 511 ms (linear between the two largest of 6), past 94 ms."""
    assert lower_bound([681.0], 6, "p95") == pytest.approx(0.75 * 681.0)
    assert lower_bound([681.0], 6, "p95") == pytest.approx(np.percentile([0] * 5 + [681], 95))
    assert lower_bound([10.0, 20.0], 4, "mean") == pytest.approx(7.5)
    assert lower_bound([10.0, 20.0], 4, "max") == 20.0
    assert lower_bound([], 4, "p95") is None
    slo = parse_slo({"ttft_ms": {"p95": 1059}, "tpot_ms": {"p95": 94}})
    said = decided_miss(slo, 6, 1, {"ttft_ms": [300.0], "tpot_ms": [681.0]}, 0)
    assert said == "P95 TPOT is at least 511 ms > 94 whatever the 5 requests left do", said
    # one slow answer of 16 planned leaves the P95 open: the rest may all be fast
    assert decided_miss(slo, 16, 1, {"ttft_ms": [300.0], "tpot_ms": [150.0]}, 0) is None
    errors = parse_slo({"error_rate": 0.1})
    assert decided_miss(errors, 10, 2, {}, 1) is None  # 1 of 10 may stay the only one
    assert decided_miss(errors, 10, 3, {}, 2) == "2 of at most 10 requests failed (> 10%)"


def _probe(ttft_ms: float, target_ms: float, stop: bool, count: int = 12):
    spec = parse_workload(
        {"count": count, "arrival": {"kind": "closed", "concurrency": 1},
         "input_tokens": {"dist": "fixed", "value": 8},
         "output_tokens": {"dist": "fixed", "value": 4}}
    )  # fmt: skip
    slo = parse_slo({"ttft_ms": {"p95": target_ms}})
    with mock_in_thread(MockConfig(ttft_ms=ttft_ms, itl_ms=1.0)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1,
                            tokenizer=WordTokenizer(), stop_when_missed=stop)  # fmt: skip
        return run_point(spec, materialize(spec, WordTokenizer()), opts, slo)


def test_a_probe_stops_once_its_miss_is_decided_and_says_why() -> None:
    """12 requests one at a time, each ~60 ms to its first token against a P95 of 5 ms:
    the second answer decides it (P95 of 12 >= 0.45 x the second largest + ...), so the
    probe stops long before its 12th, marked `slo_missed`, its checks a miss as measured."""
    res = _probe(ttft_ms=60.0, target_ms=5.0, stop=True)
    assert res.status == RunStatus.SLO_MISSED, res.stop_reason
    assert res.stop_reason is not None and res.stop_reason.startswith(
        "the SLO is already missed: P95 TTFT is at least"
    ), res.stop_reason
    assert 1 <= res.metrics.completed < 6, res.metrics.completed
    assert res.metrics.slo_pass is False
    whole = _probe(ttft_ms=60.0, target_ms=5.0, stop=False)  # bench's default: every request
    assert whole.status == RunStatus.COMPLETED and whole.metrics.completed == 12


def test_a_stopped_points_line_shows_no_throughput() -> None:
    """Its req/s is part of a closed loop's rounds, not its load's throughput: the verbose
    line leaves it out and says how many requests it stopped after."""
    from servetune.measure.result import PointResult
    from servetune.tune.trial import point_line

    stopped = _probe(ttft_ms=60.0, target_ms=5.0, stop=True)
    line = point_line("cfg", "probe", "concurrency", 1.0, PointResult.from_run(
        stopped, "concurrency", 1.0), stopped)  # fmt: skip
    done = stopped.metrics.completed + stopped.metrics.failed
    assert line.startswith("    cfg probe concurrency=1: P95 TTFT "), line
    assert "req/s" not in line and f"[miss ttft_ms.p95; stopped after {done} requests]" in line
    whole = _probe(ttft_ms=5.0, target_ms=5_000.0, stop=True)
    line = point_line("cfg", "probe", "concurrency", 1.0, PointResult.from_run(
        whole, "concurrency", 1.0), whole)  # fmt: skip
    assert " req/s, goodput " in line and line.endswith("[pass]"), line


def test_a_probe_that_can_still_pass_runs_whole() -> None:
    res = _probe(ttft_ms=5.0, target_ms=5_000.0, stop=True)
    assert res.status == RunStatus.COMPLETED and res.metrics.completed == 12
    assert res.metrics.slo_pass is True


def test_the_tuner_stops_early_in_its_capacity_search_only(tmp_path, monkeypatch) -> None:
    """The search's points ask pass or fail and may stop at a decided miss; the
    finalists' repetitions (their goodput is the interval) are measured whole."""
    asked: list[tuple[str, bool]] = []

    class Recording(SimAsReal):
        def probe(self, session, kind, load, *, search=False):  # type: ignore[override]
            asked.append((kind, search))
            return super().probe(session, kind, load, search=search)

    fixture = serve_real_with(monkeypatch, Recording)
    next(fixture)
    try:
        space = parse_space({"engine": "vllm", "knobs": {"max_num_seqs": [2, 8, 32]}})
        out = Tuner(hybrid_settings(tmp_path, "early", space, ttft_p95_ms=400, max_load=32,
                                    max_probes=6, top_k=2, finalists=1,
                                    repeats=2)).run()  # fmt: skip
    finally:
        next(fixture, None)
    reps = sum(len(t.reps) for t in out.ranked)
    assert reps >= 2 and sum(not s for _, s in asked) == reps, asked
    assert sum(s for _, s in asked) == sum(len(t.points) for t in out.ranked), asked


def test_a_stopped_point_is_left_out_of_the_trials_sweet_spot(tmp_path, monkeypatch) -> None:
    """A probe stopped at its decided miss measured part of a closed loop's rounds: its
    output tok/s (here a tenth of the whole run's) is no throughput of its load, and the
    winner's regions and sweet spot are read from the points measured whole."""

    class Stopping(SimAsReal):
        def probe(self, session, kind, load, *, search=False):  # type: ignore[override]
            point, res = super().probe(session, kind, load, search=search)
            if search and not point.passed:
                point.status = RunStatus.SLO_MISSED
                point.output_tok_s /= 10
            return point, res

    fixture = serve_real_with(monkeypatch, Stopping)
    next(fixture)
    try:
        space = parse_space({"engine": "vllm", "knobs": {"max_num_seqs": [8, 32]}})
        out = Tuner(hybrid_settings(tmp_path, "stop", space, ttft_p95_ms=400, max_load=64,
                                    max_probes=8, top_k=1, finalists=0,
                                    repeats=0)).run()  # fmt: skip
    finally:
        next(fixture, None)
    w = out.winner
    assert w is not None and w.sweet_spot is not None
    stopped = {p.load for p in w.points if p.status == RunStatus.SLO_MISSED}
    assert stopped and not stopped & set(w.sweet_spot["loads"]), (stopped, w.sweet_spot)
    assert set(w.sweet_spot["loads"]) == {p.load for p in w.points} - stopped


def test_sim_vs_real_never_compares_at_a_stopped_point() -> None:
    """A verified config that met the SLO nowhere is compared at its highest load measured
    whole, and the floor against the calibration sweep skips a baseline point stopped
    early: both would read part of a loop's rounds as the engine's figures."""
    from servetune.measure.result import PointResult
    from servetune.status import TrialStatus
    from servetune.tune.simvsreal import compared_point, floor_rows
    from servetune.tune.trial import TrialResult
    from synthetic_runs import synthetic_run

    whole = PointResult("concurrency", 1.0, False, req_s=0.4, completed=6)
    stopped = PointResult("concurrency", 4.0, False, req_s=0.1, completed=1,
                          status=RunStatus.SLO_MISSED)  # fmt: skip
    trial = TrialResult("k", {}, "base", "real", TrialStatus.NO_SLO, points=[whole, stopped])
    assert compared_point(trial) is whole
    trial.points = [stopped]  # every point stopped early: still one to compare at
    assert compared_point(trial) is stopped
    run, _ = synthetic_run(8, config=None, seed=3)
    run.workload = {**run.workload, "name": "cal-c4", "arrival": {"kind": "closed",
                                                                  "concurrency": 4}}  # fmt: skip
    assert floor_rows([run], trial) == []
    trial.points = [replace(stopped, status=RunStatus.COMPLETED, passed=True)]
    assert [r.name for r in floor_rows([run], trial)] == ["cal-c4 vs baseline at 4"]
