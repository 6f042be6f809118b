"""`servetune bench` end to end against the mock, and its one-line errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.mock.server import MockConfig, mock_in_thread
from servetune.results.files import load_result


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.paced  # its SLO verdicts read live TPOT from the mock
def test_bench_sweep_writes_results_csv_and_json(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(
        "count: 30\narrival: {kind: poisson, rate: 50}\n"
        "input_tokens: {dist: fixed, value: 20}\noutput_tokens: {dist: fixed, value: 6}\n"
    )
    # The mock answers in 5 ms and streams a token a ms; the SLO leaves a busy CI host
    # (the mock shares the test's process) 100x that, so only a broken run misses it.
    (tmp_path / "slo.yaml").write_text("ttft_ms: {p95: 3000, p99: 5000}\ntpot_ms: {p95: 200}\n")
    with mock_in_thread(MockConfig()) as srv:
        out = cli(
            "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(tmp_path / "w.yaml"),
            "--rate", "40,80", "--slo", str(tmp_path / "slo.yaml"), "--json", "--tokenizer", "word",
            "-o", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)
    assert [r["load"]["rate"] for r in runs] == [40.0, 80.0]
    assert [r["metrics"]["completed"] for r in runs] == [30, 30]
    assert [r["metrics"]["slo_pass"] for r in runs] == [True, True], [r["metrics"] for r in runs]
    # The mock reports no queue or prefill time: the split holds the client's parts only,
    # and they add up to the mean TTFT.
    split = runs[0]["ttft_split_ms"]
    assert split["queue_ms"] is None and split["prefill_ms"] is None
    assert split["connect_ms"] + split["rest_ms"] == pytest.approx(split["ttft_ms"])
    res = load_result(tmp_path / "r-rate40.json")
    assert len(res.records) == 30 and len(res.requests) == 30
    assert res.records[0].output_text is None  # text not stored unless --save-text
    assert res.server is not None and "mock:requests_total" in res.server.deltas
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 60 and float(rows[0]["ttft_ms"]) > 0
    # -o r.json named no file of the sweep: it says what it became, and a command given
    # r.json names the point files instead of a bare "no such file"
    said = f"wrote 2 result files, one per point: r-rate40.json, r-rate80.json in {tmp_path}"
    assert said in out.stderr, out.stderr
    for args in (["diagnose", "r.json"], ["calibrate", "r.json", "-m", "llama-3.1-8b",
                                          "-g", "h100-sxm", "-o", "p.json"]):  # fmt: skip
        bad = subprocess.run([sys.executable, "-m", "servetune.cli.app", *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "a sweep writes one file per point, here r-rate40.json, r-rate80.json" in (
            bad.stderr
        ), bad.stderr


def test_bench_input_and_output_len_fix_the_default_workloads_lengths(tmp_path: Path) -> None:
    """`bench --input-len 20 --output-len 6` sends the built-in workload at those lengths
    (`workload.spec.with_lengths`, the same function `simulate` reads)."""
    with mock_in_thread(MockConfig()) as srv:
        out = cli(
            "bench", "--url", f"http://127.0.0.1:{srv.port}", "--concurrency", "2",
            "--count", "6", "--input-len", "20", "--output-len", "6", "--tokenizer", "word",
            "--no-store", "-o", str(tmp_path / "r.json"),
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = load_result(tmp_path / "r.json")
    assert res.workload["name"] == "default-chat" and len(res.requests) == 6
    assert {r.prompt_tokens for r in res.requests} == {20}
    assert {r.output_tokens for r in res.requests} == {6}


def test_a_breaker_stop_keeps_what_it_measured_and_exits_1(tmp_path: Path) -> None:
    """Every request fails: the breaker stops the first point, the sweep ends there, its
    records are written, and the exit status says so (it was 0, like a clean sweep)."""
    (tmp_path / "w.yaml").write_text(
        "count: 60\ninput_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 4}\n"
    )
    with mock_in_thread(MockConfig(faults={"http_500": 1.0})) as srv:
        out = cli(
            "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(tmp_path / "w.yaml"),
            "--rate", "40,80", "--tokenizer", "word", "--no-store", "-o", str(tmp_path / "r.json"),
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: circuit breaker")
    assert load_result(tmp_path / "r-rate40.json").records
    assert not (tmp_path / "r-rate80.json").exists()


def test_bad_workload_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(
        "count: 3\narrival: {kind: poisson}\ninput_tokens: {dist: fixed}\n"
    )
    out = cli("bench", "--url", "http://127.0.0.1:9", "-w", str(tmp_path / "w.yaml"))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "workload" in out.stderr
    (tmp_path / "slo.yaml").write_text("ttft_ms: {p95: -1}\n")
    out = cli("bench", "--url", "http://x:1", "--slo", str(tmp_path / "slo.yaml"))
    assert out.returncode == 2 and "slo.ttft_ms.p95" in out.stderr


def test_unreachable_server_fails_fast_with_the_cause(tmp_path: Path) -> None:
    out = cli(
        "bench", "--url", "http://127.0.0.1:9", "--count", "100", "--rate", "200", "--json",
        "--tokenizer", "word", "--no-scrape",
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (
        "error: --url: connection refused at 127.0.0.1:9 (is the server running at that address?)"
    )
