"""The steady-state check counts like with like: a sessions schedule offers sessions, so
achieved counts completed first turns (not every turn), in sessions/s; and its span ends
one latency before the last arrival, so widely spread latencies do not read as a queue."""

from __future__ import annotations

from typing import Any

import pytest

from servetune.measure.steady import SIM_STEADY, apply_steady_state
from servetune.metrics.compute import compute_metrics, schedule_note
from servetune.results.schema import Load, RequestRecord, RunResult
from servetune.slo import parse_slo
from servetune.workload.spec import parse_workload

S = 1_000_000_000
TOKENS = {
    "input_tokens": {"dist": "fixed", "value": 8},
    "output_tokens": {"dist": "fixed", "value": 2},
}


def _record(i: int, send: int, latency: int, scheduled: int | None) -> RequestRecord:
    chunks = [send + latency // 2, send + latency]
    return RequestRecord(
        index=i, scheduled_ns=scheduled, send_ns=send, chunk_ns=chunks, chunk_tokens=[1, 1],
        end_ns=send + latency,
    )  # fmt: skip


def _run(records: list[RequestRecord], spec: Any) -> RunResult:
    slo = parse_slo({"ttft_ms": {"p95": 1e9}})  # percentiles never bind: only steady state
    m = compute_metrics(records, warmup_s=spec.warmup_s, slo=slo)
    return RunResult(id="x", created_utc="now", records=records, metrics=m)


def test_spread_latencies_without_a_queue_keep_up() -> None:
    """No queue (each request served alone), latencies 1-13 s: the run's own rates read
    ~97% (completions counted one median latency past the last arrival, where nothing
    arrives to make up for the late ones); the check's span reads 100%."""
    spec = parse_workload({"count": 700, "warmup_s": 10, **TOKENS,
                           "arrival": {"kind": "constant", "rate": 10}})  # fmt: skip
    lat = [S * (1 + 2 * (i % 7)) for i in range(spec.count)]
    records = [_record(i, i * S // 10, lat[i], i * S // 10) for i in range(spec.count)]
    res = _run(records, spec)
    assert res.metrics.req_s / res.metrics.offered_req_s == pytest.approx(0.97, abs=0.01)
    st = apply_steady_state(res, spec, SIM_STEADY)
    assert st is not None and st.steady and st.unit == "req/s"
    assert st.achieved_ratio == pytest.approx(1.0, abs=0.01)


def _sessions(rate: float, service_s: float, n: int) -> tuple[RunResult, Any]:
    """`n` sessions of 3 turns started at `rate`/s, each turn answered after
    `service_s` x (sessions in flight at its send) (a server shared by all), 1 s of think
    time between turns; only first turns are scheduled, as bench and the simulator do."""
    spec = parse_workload({
        "count": n, "warmup_s": 10, "api": "chat", "arrival": {"kind": "poisson", "rate": rate},
        "sessions": {"kind": "chat", "turns": {"dist": "fixed", "value": 3},
                     "user_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "fixed", "value": 2},
                     "think_time_s": {"dist": "fixed", "value": 1}},
    })  # fmt: skip
    records: list[RequestRecord] = []
    ends: list[int] = []  # when each session's last turn ends
    for k in range(n):
        t = int(k * S / rate)
        live = sum(e > t for e in ends) + 1
        for turn in range(3):
            latency = int(service_s * live * S)
            records.append(_record(len(records), t, latency, t if turn == 0 else None))
            t += latency + S
        ends.append(t - S)
    return _run(records, spec), spec


def test_a_sessions_schedule_is_judged_in_sessions_per_second() -> None:
    res, spec = _sessions(rate=2, service_s=0.05, n=200)
    m = res.metrics
    assert m.offered_unit == "sessions/s" and m.offered_req_s == pytest.approx(2, rel=0.02)
    assert m.sent_req_s > 2.5 * m.offered_req_s  # every turn is a request: ~3 per session
    st = apply_steady_state(res, spec, SIM_STEADY)
    assert st is not None and st.unit == "sessions/s" and st.steady
    assert st.achieved_ratio == pytest.approx(1.0, abs=0.02)  # all turns counted: ~3.0
    assert "sessions/s" in (st.signals().get("rate_unit") or "")


def test_a_sessions_queue_that_grows_fails() -> None:
    """Each turn takes longer the more sessions are in flight: at this rate sessions pile
    up, so first turns finish well below the rate they start, though every turn counted
    would read over 100%."""
    res, spec = _sessions(rate=4, service_s=0.2, n=300)
    assert res.metrics.req_s > res.metrics.offered_req_s  # the old, all-turns reading
    st = apply_steady_state(res, spec, SIM_STEADY)
    assert st is not None and not st.keeps_up and st.achieved_ratio < 0.9
    assert not res.metrics.slo_pass


def test_the_schedule_note_counts_sessions() -> None:
    res, spec = _sessions(rate=2, service_s=0.05, n=200)
    m = res.metrics.model_copy(update={"offered_req_s": 3.0})  # a draw far from the 2 asked
    note = schedule_note(m, Load.of(spec.arrival))
    assert note is not None and note.startswith("the schedule offered 3 sessions/s")
    assert f": {m.offered_arrivals} poisson arrivals" in note and m.offered_arrivals < 200


def test_a_sessions_point_warms_up_for_as_long_as_its_sessions_think() -> None:
    """Sessions that think 30 s between 4 turns: after the rule's 15 s of warm-up the
    window opened on first turns only, and read a lighter load than the steady one (the
    follow-ups, with their longer prompts, had not joined). The sized point warms up for
    the sessions' mean idle time, and its window holds the steady share of follow-ups."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware.catalog import get_hardware
    from servetune.model.catalog import get_model
    from servetune.sim.engine import simulate
    from servetune.workload.spec import WorkloadSpec

    def spec(think: float) -> WorkloadSpec:
        return parse_workload({
            "count": 10, "api": "chat", "arrival": {"kind": "poisson", "rate": 1},
            "sessions": {"kind": "chat", "turns": {"dist": "fixed", "value": 4},
                         "user_tokens": {"dist": "fixed", "value": 64},
                         "output_tokens": {"dist": "fixed", "value": 16},
                         "think_time_s": {"dist": "fixed", "value": think}},
        })  # fmt: skip

    quick = SIM_STEADY.sized(spec(1.0), 2.0)
    assert quick.warmup_s == SIM_STEADY.warmup_s  # 3 s of thinking: the rule's warm-up
    sized = SIM_STEADY.sized(spec(30.0), 2.0)
    assert sized.warmup_s == pytest.approx(90.0)  # 3 gaps of 30 s
    assert sized.count >= 2.0 * (90.0 + SIM_STEADY.window_s)

    def opening_load(s: WorkloadSpec) -> float:
        """Turns sent in the window's first 30 s, per second, over the steady 8/s (2
        sessions a second, 4 turns each)."""
        res, _ = simulate(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), EngineConfig(), s)
        start = res.metrics.window_start_ns
        sent = [r for r in res.records if start <= r.send_ns < start + 30 * S]
        return len(sent) / 30 / 8.0

    short = sized.model_copy(update={"warmup_s": SIM_STEADY.warmup_s})
    assert opening_load(short) < 0.5  # first turns, and the follow-ups only beginning
    assert opening_load(sized) == pytest.approx(1.0, abs=0.2)
