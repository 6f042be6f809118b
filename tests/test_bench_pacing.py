"""Honest load: open-loop pacing against the schedule, closed-loop user limits, workers."""

from __future__ import annotations

import numpy as np

from servetune.bench.runner import BenchOptions, run_point
from servetune.metrics.stats import ks_exponential
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer


def spec_of(arrival: dict, count: int, out: int = 8):
    return parse_workload(
        {"count": count, "arrival": arrival, "input_tokens": {"dist": "fixed", "value": 16},
         "output_tokens": {"dist": "fixed", "value": out}}
    )  # fmt: skip


def go(cfg: MockConfig, spec, workers: int = 1):
    with mock_in_thread(cfg) as srv:
        o = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=workers, keep_text=False)
        return run_point(spec, materialize(spec, WordTokenizer()), o), srv


def test_poisson_sends_follow_the_schedule() -> None:
    rate = 150.0
    res, _ = go(MockConfig(ttft_ms=5, itl_ms=1), spec_of({"kind": "poisson", "rate": rate}, 450))
    recs = sorted(res.records, key=lambda r: r.scheduled_ns or 0)
    sends = np.array([r.send_ns for r in recs], dtype=float)
    sched = np.array([r.scheduled_ns for r in recs], dtype=float)
    achieved = (len(sends) - 1) / ((sends.max() - sends.min()) / 1e9)
    offered = (len(sched) - 1) / ((sched.max() - sched.min()) / 1e9)
    assert abs(achieved / offered - 1) < 0.02
    assert (sends - sched).min() >= -20_000  # never early by more than the 20 us slack
    _, p = ks_exponential(np.diff(np.sort(sends)) / 1e9, offered)
    assert p > 0.001
    m = res.metrics
    assert m.send_lag_ms.p50 is not None and m.send_lag_ms.p50 < 5.0
    assert m.completed == 450


def test_closed_loop_never_exceeds_users() -> None:
    res, srv = go(
        MockConfig(ttft_ms=10, itl_ms=1), spec_of({"kind": "closed", "concurrency": 4}, 40)
    )
    assert res.metrics.completed == 40
    assert res.metrics.max_in_flight == 4
    assert srv.stats.max_running == 4


def test_rate_with_cap_queues_visibly() -> None:
    spec = spec_of({"kind": "constant", "rate": 200, "concurrency": 2}, 60)
    res, srv = go(MockConfig(ttft_ms=20, itl_ms=1), spec)
    m = res.metrics
    assert srv.stats.max_running <= 2 and m.max_in_flight <= 2
    assert m.queue_ms.max is not None and m.queue_ms.max > 50  # waited on the client cap
    assert m.send_lag_ms.p99 is not None and m.send_lag_ms.p99 > 50  # and the lag says so
    assert res.client.bottleneck  # flagged: sent less than offered


def test_two_worker_processes() -> None:
    res, srv = go(
        MockConfig(ttft_ms=5, itl_ms=1),
        spec_of({"kind": "closed", "concurrency": 4}, 40),
        workers=2,
    )
    assert res.client.workers == 2
    assert {r.worker for r in res.records} == {0, 1}
    assert sorted(r.index for r in res.records) == list(range(40))
    assert res.metrics.completed == 40 and srv.stats.max_running <= 4
