"""The measurement window from the diagnose bug hunt: a warm-up that leaves a window shorter
than one latency falls back to the whole run, says so, and keeps an offered rate."""

from __future__ import annotations

from servetune.metrics.compute import compute_metrics, window_note
from servetune.results.schema import RequestRecord

MS = 1_000_000


def open_loop() -> list[RequestRecord]:
    """10 req/s for 10 s, each 500 ms: first chunk at 100 ms, then 9 more."""

    def rec(i: int) -> RequestRecord:
        send = i * 100 * MS
        chunks = [send + 100 * MS + k * 400 * MS // 9 for k in range(10)]
        return RequestRecord(
            index=i, send_ns=send, scheduled_ns=send, chunk_ns=chunks, chunk_tokens=[1] * 10,
            end_ns=chunks[-1], status="ok", usage_completion_tokens=10, prompt_tokens=100,
        )  # fmt: skip

    return [rec(i) for i in range(100)]


def test_a_warm_up_leaving_less_than_a_latency_measures_the_whole_run() -> None:
    """9.85 s of warm-up left 50 ms of sends, under one 500 ms latency: it read 0 req/s,
    measured 1 request and said nothing (docs/metrics.md: such a window is tiny)."""
    m = compute_metrics(open_loop(), warmup_s=9.85)
    assert m.window_whole_run and m.measured == 100
    assert m.req_s > 9 and m.offered_req_s is not None
    note = window_note(m) or ""
    assert note.startswith("the warm-up + cool-down (9.85 s) leave no window in this run, or")
    kept = compute_metrics(open_loop(), warmup_s=5.0)  # 4.9 s of window: ten latencies
    assert not kept.window_whole_run and kept.measured == 50 and window_note(kept) is None


def test_the_whole_run_keeps_an_offered_rate() -> None:
    """A warm-up past the last send: the whole run is measured, and offered was None (its
    schedule window was trimmed to nothing)."""
    m = compute_metrics(open_loop(), warmup_s=9.95)
    assert m.window_whole_run and m.offered_req_s is not None
    assert abs(m.offered_req_s - 10.0) < 0.2 and m.offered_arrivals == 100
