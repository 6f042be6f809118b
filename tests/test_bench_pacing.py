"""Honest load: open-loop pacing against the schedule, closed-loop user limits, workers."""

from __future__ import annotations

import numpy as np
import pytest

from servetune.bench.runner import BenchOptions, run_point
from servetune.metrics import cap_note
from servetune.metrics.stats import ks_exponential
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer


def spec_of(arrival: dict, count: int, out: int = 8):
    return parse_workload(
        {"count": count, "seed": 11, "arrival": arrival,
         "input_tokens": {"dist": "fixed", "value": 16},
         "output_tokens": {"dist": "fixed", "value": out}}
    )  # fmt: skip


def go(cfg: MockConfig, spec, workers: int = 1):
    with mock_in_thread(cfg) as srv:
        o = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=workers, keep_text=False)
        return run_point(spec, materialize(spec, WordTokenizer()), o), srv


def test_poisson_schedule_passes_ks() -> None:
    """The generator itself, deterministic given the seed: exponential gaps at the rate."""
    reqs = materialize(spec_of({"kind": "poisson", "rate": 150.0}, 450), WordTokenizer())
    arrivals = np.array([r.arrival_s for r in reqs], dtype=float)
    _, p = ks_exponential(np.diff(arrivals), 150.0)
    assert p > 0.001


def pacing_failures(res) -> tuple[list[str], str]:
    """Judge one run's sends against the schedule of the requests it actually sent."""
    recs = sorted(res.records, key=lambda r: r.scheduled_ns or 0)
    sends = np.array([r.send_ns for r in recs], dtype=float)
    sched = np.array([r.scheduled_ns for r in recs], dtype=float)
    achieved = (len(sends) - 1) / ((sends.max() - sends.min()) / 1e9)
    offered = (len(sched) - 1) / ((sched.max() - sched.min()) / 1e9)
    _, p = ks_exponential(np.diff(np.sort(sends)) / 1e9, offered)
    lag_ms = (sends - sched) / 1e6
    failures = []
    if abs(achieved / offered - 1) >= 0.02:
        failures.append(f"achieved {achieved:.2f} vs offered {offered:.2f} req/s")
    if lag_ms.min() < -0.02:
        failures.append(f"a send {-lag_ms.min():.3f} ms early")  # 20 us slack at most
    if p <= 0.001:
        failures.append(f"send gaps fail KS (p={p:.2g})")
    if float(np.median(lag_ms)) >= 5.0:
        failures.append(f"send lag P50 {np.median(lag_ms):.2f} ms")
    summary = (
        f"achieved/offered {achieved / offered:.4f}, KS p {p:.3g}, send lag P50/P99/max "
        f"{np.median(lag_ms):.2f}/{np.percentile(lag_ms, 99):.2f}/{lag_ms.max():.2f} ms"
    )
    return failures, summary


@pytest.mark.paced
def test_poisson_sends_follow_the_schedule() -> None:
    """Achieved within 2% of offered, never early, KS on the sends, small lag. A loaded
    machine can stall the whole process for tens of ms, and the niced suite beside the
    engine tests for most of a second (the send lag shows it: P99 0.75-0.94 s in one CI
    run): then the measurement is taken again, up to three tries, all reported if each
    fails."""
    tries = []
    for _ in range(3):
        # 60 req/s: mean gap 17 ms, so the few ms a busy host's scheduler adds to a send
        # cannot reshape the gap distribution (at 150 req/s it did, on a 2-core host
        # running other work: KS p ~1e-4 with a send lag P99 of 8 ms).
        spec = spec_of({"kind": "poisson", "rate": 60.0}, 300)
        res, _ = go(MockConfig(ttft_ms=5, itl_ms=1), spec)
        assert res.metrics.completed == 300
        failures, summary = pacing_failures(res)
        tries.append(f"{failures or 'ok'} ({summary})")
        if not failures:
            break
    assert not failures, " / ".join(tries)


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
    # the wait is the cap's, not the client's lateness: queue time, not send lag, and the
    # shortfall a note naming the cap, not a CLIENT BOTTLENECK (a busy host may still flag
    # the client's CPU or event loop)
    assert m.send_lag_ms.p99 is not None and m.send_lag_ms.p99 < m.queue_ms.max
    assert not any(w.startswith("sent ") for w in res.client.warnings)
    note = cap_note(m, res.load)
    assert note is not None and note.startswith("the --max-concurrency 2 cap held sends back")


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
