"""Every fault of the mock server is classified right, and the run still completes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servetune.bench.client import Timeouts
from servetune.bench.runner import BenchOptions, run_point
from servetune.bench.server_metrics import http_fetcher
from servetune.metrics import resent_note
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.status import RequestStatus, RunStatus
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

# CI runs this niced beside engines, and a starved process stalls for seconds: a short
# limit would turn a good or truncated stream into an idle_timeout (and the mock counts
# that abort as a cancellation). So only a case that tests a limit gets a short one.
GENEROUS = Timeouts(connect_s=30.0, ttft_s=30.0, idle_s=30.0, total_s=120.0)
# fault -> the one short limit it is about; a stall keeps a long TTFT limit, so a slow
# first chunk does not read as ttft_timeout.
SHORT = {
    "slow_headers": Timeouts(connect_s=30.0, ttft_s=0.4, idle_s=30.0, total_s=120.0),
    "stall": Timeouts(connect_s=30.0, ttft_s=30.0, idle_s=0.3, total_s=120.0),
}


def run(
    cfg: MockConfig,
    count: int = 6,
    users: int = 2,
    timeouts: Timeouts = GENEROUS,
    output: int = 10,
    **opts,
):
    spec = parse_workload(
        {"count": count, "arrival": {"kind": "closed", "concurrency": users},
         "input_tokens": {"dist": "fixed", "value": 8},
         "output_tokens": {"dist": "fixed", "value": output}}
    )  # fmt: skip
    with mock_in_thread(cfg) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        if opts.pop("scrape", False):
            # 30 s: a scrape stalled past the 2 s default reads as "nothing scraped"
            opts["metrics_fetch"] = http_fetcher(url, timeout_s=30.0)
        # The stragglers after the last send are aborted past drain_s: 60 s, not the
        # seconds a stalled request can eat.
        o = BenchOptions(url=url, timeouts=timeouts, workers=1, drain_s=60.0, **opts)
        o.breaker_error_rate = opts.get("breaker_error_rate")
        res = run_point(spec, materialize(spec, WordTokenizer()), o)
        return res, srv


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("http_500", "http_5xx"),
        ("http_429", "http_429"),
        ("slow_headers", "ttft_timeout"),
        ("stall", "idle_timeout"),
        ("truncate", "truncated_stream"),
        ("reset", "connection_reset"),
        ("malformed", "malformed_response"),
        ("error_event", "server_error_event"),
        ("disconnect", "connection_reset"),
    ],
)
def test_fault_is_classified(fault: str, expected: str) -> None:
    # Headers 30 s late, far past the 0.4 s TTFT limit: a stall of the whole process
    # cannot let them arrive before the limit fires.
    cfg = MockConfig(faults={fault: 1.0}, slow_headers_s=30.0)
    res, _ = run(cfg, timeouts=SHORT.get(fault, GENEROUS))
    assert res.status == RunStatus.COMPLETED
    assert len(res.records) == 6
    assert {r.status for r in res.records} == {RequestStatus.ERROR}
    assert res.metrics.errors_by_class == {expected: 6}
    assert res.metrics.error_rate == 1.0


def test_the_idle_limit_fires_before_a_longer_ttft_limit() -> None:
    """A stream stalled after its first chunk ends at the idle limit (0.3 s), not at the
    TTFT limit the timer was first armed for (120 s: before the fix every stall ran to it)."""
    slow_ttft = Timeouts(connect_s=30.0, ttft_s=120.0, idle_s=0.3, total_s=300.0)
    spec = parse_workload(
        {"count": 2, "arrival": {"kind": "closed", "concurrency": 2},
         "input_tokens": {"dist": "fixed", "value": 8},
         "output_tokens": {"dist": "fixed", "value": 10}}
    )  # fmt: skip
    with mock_in_thread(MockConfig(faults={"stall": 1.0})) as srv:
        o = BenchOptions(url=f"http://127.0.0.1:{srv.port}", timeouts=slow_ttft, workers=1)
        res = run_point(spec, materialize(spec, WordTokenizer()), o)
    assert res.metrics.errors_by_class == {"idle_timeout": 2}
    for r in res.records:
        last = r.chunk_ns[-1] if r.chunk_ns else r.send_ns
        # 0.3 s plus a starved host's stalls (seconds), yet far below the 120 s TTFT limit
        # (the classification alone cannot tell: the late timer also says idle_timeout)
        assert (r.end_ns - last) / 1e9 < 30.0, (r.end_ns - last) / 1e9


def test_mixed_faults_counted_and_good_requests_measured() -> None:
    res, srv = run(MockConfig(faults={"http_500": 0.2, "truncate": 0.2}, seed=1), count=60, users=4)
    m = res.metrics
    injected = srv.stats.faults
    assert m.errors_by_class.get("http_5xx", 0) == injected.get("http_500", 0)
    assert m.errors_by_class.get("truncated_stream", 0) == injected.get("truncate", 0)
    assert m.completed == 60 - sum(injected.values()) and m.ttft_ms.count == m.completed


def test_circuit_breaker_stops_the_run() -> None:
    res, _ = run(MockConfig(faults={"http_500": 1.0}), count=500, users=4, breaker_error_rate=0.5)
    assert res.status == RunStatus.CIRCUIT_BREAKER
    assert "circuit breaker" in (res.stop_reason or "")
    assert len(res.records) < 500


def test_cancelled_streams_free_the_slot() -> None:
    # 400 tokens at 5 ms: the server is still streaming ~2 s after the client's cut. With
    # 10 tokens (50 ms) a starved client read its 2 chunks after the server had sent the
    # last one: the server then saw no cancellation (CI: 7 server-side against 9).
    res, srv = run(
        MockConfig(itl_ms=5.0),
        count=20,
        users=4,
        output=400,
        cancel_fraction=0.5,
        cancel_after_chunks=2,
        scrape=True,
    )
    cancelled = [r for r in res.records if r.status == RequestStatus.CANCELLED]
    assert cancelled and all(len(r.chunk_ns) == 2 for r in cancelled)
    assert srv.stats.cancelled == len(cancelled)
    assert res.cancellation == {
        "cancelled": len(cancelled),
        "running_after_run": 0.0,
        "freed": True,
    }
    assert res.metrics.error_rate == 0.0
    assert res.server is not None and res.server.deltas["mock:requests_cancelled_total"] == len(
        cancelled
    )


def test_a_request_retried_after_a_dropped_keep_alive_connection_gets_a_new_one(
    tmp_path: Path,
) -> None:
    """A server that dropped its idle keep-alive connections without saying so (here:
    each after one answer): four requests at once open four connections, and each of the
    next four, 50 ms apart, reuses one, finds EOF and is retried once. The retry took
    another idle connection, as stale, and was recorded as a reset (seen against
    llama.cpp: one of 12 requests at 6 users, `connection_reset` 28 us after the send)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 20, "output_length": 4, "hash_ids": [i]})
            + "\n"
            for i, t in enumerate([0, 0, 0, 0, 200, 250, 300, 350])
        )
    )
    spec = parse_workload(
        {"name": "ka", "seed": 0, "api": "completions", "arrival": {"kind": "trace"},
         "trace": {"path": str(trace), "block_tokens": 16}}
    )  # fmt: skip
    with mock_in_thread(MockConfig(answers_per_connection=1)) as srv:
        o = BenchOptions(url=f"http://127.0.0.1:{srv.port}", timeouts=GENEROUS, workers=1)
        res = run_point(spec, materialize(spec, WordTokenizer()), o)
    assert [r.error for r in res.records] == [None] * 8
    assert all(r.status == RequestStatus.OK for r in res.records)
    # each retry is said (a server dropping requests reads the same as a stale keep-alive):
    # it had said nothing, and the mock dropping 30% of requests read 0% errors
    by_index = sorted(res.records, key=lambda r: r.index)
    assert [r.resent for r in by_index] == [False] * 4 + [True] * 4
    assert all(r.connect_ns > 0 for r in by_index[4:])  # the retry's new connection
    note = resent_note(res.records)
    assert note is not None and note.startswith("4 of 8 requests were sent again")
    assert resent_note(by_index[:4]) is None
