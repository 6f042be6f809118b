"""The streaming client against the mock: response formats, token counts, HTTP framing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servetune.bench.http import Connection, Pool, Target
from servetune.bench.runner import BenchOptions, run_point
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer


def bench(cfg: MockConfig, *, api: str = "chat", stream: bool = True, count: int = 8, **opts):
    spec = parse_workload(
        {"api": api, "stream": stream, "count": count,
         "arrival": {"kind": "closed", "concurrency": 2},
         "input_tokens": {"dist": "uniform", "low": 5, "high": 50},
         "output_tokens": {"dist": "fixed", "value": 12}}
    )  # fmt: skip
    with mock_in_thread(cfg) as srv:
        o = BenchOptions(
            url=f"http://127.0.0.1:{srv.port}", workers=1, tokenizer=WordTokenizer(), **opts
        )
        return run_point(spec, materialize(spec, WordTokenizer()), o)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_stream_counts_match_usage_and_tokenizer(api: str) -> None:
    res = bench(MockConfig(ttft_ms=20, itl_ms=2), api=api)
    assert res.metrics.completed == 8
    for r in res.records:
        assert r.usage_completion_tokens == 12 == len(r.chunk_ns) == r.tokenizer_completion_tokens
        assert r.usage_prompt_tokens == r.prompt_tokens  # exact prompt lengths reach the server
        assert r.finish_reason == "length"
        ttft = (r.chunk_ns[0] - r.send_ns) / 1e6
        assert ttft >= 20.0  # never below the server's true TTFT (the mock is never early)
        if api == "chat":  # the role-only chunk arrives first and is not TTFT
            assert r.first_event_ns is not None and r.first_event_ns < r.chunk_ns[0]
    assert res.metrics.token_count_mismatched == 0


@pytest.mark.parametrize("stream", [True, False])
def test_the_mock_says_length_only_when_it_stopped_at_max_tokens(stream: bool) -> None:
    """An answer that ends before the request's max_tokens (the mock's --output-tokens 5
    against max_tokens 12: the model's own end) is "stop", as a real server says it; one
    that runs to max_tokens is "length". The mock said "length" always."""
    short = bench(MockConfig(ttft_ms=5, itl_ms=1, output_tokens=5), stream=stream, count=4)
    assert short.metrics.completed == 4
    assert {(r.output_tokens, r.finish_reason) for r in short.records} == {(5, "stop")}
    full = bench(MockConfig(ttft_ms=5, itl_ms=1), stream=stream, count=4)
    assert {(r.output_tokens, r.finish_reason) for r in full.records} == {(12, "length")}
    # a model that would run longer (30) stops at the cap (12), as a real server does; the
    # mock used to send all 30 past the request's max_tokens
    long = bench(MockConfig(ttft_ms=5, itl_ms=1, output_tokens=30), stream=stream, count=4)
    assert {(r.output_tokens, r.finish_reason) for r in long.records} == {(12, "length")}


def test_non_stream() -> None:
    res = bench(MockConfig(ttft_ms=5, itl_ms=1), stream=False)
    assert res.metrics.completed == 8
    r = res.records[0]
    assert len(r.chunk_ns) == 1 and r.chunk_tokens == [12] and r.output_tokens == 12
    assert res.metrics.tpot_ms.count == 0


def test_multi_token_chunks_with_and_without_continuous_usage() -> None:
    res = bench(MockConfig(tokens_per_chunk=3), continuous_usage=True)
    assert all(r.chunk_tokens == [3, 3, 3, 3] for r in res.records)
    assert res.metrics.itl_per_token_ms.count == 3 * res.metrics.itl_ms.count
    res = bench(MockConfig(tokens_per_chunk=3))
    r = res.records[0]
    assert r.chunk_tokens == [1, 1, 1, 1] and r.output_tokens == 12  # usage wins


def test_reasoning_counts_as_first_token_and_answer_is_marked() -> None:
    res = bench(MockConfig(reasoning_tokens=4, itl_ms=2))
    r = res.records[0]
    assert len(r.chunk_ns) == 12
    assert r.first_answer_ns == r.chunk_ns[4] > r.chunk_ns[0]


def test_server_closing_after_each_response(tmp_path: Path) -> None:
    log = tmp_path / "r.records.jsonl"
    res = bench(MockConfig(close_after_response=True), count=10, records_path=log)
    assert res.metrics.completed == 10 and res.metrics.failed == 0
    lines = log.read_text().splitlines()
    assert "run" in json.loads(lines[0]) and len(lines) == 11  # header + every record, flushed


@pytest.mark.parametrize("save_text", [False, True])
def test_the_record_log_holds_the_answers_text_only_with_save_text(
    tmp_path: Path, save_text: bool
) -> None:
    """The crash log is what `runs import` stores: without --save-text it had held every
    answer (kept in memory to count tokens), which the -o file and the store leave out."""
    log = tmp_path / "r.records.jsonl"
    res = bench(MockConfig(), count=4, records_path=log, save_text=save_text)
    assert res.metrics.completed == 4
    texts = [json.loads(line).get("output_text") for line in log.read_text().splitlines()[1:]]
    assert len(texts) == 4
    assert all(t for t in texts) if save_text else texts == [None] * 4
    assert all(r.tokenizer_completion_tokens == 12 for r in res.records)  # still counted


class _Sink:
    def __init__(self) -> None:
        self.status = 0
        self.body = b""
        self.ended = False
        self.failed: str | None = None

    def on_headers(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.status = status

    def on_body(self, data: bytes, now_ns: int) -> None:
        self.body += data

    def on_end(self, now_ns: int) -> None:
        self.ended = True

    def on_fail(self, kind: str, detail: str, now_ns: int) -> None:
        self.failed = kind


class _FakeTransport:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


RESPONSE = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    b'6\r\ndata: \r\n1a;ext=1\r\n{"choices":[]}\n\nabcdefghij\r\n0\r\nX-T: 1\r\n\r\n'
)


@pytest.mark.parametrize("split", range(1, len(RESPONSE)))
def test_chunked_parser_any_split(split: int) -> None:
    conn = Connection(Pool(Target("http://x:1")))
    conn.transport = _FakeTransport()  # type: ignore[assignment]
    sink = _Sink()
    conn.send(b"", sink)
    conn.data_received(RESPONSE[:split])
    conn.data_received(RESPONSE[split:])
    assert (sink.status, sink.ended, sink.failed) == (200, True, None)
    assert sink.body == b'data: {"choices":[]}\n\nabcdefghij'
    assert conn.pool.idle == [conn]  # keep-alive: back in the pool


def test_one_chunk_per_read_takes_the_fast_path_to_the_same_result() -> None:
    conn = Connection(Pool(Target("http://x:1")))
    conn.transport = _FakeTransport()  # type: ignore[assignment]
    sink = _Sink()
    conn.send(b"", sink)
    head = RESPONSE.partition(b"\r\n\r\n")[0]
    conn.data_received(head + b"\r\n\r\n")
    for piece in (b"6\r\ndata: \r\n", b'e\r\n{"choices":[]}\r\n', b"4\r\n\n\nab\r\n"):
        conn.data_received(piece)  # each read is exactly one chunk
    conn.data_received(b"0\r\n\r\n")
    assert (sink.status, sink.ended, sink.failed) == (200, True, None)
    assert sink.body == b'data: {"choices":[]}\n\nab'
    assert conn.pool.idle == [conn]


def test_bad_framing_is_malformed_not_a_crash() -> None:
    conn = Connection(Pool(Target("http://x:1")))
    conn.transport = _FakeTransport()  # type: ignore[assignment]
    sink = _Sink()
    conn.send(b"", sink)
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert sink.failed == "malformed_response"
