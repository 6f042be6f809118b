"""Bench bugs a hunt found: worker splits that dropped requests or broke the cap, a false
client-bottleneck warning, trace order, token counts per chunk, header encoding, /v1
base URLs, and small SSE/Content-Type leniencies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servetune.bench.client import RequestState, Timeouts
from servetune.bench.http import Target
from servetune.bench.reach import check_server
from servetune.bench.runner import BenchOptions, build_items, run_point, split_configs
from servetune.errors import InputError
from servetune.metrics.compute import client_warnings, compute_metrics
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.results.schema import RequestRecord
from servetune.status import RequestStatus
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

MS = 1_000_000


def spec_of(arrival: dict[str, Any], count: int, out: int = 4) -> Any:
    return parse_workload(
        {"count": count, "seed": 3, "arrival": arrival,
         "input_tokens": {"dist": "fixed", "value": 8},
         "output_tokens": {"dist": "fixed", "value": out}}
    )  # fmt: skip


def configs(spec: Any, workers: int) -> list[Any]:
    opts = BenchOptions(url="http://127.0.0.1:1", keep_text=False)
    items = build_items(spec, materialize(spec, WordTokenizer()), opts)
    return split_configs(spec, items, opts, workers)


# --- 1. --workers above a closed loop's users --------------------------------------------


def test_more_workers_than_users_sends_the_whole_count() -> None:
    """Concurrency 1 on 2 workers: one worker with the one user and all 8 requests (the
    second worker, with no user, was dropped with half of the count)."""
    (cfg,) = configs(spec_of({"kind": "closed", "concurrency": 1}, 8), workers=2)
    assert (cfg.users, cfg.max_requests, len(cfg.items)) == (1, 8, 8)


def test_uneven_users_get_a_count_in_proportion() -> None:
    """3 users on 2 workers: 2 users send 5 of 8, 1 user 3 (4 and 4 left the lone user
    running 2 rounds alone, below the concurrency asked); each worker has the items its
    count needs, and the split covers every request once."""
    cfgs = configs(spec_of({"kind": "closed", "concurrency": 3}, 8), workers=2)
    assert [c.users for c in cfgs] == [2, 1]
    assert [c.max_requests for c in cfgs] == [5, 3]
    assert [len(c.items) for c in cfgs] == [5, 3]
    assert sorted(it[0] for c in cfgs for it in c.items) == list(range(8))


def test_closed_loop_with_spare_workers_measures_every_request() -> None:
    spec = spec_of({"kind": "closed", "concurrency": 1}, 8)
    with mock_in_thread(MockConfig(ttft_ms=1, itl_ms=0.2)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=2, keep_text=False)
        res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    assert res.metrics.measured == 8 and res.metrics.completed == 8
    assert res.client.workers == 1 and res.metrics.max_in_flight == 1


def test_the_drain_limit_counts_from_the_last_send_not_the_first() -> None:
    """A closed loop sends as answers come back: a drain limit counted from its start cut
    `--count 20 --total-timeout 0.5` (each answer ~46 ms) after 10, the other 10 never
    sent, the run `completed`. Counted from the end of sending, all 20 run."""
    spec = spec_of({"kind": "closed", "concurrency": 1}, 20)
    with mock_in_thread(MockConfig(ttft_ms=30, itl_ms=5)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1, keep_text=False,
                            drain_s=0.3)  # fmt: skip
        res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    assert res.metrics.completed == 20 and len(res.records) == 20, res.metrics.completed
    assert res.duration_s > 0.3  # the loop outlived the limit: it was not counted from its start


# --- 2. --max-concurrency with several workers -------------------------------------------


def test_cap_is_never_split_above_itself() -> None:
    """Cap 1 on 2 workers: one worker capped at 1 (each was capped at max(1, 0) = 1)."""
    (cfg,) = configs(spec_of({"kind": "poisson", "rate": 50.0, "concurrency": 1}, 20), 2)
    assert cfg.cap == 1 and len(cfg.items) == 20


def test_uneven_cap_deals_arrivals_in_proportion() -> None:
    """Cap 3 on 2 workers: caps 2 and 1, and arrivals dealt 2:1 in schedule order."""
    cfgs = configs(spec_of({"kind": "poisson", "rate": 50.0, "concurrency": 3}, 12), 2)
    assert [c.cap for c in cfgs] == [2, 1]
    assert [len(c.items) for c in cfgs] == [8, 4]
    for c in cfgs:  # each worker's arrivals in schedule order
        offsets = [it[2] for it in c.items]
        assert offsets == sorted(offsets)


def test_uncapped_open_loop_keeps_plain_round_robin() -> None:
    cfgs = configs(spec_of({"kind": "poisson", "rate": 50.0}, 9), 3)
    assert [c.cap for c in cfgs] == [None] * 3 and [len(c.items) for c in cfgs] == [3, 3, 3]


def test_cap_holds_with_more_workers_than_the_cap() -> None:
    spec = spec_of({"kind": "poisson", "rate": 100.0, "concurrency": 1}, 10, out=8)
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=2)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=2, keep_text=False)
        res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    assert res.metrics.completed == 10
    assert res.metrics.max_in_flight == 1


# --- 3. the whole-run window and the sent rate -------------------------------------------


def constant_run(gap_ms: float, sched_gap_ms: float = 100.0) -> list[RequestRecord]:
    """10 requests scheduled every `sched_gap_ms`, sent every `gap_ms`, each ~2 s long:
    too few for a window, so the whole run (to the last end) is measured."""
    recs = []
    for i in range(10):
        sched, send = int(i * sched_gap_ms * MS), int(i * gap_ms * MS)
        chunks = [send + 200 * MS + k * 20 * MS for k in range(90)]
        recs.append(
            RequestRecord(
                index=i, scheduled_ns=sched, send_ns=send, end_ns=chunks[-1] + MS,
                chunk_ns=chunks, chunk_tokens=[1] * 90, status="ok",
                usage_completion_tokens=90, prompt_tokens=10,
            )
        )  # fmt: skip
    return recs


def test_whole_run_window_sent_rate_is_over_the_sends() -> None:
    """Sent on time: 10/s sent, as offered, and no client warning (over the whole run's
    window, drain included, it read 3.4/s and `sent < 98% of offered`)."""
    m = compute_metrics(constant_run(gap_ms=100.0))
    assert m.window_whole_run
    assert m.sent_req_s == pytest.approx(10.0) and m.offered_req_s == pytest.approx(10.0)
    assert client_warnings(m, open_loop=True, cpu_util=0.05) == []


def test_whole_run_window_still_shows_a_client_that_falls_behind() -> None:
    m = compute_metrics(constant_run(gap_ms=200.0))
    assert m.window_whole_run and m.sent_req_s == pytest.approx(5.0)
    assert any("sent 5.0 req/s" in w for w in client_warnings(m, open_loop=True, cpu_util=0))


# --- 4. a trace out of timestamp order ---------------------------------------------------


def test_trace_lines_out_of_order_are_sent_in_time_order(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [(1000, 1), (0, 2), (500, 3), (1500, 4)]
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 20, "output_length": 5, "hash_ids": [h]})
            + "\n"
            for t, h in rows
        )
    )
    spec = parse_workload(
        {"name": "tr", "seed": 0, "api": "completions", "arrival": {"kind": "trace"},
         "trace": {"path": str(trace), "block_tokens": 16}}
    )  # fmt: skip
    opts = BenchOptions(url="http://127.0.0.1:1", keep_text=False)
    items = build_items(spec, materialize(spec, WordTokenizer()), opts)
    assert [it[2] for it in items] == [0, 500 * MS, 1000 * MS, 1500 * MS]


# --- 5. a final usage on the last content chunk ------------------------------------------


def sse(chunks: list[bytes], headers: dict[str, str] | None = None) -> RequestState:
    st = RequestState(0, stream=True, on_done=lambda _: None, timeouts=Timeouts())
    st.send_ns = 1
    st.on_headers(200, headers or {"content-type": "text/event-stream"}, 2)
    t = 10
    for c in chunks:
        st.on_body(c, t)
        t += 10
    st.on_end(t)
    return st


def ev(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def content(text: str, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}], **extra}


FIN = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


def test_final_usage_on_the_last_content_chunk_adds_only_the_rest() -> None:
    """TGI puts the final usage on its last content chunk: that chunk is 1 token, not 20
    (chunk tokens summed to 39 while usage said 20, and skewed itl_per_token_ms)."""
    last = {
        "choices": [{"index": 0, "delta": {"content": "end"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 20},
    }
    st = sse([ev(content(f"t{i} ")) for i in range(19)] + [ev(last), b"data: [DONE]\n\n"])
    assert st.status == RequestStatus.OK
    assert st.chunk_tokens == [1] * 20 and st.usage_completion == 20


def test_continuous_usage_still_gives_multi_token_chunks() -> None:
    chunks = [ev(content("ab", usage={"completion_tokens": n})) for n in (2, 4, 6)]
    st = sse(chunks + [ev(FIN), b"data: [DONE]\n\n"])
    assert st.chunk_tokens == [2, 2, 2]


# --- 6. the API key and the URL path in the request head ---------------------------------


@pytest.mark.parametrize("key", ["sk-ключ", "sk-abc\r\nX-Injected: 1", "sk-abc\n"])
def test_an_api_key_a_header_cannot_carry_is_refused_in_one_line(key: str) -> None:
    with mock_in_thread(MockConfig()) as srv, pytest.raises(InputError) as exc:
        check_server(f"http://127.0.0.1:{srv.port}", api_key=key, timeout_s=5)
    assert exc.value.field == "--api-key-env"
    assert key.strip() not in str(exc.value)  # a secret is never echoed


def test_a_header_value_with_a_line_break_is_never_serialised() -> None:
    with pytest.raises(ValueError, match="line break"):
        Target("http://h:1").request_bytes("/v1/models", b"", {"Authorization": "a\r\nX: 1"})


def test_a_non_ascii_url_path_is_percent_encoded() -> None:
    head = Target("http://h:1/пусть").request_bytes("/v1/completions", b"")
    assert head.startswith(b"POST /%D0%BF%D1%83%D1%81%D1%82%D1%8C/v1/completions HTTP/1.1")
    assert Target("http://h:1/a%20b").base_path == "/a%20b"  # escapes kept, not doubled


def test_a_non_ascii_url_path_is_checked_without_a_traceback() -> None:
    with mock_in_thread(MockConfig()) as srv:
        check_server(f"http://127.0.0.1:{srv.port}/пусть", timeout_s=5)  # a 404 passes


# --- 7. a base URL ending in /v1 ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [("http://h:1/v1", ""), ("http://h:1/v1/", ""), ("http://h:1/gw/v1", "/gw"),
     ("http://h:1/v1beta", "/v1beta")],
)  # fmt: skip
def test_a_trailing_v1_is_dropped_from_the_base_path(url: str, path: str) -> None:
    assert Target(url).base_path == path


def test_a_v1_base_url_is_served() -> None:
    spec = spec_of({"kind": "poisson", "rate": 50.0}, 4)
    with mock_in_thread(MockConfig(ttft_ms=1, itl_ms=0.2)) as srv:
        url = f"http://127.0.0.1:{srv.port}/v1"
        check_server(url, timeout_s=5)
        res = run_point(spec, materialize(spec, WordTokenizer()), BenchOptions(url=url))
    assert res.metrics.completed == 4 and res.metrics.failed == 0


# --- 8. SSE leniencies --------------------------------------------------------------------


@pytest.mark.parametrize(
    "done", [b"data: [DONE] \n\n", b"data:\t[DONE]\n\n", b"data: [DONE]\t\n\n"]
)
def test_done_with_whitespace_ends_the_stream(done: bytes) -> None:
    st = sse([ev(content("a")), ev(content("b")), ev(FIN), done])
    assert st.status == RequestStatus.OK and st.error is None
    assert st.chunk_tokens == [1, 1]


def test_a_mixed_case_event_stream_content_type_is_a_stream() -> None:
    """Media types are case-insensitive (RFC 9110): `Text/Event-Stream` was read as a JSON
    answer and the stream failed as malformed."""
    st = sse(
        [ev(content("a")), ev(content("b")), ev(content("c")), ev(FIN), b"data: [DONE]\n\n"],
        {"content-type": "Text/Event-Stream; charset=utf-8"},
    )
    assert st.status == RequestStatus.OK
    assert st.chunk_ns == [10, 20, 30]  # each chunk timed as it came


@pytest.mark.parametrize(
    ("url", "host"),
    [("http://[::1]:8000", "[::1]:8000"), ("http://[::1]", "[::1]"),
     ("http://127.0.0.1:8000", "127.0.0.1:8000"), ("https://example.com", "example.com")],
)  # fmt: skip
def test_the_host_header_brackets_an_ipv6_literal(url: str, host: str) -> None:
    assert f"\r\nHost: {host}\r\n".encode() in Target(url).request_bytes("/v1/models", b"", {})
