"""The metric contract (docs/metrics.md) on hand-built raw records, figure by figure."""

from __future__ import annotations

import pytest

from servetune.metrics import (
    cap_note,
    client_warnings,
    compute_metrics,
    measurement_window,
    schedule_note,
    token_count_note,
    window_note,
)
from servetune.metrics.compute import itl_samples_ms, max_in_flight, request_latencies_ms
from servetune.results.schema import Load, RequestRecord
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
    assert token_count_note(m) == (
        "the server's usage and --tokenizer disagree on 1 of 2 outputs (by up to 1 tokens): "
        "is --tokenizer the served model's?"
    )
    assert token_count_note(compute_metrics([rec(0, [1, 2], usage_completion_tokens=2)])) is None


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


def test_unmeasured_token_timing_proves_no_request_met_a_ttft_target() -> None:
    """Not streamed: a request's one chunk comes with its last token, so its "TTFT" is its
    E2E. The TTFT check fails as unmeasurable; goodput and attainment used to count every
    request as meeting it (goodput = req/s beside a failed SLO). An E2E-only SLO is still
    judged request by request."""
    reqs = [rec(i * 100, [i * 100 + 50], tokens=[20], index=i) for i in range(10)]
    ttft = parse_slo({"ttft_ms": {"p95": 800}, "e2e_ms": {"p95": 800}})
    m = compute_metrics(reqs, slo=ttft, stream=False)
    assert m.req_s > 0 and m.goodput_req_s == 0 and m.slo_attainment == 0
    assert not m.slo_pass
    e2e = compute_metrics(reqs, slo=parse_slo({"e2e_ms": {"p95": 800}}), stream=False)
    assert e2e.goodput_req_s == pytest.approx(e2e.req_s) and e2e.slo_attainment == 1
    streamed = compute_metrics(reqs, slo=ttft)  # the same chunks, streamed: TTFT 50 ms
    assert streamed.goodput_req_s == pytest.approx(streamed.req_s)


def test_window_excludes_warmup_and_drain() -> None:
    # an open loop (a schedule): sends every 100 ms from 0 to 2000 ms, each request lasts
    # 500 ms (one chunk per 100 ms)
    rs = [
        rec(t, [t + 100 * k for k in range(1, 6)], index=t // 100, scheduled_ns=t * MS)
        for t in range(0, 2001, 100)
    ]
    start, end, fell_back = measurement_window(rs, warmup_s=0.5, cooldown_s=0.5)
    assert (start, end, fell_back) == (500 * MS, 1500 * MS, False)
    m = compute_metrics(rs, warmup_s=0.5, cooldown_s=0.5)
    assert m.window_s == pytest.approx(1.0)
    assert m.measured == 11  # sends at 500..1500 inclusive: latency samples
    assert m.sent_req_s == pytest.approx(10.0)  # a send every 100 ms: [0.5, 1.5) holds 10
    # rates count in the window moved by the median latency (500 ms): [1.0, 2.0) s holds
    # 10 instants x 5 chunks (one of each request in flight), and 10 last chunks
    assert m.completion_shift_s == pytest.approx(0.5)
    assert m.output_tok_s == pytest.approx(50.0)
    assert m.req_s == pytest.approx(10.0)
    whole = compute_metrics(rs)
    assert whole.window_end_ns == 2000 * MS  # the drain after the last send is excluded


def open_loop(n: int, gap_ms: float, e2e_ms: float, tokens: int = 10) -> list[RequestRecord]:
    """n requests sent on schedule every gap_ms, each streaming `tokens` evenly to e2e_ms."""
    step = e2e_ms / tokens
    return [
        rec(
            i * gap_ms,
            [i * gap_ms + step * (k + 1) for k in range(tokens)],
            index=i,
            scheduled_ns=int(i * gap_ms * MS),
            usage_completion_tokens=tokens,
        )
        for i in range(n)
    ]


def test_an_open_loop_rate_has_no_ramp_up_deficit() -> None:
    """10 req/s kept up with at 2 s a request: nothing finishes in the first 2 s, so the
    sends' window (9.9 s) held 79 completions, 8.0 req/s; moved by the median latency it
    holds the window's own arrivals' completions, the rate served."""
    for n in (100, 30):
        m = compute_metrics(open_loop(n, 100, 2000))
        assert m.completion_shift_s == pytest.approx(2.0)
        assert m.req_s == pytest.approx(10.0, rel=0.001)
        assert m.output_tok_s == pytest.approx(100.0, rel=0.001)
        assert m.offered_req_s == pytest.approx(10.0) and m.sent_req_s == pytest.approx(10.0)


def test_one_straggler_does_not_stretch_the_window_to_the_whole_run() -> None:
    """One request of 100 stalls into a 60 s idle timeout: the run's last end is 65 s, but
    the window stays the sends' 9.9 s (before: the whole run, every rate ~6x low)."""
    rs = open_loop(100, 100, 250)
    stalled = rs[50]
    rs[50] = stalled.model_copy(
        update={"status": "error", "error": "idle_timeout", "end_ns": stalled.send_ns + 60_000 * MS}
    )
    m = compute_metrics(rs, slo=parse_slo({"ttft_ms": {"p95": 200}}))
    assert not m.window_whole_run and m.window_s == pytest.approx(9.9)
    assert m.req_s == pytest.approx(99 / 9.9, rel=0.02)
    assert m.goodput_req_s == pytest.approx(m.req_s)


def test_quick_refusals_do_not_make_a_tiny_window_look_long() -> None:
    """4 users behind a 3-slot front: 9 refusals in 5 ms, 3 answers at 60 ms. The sends'
    5 ms is tiny next to a served request's 60 ms: the whole run is the window (counted
    as a 5 ms window it held no completion, 0 req/s, and accept's stages ran at 0.07/s)."""
    ok = [rec(0.7 + 0.01 * i, [20, 60], index=i) for i in range(3)]
    refused = [
        rec(0.7 + 0.55 * i, [], index=3 + i, status="error", error="http_429",
            end_ns=int((0.9 + 0.55 * i) * MS))
        for i in range(9)
    ]  # fmt: skip
    m = compute_metrics([*ok, *refused])
    assert m.window_whole_run and m.req_s == pytest.approx(3 / 0.0593, rel=0.01)


def test_a_closed_loop_counts_whole_rounds_unmoved() -> None:
    """4 users, 3 rounds of 300 ms: each send follows a completion, so the window (first to
    last send) ends on one and holds two rounds, 4 / 0.3 s. A window moved by the latency
    would count parts of three rounds."""
    rs = [
        rec(r * 300.01, [r * 300.01 + 150, r * 300.01 + 300], index=r * 4 + u)
        for r in range(3)
        for u in range(4)
    ]
    m = compute_metrics(rs)
    assert m.completion_shift_s == 0.0 and m.offered_req_s is None
    assert m.req_s == pytest.approx(4 / 0.3, rel=0.001)


def test_a_client_that_falls_behind_shows_sent_below_offered() -> None:
    """Scheduled 10/s, sent at 5/s: offered comes from the schedule's own window, so the
    client's shortfall shows (counted inside the sends' window, offered read 5/s too)."""
    rs = [rec(i * 200, [i * 200 + 50], index=i, scheduled_ns=i * 100 * MS) for i in range(100)]
    m = compute_metrics(rs)
    assert m.offered_req_s == pytest.approx(10.0) and m.sent_req_s == pytest.approx(5.0)
    warns = client_warnings(m, open_loop=True, cpu_util=0.1, lag_p99_limit_ms=1e9)
    assert warns == ["sent 5.0 req/s < 98% of offered 10.0 req/s"]


def test_a_run_with_no_completion_in_its_window_says_why_it_reads_0_req_s() -> None:
    """Two requests 1 s apart, finishing after 10 ms and 990 ms: the window moved by their
    median latency (500 ms), [0.5, 1.5) s, holds neither end."""
    rs = [
        rec(0, [10], index=0, scheduled_ns=0),
        rec(1000, [1990], index=1, scheduled_ns=1000 * MS),
    ]
    m = compute_metrics(rs)
    assert m.req_s == 0.0 and m.completed == 2 and not m.window_whole_run
    assert window_note(m) == (
        "0 req/s: none of the 2 completed requests finished inside the measurement window "
        "(docs/metrics.md); too few for a rate: raise --count"
    )
    assert window_note(compute_metrics(open_loop(30, 100, 500))) is None
    # one request of 36 ms read 27.8 req/s with no word (a 0.01 s Poisson run)
    one = compute_metrics([rec(0, [10, 36], scheduled_ns=0)])
    assert one.req_s == pytest.approx(1 / 0.036, rel=0.01)
    assert window_note(one) == (
        "27.8 req/s is one request over its own latency, not a throughput: too few for a "
        "rate: raise --count or --duration"
    )


def test_a_warm_up_longer_than_the_run_is_said_not_dropped_silently() -> None:
    """30 requests over 3 s with 10 s of warm-up: no window is left, so the whole run is
    measured, warm-up included; the note says so (it read as if the warm-up were cut)."""
    m = compute_metrics(open_loop(30, 100, 500), warmup_s=10)
    assert m.window_whole_run and m.measured == 30
    assert window_note(m) == (
        "the warm-up + cool-down (10 s) leave no window in this run, or one shorter than "
        "a request's median latency: every request is measured, the warm-up's too; raise "
        "--count or --duration, or shorten warmup_s/cooldown_s"
    )
    assert window_note(compute_metrics(open_loop(30, 100, 500), warmup_s=1)) is None


def test_a_schedule_far_from_the_rate_asked_is_said_with_the_spread_to_expect() -> None:
    """60 sends 100 ms apart offer 10 req/s. Asked for 6 (a drawn schedule that came out
    fast, as seed 7 of the CPU held-out check did: 1.03 asked, 1.73 offered) the note
    gives both rates and the spread of the kind's gaps; within 15% of the asked, nothing;
    a constant schedule or a closed loop, nothing."""
    m = compute_metrics(open_loop(60, 100, 500))
    assert m.offered_req_s == pytest.approx(10.0) and m.measured == 60
    note = schedule_note(m, Load(kind="gamma", rate=6.0, burstiness=1 / 9))
    assert note is not None and note.startswith(
        "the schedule offered 10 req/s, 67% above the 6 asked: 60 gamma arrivals at CV 3 "
        "vary by +/-39% (CV / sqrt(n))"
    )
    slow = schedule_note(m, Load(kind="poisson", rate=14.0))
    assert slow is not None and "29% below the 14 asked" in slow and "CV 1 vary by +/-13%" in slow
    assert schedule_note(m, Load(kind="poisson", rate=9.0)) is None  # 11% off: said nothing
    assert schedule_note(m, Load(kind="constant", rate=6.0)) is None
    assert schedule_note(m, Load(kind="closed", concurrency=4)) is None


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


def test_the_wait_on_the_users_cap_is_no_client_bottleneck() -> None:
    """An open loop at 100 req/s under a --max-concurrency cap that lets 70 req/s through:
    each send waits on the cap (queue_ns), and none is late otherwise. The send lag had
    counted that wait (P99 ~420 ms) and the shortfall read as a CLIENT BOTTLENECK; the
    shortfall is the cap's, and `cap_note` says so."""
    rs = []
    for i in range(100):
        sched, send = i * 10, i * 1000 / 70  # scheduled every 10 ms, sent every ~14.3
        rs.append(
            rec(send, [send + 20], index=i, scheduled_ns=int(sched * MS),
                queue_ns=int((send - sched) * MS))
        )  # fmt: skip
    m = compute_metrics(rs)
    assert m.send_lag_ms.max == pytest.approx(0.0, abs=1e-6)
    assert m.queue_ms.p99 is not None and m.queue_ms.p99 > 400
    assert client_warnings(m, open_loop=True, cpu_util=0.1) == []
    note = cap_note(m, Load(kind="poisson", rate=100.0, concurrency=2))
    assert note is not None and note.startswith("the --max-concurrency 2 cap held sends back")
    assert cap_note(m, Load(kind="closed", concurrency=2)) is None
    # the same sends, late with no cap to wait on: the client's own lag, flagged
    late = compute_metrics([r.model_copy(update={"queue_ns": 0}) for r in rs])
    warns = client_warnings(late, open_loop=True, cpu_util=0.1)
    assert any("send lag" in w for w in warns) and any("sent" in w for w in warns)
    assert cap_note(late, Load(kind="poisson", rate=100.0)) is None


def _lockstep(users: int, count: int, latency_ms: float = 100.0) -> list[RequestRecord]:
    """A closed loop at a server of fixed pace: each user's next request is sent as its
    last one finishes (users a hair apart within a round)."""
    rs, free = [], [(u * 0.1, u) for u in range(users)]  # (when the user sends next, user)
    for i in range(count):
        free.sort()
        t, u = free.pop(0)
        rs.append(rec(t, [t + latency_ms / 2, t + latency_ms], index=i))
        free.append((t + latency_ms, u))
    return rs


@pytest.mark.parametrize("count", [15, 16, 17, 31])
def test_a_closed_loops_rate_is_over_whole_rounds_whatever_the_count(count: int) -> None:
    """3 users at 100 ms a request serve 30 req/s. Its last send is the (N - 3)-th
    completion, so when 3 did not divide N - 3 the window ended one completion into a
    round and counted that round's time with one of its completions: 16 requests read
    26 req/s (-13%), 17 read 28.0, and `validate` saw a miss the 15-request runs did not."""
    m = compute_metrics(_lockstep(3, count))
    assert m.req_s == pytest.approx(30.0, rel=0.01)
    assert m.measured == count  # the latency samples: every send in the whole window


def test_an_open_loop_of_sessions_is_not_cut_to_rounds() -> None:
    """Sessions arriving on a schedule (first turns scheduled, follow-ups sent as answers
    come): no users whose rounds to count, so its window stays first to last send."""
    rs = []
    for k in range(8):  # a session every 100 ms, 2 turns of 150 ms each
        t0 = k * 100.0
        rs.append(rec(t0, [t0 + 75, t0 + 150], index=2 * k, scheduled_ns=int(t0 * MS)))
        rs.append(rec(t0 + 150, [t0 + 225, t0 + 300], index=2 * k + 1))
    m = compute_metrics(rs)
    assert m.window_end_ns == max(r.send_ns for r in rs) and m.window_start_ns == 0


def test_max_in_flight_and_empty() -> None:
    rs = [rec(0, [10]), rec(5, [20]), rec(15, [30])]
    assert max_in_flight(rs) == 2
    assert compute_metrics([]).measured == 0


def test_non_stream_has_no_token_timing_and_its_checks_say_why() -> None:
    """Not streamed, the first token comes with the last: a TTFT would be the E2E."""
    r = rec(0, [100], tokens=[50], usage_completion_tokens=50)
    slo = parse_slo({"ttft_ms": {"p50": 800}, "tpot_ms": {"p50": 40}, "e2e_ms": {"p50": 500}})
    m = compute_metrics([r], stream=False, slo=slo)
    assert m.e2e_ms.p50 == 100.0 and m.ttft_ms.count == 0
    assert m.tpot_ms.count == 0 and m.itl_ms.count == 0
    checks = {c.metric: c for c in m.slo_checks}
    for metric in ("ttft_ms", "tpot_ms"):
        assert not checks[metric].ok
        assert checks[metric].note == "not measurable: the requests were not streamed"
    assert checks["e2e_ms"].ok and "not measurable" not in (checks["e2e_ms"].note or "")


def test_one_token_outputs_leave_tpot_undefined_not_missed() -> None:
    """Every output one token: no request has a TPOT, so goodput counts them met; the TPOT
    check agrees (before: failed on a missing value while attainment read 100%)."""
    rs = [rec(i * 100, [i * 100 + 20], index=i, scheduled_ns=i * 100 * MS) for i in range(30)]
    slo = parse_slo({"ttft_ms": {"p95": 500}, "tpot_ms": {"p95": 50}})
    m = compute_metrics(rs, slo=slo)
    tpot = next(c for c in m.slo_checks if c.metric == "tpot_ms")
    assert tpot.ok and tpot.value is None and "TPOT is undefined" in (tpot.note or "")
    assert m.slo_pass and m.slo_attainment == 1.0


def test_an_answer_read_all_at_once_has_no_tpot_and_does_not_drag_the_median_to_0() -> None:
    """A client the host held reads every event it owes at once and stamps them alike: that
    answer's E2E - TTFT is 0 because its decode went into its TTFT. It has no TPOT (before:
    TPOT 0, and with most answers so, a P50 TPOT of 0 that passed any target)."""
    # answers under 50 ms: too short for the buffered-stream rule to judge (metrics.buffering)
    streamed = [rec(i * 1000, [i * 1000 + 5 + 10 * k for k in range(4)], index=i) for i in range(2)]
    held = [rec(i * 1000, [i * 1000 + 40] * 4, index=i) for i in range(2, 5)]
    ttft, tpot, e2e = request_latencies_ms(held[0])
    assert (ttft, tpot, e2e) == (40.0, None, 40.0)
    slo = parse_slo({"tpot_ms": {"p50": 5}})
    m = compute_metrics(streamed + held, slo=slo)
    assert m.tpot_ms.count == 2 and m.tpot_ms.p50 == pytest.approx(10.0)
    assert m.ttft_ms.count == 5  # the held answers' first tokens did reach the client late
    assert not m.slo_pass and m.slo_attainment == pytest.approx(3 / 5)  # undefined, not a miss
    # every answer of 2+ tokens read at once: nothing proves the TPOT target (not "undefined")
    m = compute_metrics(held, slo=slo)
    tpot_check = next(c for c in m.slo_checks if c.metric == "tpot_ms")
    assert m.tpot_ms.count == 0 and m.tpot_at_once_requests == 3 and not tpot_check.ok
    assert tpot_check.note == "not measurable: every answer of 2+ tokens arrived all at once"


def test_a_percentile_of_too_few_requests_says_it_rests_on_the_largest() -> None:
    """5 TTFTs against a P95 target: type-7 P95 740 ms passes 800 ms while 1 of 5 is 900;
    the check keeps its value and verdict and says what it rests on."""
    rs = [rec(i * 1000, [i * 1000 + t], index=i) for i, t in enumerate([100] * 4 + [900])]
    m = compute_metrics(rs, slo=parse_slo({"ttft_ms": {"p50": 800, "p95": 800}}))
    p50, p95 = m.slo_checks
    assert p50.note is None
    assert p95.ok and p95.value == pytest.approx(740.0)
    assert p95.note == (
        "a sample of 5 is too few for P95 (20 needed): it rests on the largest values (max 900 ms)"
    )
