"""A server that buffers its stream is caught by `bench`: flagged in the result, the
summary and the report, with TTFT/TPOT/ITL left unmeasured instead of reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from servetune.metrics.buffering import buffered_mask, run_is_buffered
from servetune.metrics.compute import compute_metrics, tpot_note
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.report.html import _at_once_section, _buffered_section
from servetune.results.files import load_result
from servetune.results.schema import RequestRecord

MS = 1_000_000


def bench(tmp_path: Path, cfg: MockConfig, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "w.yaml").write_text(
        "count: 6\narrival: {kind: closed, concurrency: 2}\n"
        "input_tokens: {dist: fixed, value: 20}\noutput_tokens: {dist: fixed, value: 8}\n"
    )
    (tmp_path / "slo.yaml").write_text("ttft_ms: {p95: 5000}\ne2e_ms: {p95: 5000}\n")
    with mock_in_thread(cfg) as srv:
        return subprocess.run(
            [
                sys.executable, "-m", "servetune.cli.app", "bench",
                "--url", f"http://127.0.0.1:{srv.port}", "-w", str(tmp_path / "w.yaml"),
                "--slo", str(tmp_path / "slo.yaml"), "--tokenizer", "word", "--no-scrape",
                "-o", str(tmp_path / "r.json"), *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},  # the summary table on one line per row
        )  # fmt: skip


@pytest.mark.timeout(120)
def test_buffered_mock_is_flagged_and_token_timing_left_empty(tmp_path: Path) -> None:
    out = bench(tmp_path, MockConfig(ttft_ms=20, itl_ms=10, buffer_stream=True), "--json")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["metrics"]
    assert m["stream_buffered"] and m["stream_buffered_requests"] == m["completed"] == 6
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "itl_per_token_ms"):
        assert m[name]["count"] == 0 and m[name]["p50"] is None, name
    assert m["e2e_ms"]["count"] == 6 and m["e2e_ms"]["p50"] >= 80  # 20 + 7 x 10 ms
    checks = {c["metric"]: c for c in m["slo_checks"]}
    assert not checks["ttft_ms"]["ok"] and "buffered" in checks["ttft_ms"]["note"]
    assert checks["e2e_ms"]["ok"] and "buffered" not in (checks["e2e_ms"]["note"] or "")
    assert m["goodput_req_s"] == 0 and m["slo_attainment"] == 0  # nothing proves the TTFT
    assert load_result(tmp_path / "r.json").metrics.stream_buffered


@pytest.mark.timeout(120)
def test_same_mock_streaming_token_by_token_is_measured(tmp_path: Path) -> None:
    out = bench(tmp_path, MockConfig(ttft_ms=20, itl_ms=10), "--json")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["metrics"]
    assert not m["stream_buffered"]
    # A client starved of CPU for ~70 ms over one answer reads its chunks in one burst and
    # that request is judged held; one stall spans at most the 2 answers in flight. A
    # server that buffers holds all 6.
    assert m["stream_buffered_requests"] < 3, m["stream_buffered_requests"]
    assert m["ttft_ms"]["count"] == 6 and m["itl_ms"]["count"] == 6 * 7


@pytest.mark.timeout(120)
def test_summary_table_says_buffered(tmp_path: Path) -> None:
    out = bench(tmp_path, MockConfig(ttft_ms=20, itl_ms=10, buffer_stream=True))
    assert out.returncode == 0, out.stderr
    assert "BUFFERED" in out.stdout and "not measurable" in out.stdout


@pytest.mark.timeout(120)
def test_answers_too_short_to_judge_that_came_at_once_leave_tpot_and_say_so(
    tmp_path: Path,
) -> None:
    """Held 8-token answers of ~12 ms: too short for the buffered rule (50 ms), so the run
    is not flagged, but every answer came all at once: no TPOT (it read ~0 before), and
    bench says how many answers its TPOT leaves out."""
    out = bench(tmp_path, MockConfig(ttft_ms=5, itl_ms=1, buffer_stream=True))
    assert out.returncode == 0, out.stderr
    m = load_result(tmp_path / "r.json").metrics
    assert not m.stream_buffered and m.completed == 6
    assert m.tpot_ms.count == 0 and m.tpot_at_once_requests == 6 and m.ttft_ms.count == 6
    assert "6 of 6 answers came all at once" in " ".join(out.stderr.split())


def _mask(
    first_ms: list[float],
    last_ms: list[float],
    tokens: list[int],
    chunks: list[int] | None = None,
    largest_gap_ms: list[float] | None = None,
) -> np.ndarray:
    """Which requests are judged buffered; `chunks`: content events (default: a token each),
    `largest_gap_ms`: the longest wait between two of them (default: none)."""
    n = len(first_ms)
    _, held, _ = buffered_mask(
        np.zeros(n, dtype=np.int64),
        (np.array(first_ms) * MS).astype(np.int64),
        (np.array(last_ms) * MS).astype(np.int64),
        np.array(tokens),
        np.ones(n, dtype=bool),
        np.array(chunks if chunks is not None else tokens),
        (np.array(largest_gap_ms or [0.0] * n) * MS).astype(np.int64),
    )
    return held


def test_only_chunks_bunched_at_the_end_of_a_long_answer_count() -> None:
    held = _mask(
        [500.0, 100.0, 100.0, 10.0, 300.0],
        [500.2, 107.0, 100.1, 10.1, 300.0],
        [64, 8, 2, 16, 1],
    )
    # 64 tokens in 0.2 ms after 500 ms: buffered. 8 tokens over 7 ms (1 ms/token): a real
    # decode. 2 tokens or 1 token: too few to judge. 10 ms E2E: too short to judge.
    assert held.tolist() == [True, False, False, False, False]


def test_fast_multi_token_decode_is_not_buffering() -> None:
    # 4 tokens in 3 ms after a 2 s prefill: 1 ms/token, a real (fast) decode.
    assert _mask([2000.0], [2003.0], [4]).tolist() == [False]


def test_merged_deltas_of_an_engine_that_fell_behind_are_measured() -> None:
    # 24 tokens in one event, or two events of 12, after 400 ms: the engine's output loop
    # ran late and merged them (vLLM on a busy host), the first token really came that
    # late. 24 tokens in 24 events at once: a held stream.
    held = _mask([400.0, 400.0, 400.0], [400.0, 400.1, 400.2], [24, 24, 24], [1, 2, 24])
    assert held.tolist() == [False, False, True]


def test_one_late_read_inside_a_burst_is_still_a_burst() -> None:
    # 24 chunks after 1.8 s, 23 gaps of 0 and one of 14.7 ms (the client descheduled once
    # while parsing): held. A real decode of 24 tokens at 2 ms a step whose longest gap is
    # 14.7 ms still spans 44 ms without it: measured.
    held = _mask([1800.0, 1800.0], [1814.7, 1860.7], [24, 24], None, [14.7, 14.7])
    assert held.tolist() == [True, False]


def test_largest_gap_is_per_record_and_never_across_records() -> None:
    from servetune.metrics.compute import FlatChunks

    ns = np.array([0, 1, 2, 100, 5000, 5003, 5010], dtype=np.int64)  # records of 4, 0, 1, 2
    chunks = FlatChunks(ns, np.ones(len(ns), dtype=np.int64), np.array([4, 0, 1, 2]))
    # record 0: gaps 1, 1, 98; record 3 (5003 -> 5010): 7; none across 100 -> 5000 -> 5003
    assert chunks.largest_gap_ns().tolist() == [98, 0, 0, 7]


def test_run_verdict_needs_most_judged_requests() -> None:
    assert run_is_buffered(10, 5) and not run_is_buffered(10, 4) and not run_is_buffered(0, 0)
    # a few answers streamed token by token prove the server streams: 3 (or a tenth)
    assert run_is_buffered(24, 22, 2) and not run_is_buffered(24, 13, 3)
    assert not run_is_buffered(60, 50, 6) and run_is_buffered(60, 55, 5)


def _record(i: int, send_ms: float, chunk_ms: list[float]) -> RequestRecord:
    ns = [int((send_ms + t) * MS) for t in chunk_ms]
    return RequestRecord(
        index=i, send_ns=int(send_ms * MS), chunk_ns=ns, chunk_tokens=[1] * len(ns),
        end_ns=ns[-1], usage_completion_tokens=len(ns),
    )  # fmt: skip


def test_stalls_on_a_busy_host_are_not_a_buffering_server() -> None:
    """vLLM-CPU beside the test suite (CI, 2026-12): 13 of 24 answers came whole in one
    burst when the API server or client stalled, the rest a token every 17 ms. The server
    streams: TTFT is measured, the stalled answers' late first tokens included; TPOT of the
    streamed answers only (a burst 0.01 ms a token is no decode: metrics.compute.has_tpot;
    before, P50 TPOT read 0.01 ms)."""
    stalled = [_record(i, 10.0 * i, [400.0 + 0.01 * k for k in range(16)]) for i in range(13)]
    streamed = [_record(i, 10.0 * i, [60.0 + 17 * k for k in range(16)]) for i in range(13, 24)]
    m = compute_metrics(stalled + streamed, stream=True)
    assert not m.stream_buffered and m.stream_buffered_requests == 13
    assert m.ttft_ms.count == 24 and m.ttft_ms.max == pytest.approx(400.0)
    assert m.tpot_ms.count == 11 and m.tpot_ms.p50 == pytest.approx(17.0)
    assert m.tpot_at_once_requests == 13
    assert (tpot_note(m) or "").startswith("13 of 24 answers came all at once")
    # the same 24 all held: a buffering server, nothing but E2E measured
    m = compute_metrics([_record(i, 10.0 * i, [400.0 + 0.01 * k for k in range(16)])
                         for i in range(24)], stream=True)  # fmt: skip
    assert m.stream_buffered and m.ttft_ms.count == 0 and m.e2e_ms.count == 24


def test_report_names_the_buffered_runs() -> None:
    def run(rid: str, buffered: bool) -> SimpleNamespace:
        metrics = SimpleNamespace(stream_buffered=buffered, stream_buffered_requests=6)
        return SimpleNamespace(
            letter="A", info=SimpleNamespace(id=rid), result=SimpleNamespace(metrics=metrics)
        )

    html = _buffered_section(SimpleNamespace(runs=[run("r-held", True), run("r-ok", False)]))  # type: ignore[arg-type]
    assert "not measurable" in html and "r-held" in html and "r-ok" not in html
    assert _buffered_section(SimpleNamespace(runs=[run("r-ok", False)])) == ""  # type: ignore[arg-type]


def test_report_says_which_runs_tpot_leaves_answers_out_of() -> None:
    held = [_record(i, 10.0 * i, [400.0 + 0.01 * k for k in range(16)]) for i in range(13)]
    streamed = [_record(i, 10.0 * i, [60.0 + 17 * k for k in range(16)]) for i in range(13, 24)]

    def run(rid: str, records: list[RequestRecord]) -> SimpleNamespace:
        result = SimpleNamespace(metrics=compute_metrics(records, stream=True))
        return SimpleNamespace(letter="B", info=SimpleNamespace(id=rid), result=result)

    runs = [run("r-held", held + streamed), run("r-ok", streamed)]
    html = _at_once_section(SimpleNamespace(runs=runs))  # type: ignore[arg-type]
    assert "r-held: 13 of 24 answers came all at once" in html and "r-ok" not in html
    assert _at_once_section(SimpleNamespace(runs=[run("r-ok", streamed)])) == ""  # type: ignore[arg-type]
