"""The metric contract (docs/metrics.md) on hand-built raw records, figure by figure."""

from __future__ import annotations

import pytest

from servetune.metrics import client_warnings, compute_metrics, measurement_window
from servetune.metrics.compute import itl_samples_ms, max_in_flight, request_latencies_ms
from servetune.results.schema import RequestRecord
from servetune.slo import parse_slo

MS = 1_000_000


def rec(
    send_ms: float, chunks_ms: list[float], tokens: list[int] | None = None, **kw
) -> RequestRecord:
    chunk_ns = [int(c * MS) for c in chunks_ms]
    return RequestRecord(
        index=kw.pop("index", 0),
        send_ns=int(send_ms * MS),
        chunk_ns=chunk_ns,
        chunk_tokens=tokens if tokens is not None else [1] * len(chunk_ns),
        end_ns=kw.pop("end_ns", chunk_ns[-1] if chunk_ns else int(send_ms * MS)),
        **kw,
    )


def test_ttft_ignores_role_only_chunk_and_e2e_ends_at_last_content() -> None:
    # role-only event at 2 ms (first_event), first content at 50 ms, usage/[DONE] later (end_ns)
    r = rec(0, [50, 60, 70], first_event_ns=2 * MS, end_ns=95 * MS, usage_completion_tokens=3)
    ttft, tpot, e2e = request_latencies_ms(r)
    assert (ttft, e2e) == (50.0, 70.0)
    assert tpot == pytest.approx(10.0)  # (70 - 50) / (3 - 1)
    m = compute_metrics([r])
    assert m.ttft_ms.p50 == 50.0 and m.first_event_ms.p50 == 2.0


def test_multi_token_chunks_pooled_vs_per_token_itl() -> None:
    # gaps: 10 ms before a 1-token chunk, 30 ms before a 3-token chunk
    r = rec(0, [10, 20, 50], tokens=[1, 1, 3], usage_completion_tokens=5)
    pooled, per_tok = itl_samples_ms([r])
    assert sorted(pooled.tolist()) == [10.0, 30.0]  # a chunk's gap counts once
    assert sorted(per_tok.tolist()) == [10.0, 10.0, 10.0, 10.0]  # 30 ms / 3, three samples
    _, tpot, _ = request_latencies_ms(r)
    assert tpot == pytest.approx(40 / 4)  # (E2E - TTFT) / (tokens - 1) uses usage's 5


def test_tpot_is_request_weighted() -> None:
    short = rec(0, [10, 20], usage_completion_tokens=2)  # TPOT 10
    long = rec(0, [10] + [10 + 2 * i for i in range(1, 101)], usage_completion_tokens=101)  # TPOT 2
    m = compute_metrics([short, long])
    assert m.tpot_ms.mean == pytest.approx(6.0)  # one sample per request, not per token
    assert m.itl_ms.count == 1 + 100


def test_usage_else_tokenizer_else_chunks_and_mismatch() -> None:
    assert (
        rec(0, [1, 2], usage_completion_tokens=7, tokenizer_completion_tokens=6).output_tokens == 7
    )
    assert rec(0, [1, 2], tokenizer_completion_tokens=6).output_tokens == 6
    assert rec(0, [1, 2], tokens=[2, 3]).output_tokens == 5
    m = compute_metrics(
        [
            rec(0, [1, 2], usage_completion_tokens=7, tokenizer_completion_tokens=6),
            rec(0, [1, 2], usage_completion_tokens=2, tokenizer_completion_tokens=2),
        ]
    )
    assert (m.token_count_compared, m.token_count_mismatched, m.token_count_max_abs_diff) == (
        2,
        1,
        1,
    )


def test_goodput_counts_errors_as_misses_and_excludes_cancellations() -> None:
    good = [rec(i * 100, [i * 100 + 10, i * 100 + 20], index=i) for i in range(8)]
    slow = rec(850, [850 + 900, 850 + 910], index=8)  # TTFT 900 ms > 800
    err = rec(50, [], status="error", error="http_5xx", end_ns=60 * MS, index=9)
    cancel = rec(60, [70], status="cancelled", index=10)
    slo = parse_slo({"ttft_ms": {"p95": 800, "p99": 2000}, "error_rate": 0.2})
    m = compute_metrics([*good, slow, err, cancel], slo=slo)
    assert m.measured == 11 and m.cancelled == 1 and m.failed == 1
    assert m.error_rate == pytest.approx(1 / 10)  # cancellations are not attempts
    assert m.slo_attainment == pytest.approx(8 / 10)  # the error and the slow one miss
    assert m.errors_by_class == {"http_5xx": 1}
    checks = {(c.metric, c.stat): c.ok for c in m.slo_checks}
    assert checks[("error_rate", "max")] is True
    assert m.slo_pass is (m.ttft_ms.p95 is not None and m.ttft_ms.p95 <= 800)
    assert slo.per_request() == {"ttft_ms": 800}


def test_window_excludes_warmup_and_drain() -> None:
    # sends every 100 ms from 0 to 2000 ms, each request lasts 500 ms (one chunk per 100 ms)
    rs = [rec(t, [t + 100 * k for k in range(1, 6)], index=t // 100) for t in range(0, 2001, 100)]
    start, end, fell_back = measurement_window(rs, warmup_s=0.5, cooldown_s=0.5)
    assert (start, end, fell_back) == (500 * MS, 1500 * MS, False)
    m = compute_metrics(rs, warmup_s=0.5, cooldown_s=0.5)
    assert m.window_s == pytest.approx(1.0)
    assert m.measured == 11  # sends at 500..1500 inclusive
    assert m.sent_req_s == pytest.approx(11.0)
    assert m.output_tok_s == pytest.approx(55.0)  # 11 instants x 5 chunks inside [0.5, 1.5] s
    assert m.req_s == pytest.approx(11.0)  # last chunks at 500..1500 ms
    whole = compute_metrics(rs)
    assert whole.window_end_ns == 2000 * MS  # the drain after the last send is excluded


def test_send_lag_queue_and_client_warnings() -> None:
    rs = [
        rec(
            i * 10 + (30 if i in (5, 6, 7) else 0.2),
            [i * 10 + 40],
            index=i,
            scheduled_ns=i * 10 * MS,
        )
        for i in range(100)
    ]
    m = compute_metrics(rs)
    assert m.send_lag_ms.max == pytest.approx(30.0)
    assert m.offered_req_s is not None
    warns = client_warnings(m, open_loop=True, cpu_util=0.95, lag_p99_limit_ms=1.0)
    assert any("send lag" in w for w in warns) and any("CPU" in w for w in warns)
    assert client_warnings(m, open_loop=False, cpu_util=0.1) == []


def test_max_in_flight_and_empty() -> None:
    rs = [rec(0, [10]), rec(5, [20]), rec(15, [30])]
    assert max_in_flight(rs) == 2
    assert compute_metrics([]).measured == 0


def test_non_stream_has_no_tpot_or_itl() -> None:
    r = rec(0, [100], tokens=[50], usage_completion_tokens=50)
    m = compute_metrics([r], stream=False)
    assert m.ttft_ms.p50 == m.e2e_ms.p50 == 100.0
    assert m.tpot_ms.count == 0 and m.itl_ms.count == 0
