"""Bad input to `runs import`, `validate --published-file`, `mock-server` and `monitor
export`: one line naming the field and the fix, exit code 2, no traceback - and nothing
already measured is lost (a record log cut off by a killed bench still imports).
Each kind of input runs the CLI in its own process, as a user would (docs/errors.md);
the cases of a kind run it in this process (`run_cli`: no start-up per case), except
mock-server's, which would serve forever here if a bad flag got through."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli_run import run_cli
from tests.synthetic_runs import synthetic_run

from servetune.store import Store


def servetune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`servetune ARGS` in a fresh process; past `timeout` it is killed (a server that
    should never have started) and the test fails."""
    cmd = [sys.executable, "-m", "servetune.cli.app", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def assert_one_error(
    res: subprocess.CompletedProcess[str] | tuple[int, str, str], field: str
) -> None:
    """Exit code 2 and exactly one stderr line, `error: ` and the field, no traceback
    (`res`: a process, or `run_cli`'s code, stdout and stderr)."""
    code, _, err = res if isinstance(res, tuple) else (res.returncode, res.stdout, res.stderr)
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert field in lines[0] and "Traceback" not in err, err


# -- runs import: bench's record log and `runs export` JSON ---------------------------


def _record_log(path: Path, cut_at: int | None) -> str:
    """A bench record log of 5 records; `cut_at`: the line (1 = the header) written only
    half, as a bench killed mid-write leaves its last one. Returns the run id."""
    result, _ = synthetic_run(2, n_requests=5)
    rid = "bench-20260102T030405-aaaaaa"
    lines = [json.dumps({"run": {"id": rid, "url": "http://127.0.0.1:1"}})]
    lines += [r.model_dump_json() for r in result.records]
    if cut_at is not None:
        lines.insert(cut_at - 1, lines[-1][: len(lines[-1]) // 2])
    path.write_text("\n".join(lines))  # no final newline: the write never finished
    return rid


def test_a_record_log_cut_off_at_its_last_line_imports_its_records(tmp_path: Path) -> None:
    log, db = tmp_path / "run.records.jsonl", tmp_path / "s.db"
    rid = _record_log(log, cut_at=7)
    res = servetune("runs", "import", str(log), "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{rid}: imported"
    warning = res.stderr.strip()  # one line on stderr, where warnings go
    assert warning.startswith(f"warning: {rid}: the last line (7) of run.records.jsonl was cut")
    assert warning.endswith("5 records imported") and len(warning.splitlines()) == 1
    with Store.open(str(db)) as store:
        assert store.get(rid).n_records == 5


def test_a_bad_line_inside_a_record_log_is_named(tmp_path: Path) -> None:
    log, db = tmp_path / "run.records.jsonl", tmp_path / "s.db"
    _record_log(log, cut_at=4)
    res = servetune("runs", "import", str(log), "--db", str(db))
    assert_one_error(res, "line 4 is not JSON")
    with Store.open(str(db)) as store:
        assert store.list_runs() == []


EXPORTS = {
    "version_text": ({"servetune_export": "1", "runs": []}, "x.json.servetune_export"),
    "version_null": ({"servetune_export": None}, "x.json.servetune_export"),
    "run_number": ({"servetune_export": 1, "runs": [5]}, "x.json.runs[0]"),
    "runs_text": ({"servetune_export": 1, "runs": "abc"}, "x.json.runs:"),
    "no_result": ({"servetune_export": 1, "runs": [{"meta": {}}]}, "x.json.runs[0].result"),
}


@pytest.mark.parametrize("case", list(EXPORTS))
def test_a_malformed_export_names_its_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    doc, field = EXPORTS[case]
    f = tmp_path / "x.json"
    f.write_text(json.dumps(doc))
    args = ("runs", "import", str(f), "--db", str(tmp_path / "s.db"))
    assert_one_error(run_cli(capsys, *args) if case != "runs_text" else servetune(*args), field)


def test_an_unknown_status_lists_the_plain_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, _ = synthetic_run(2, n_requests=5)
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**json.loads(result.model_dump_json()), "status": "garbage"}))
    code, out, err = run_cli(capsys, "runs", "import", str(f), "--db", str(tmp_path / "s.db"))
    assert_one_error((code, out, err), "r.json.status")
    assert "'completed'" in err and "<RunStatus" not in err


# -- validate --published-file --------------------------------------------------------

ROW = {
    "id": "t-1",
    "source_url": "https://example.com/run",
    "source_title": "a run",
    "published": "2026",
    "engine": "vllm",
    "engine_version": "0.23.0",
    "model": "llama-3.1-8b",
    "source_model": "meta-llama/Llama-3.1-8B-Instruct",
    "gpu": "a100-40g-sxm",
    "tp": "1",
    "quantization": "",
    "kv_cache_dtype": "",
    "max_model_len": "",
    "isl": "1024",
    "osl": "128",
    "concurrency": "1",
    "requests": "20",
    "ttft_ms": "",
    "tpot_ms": "13.3",
    "stat": "derived",
    "role": "check",
    "note": "",
}
BAD_ROWS = {  # line 3's change -> the column the error names
    "concurrency": ({"concurrency": "100000000"}, "line 3.concurrency"),
    "quantization": ({"quantization": "bogus"}, "line 3.quantization"),
    "engine": ({"engine": "bogus"}, "line 3.engine"),
    "gpu": ({"gpu": "nosuchgpu"}, "line 3.gpu"),
    "model": ({"model": "nosuchmodel"}, "line 3.model"),
    "duplicate_id": ({"id": "t-1"}, "line 3.id"),
    "no_figure": ({"tpot_ms": ""}, "line 3.ttft_ms"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_bad_published_row_names_its_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    change, column = BAD_ROWS[case]
    rows = [ROW, {**ROW, "id": "t-2", **change}]
    f = tmp_path / "runs.csv"
    f.write_text("\n".join([",".join(ROW), *(",".join(r.values()) for r in rows)]) + "\n")
    args = ("validate", "--published", "--published-file", str(f), "--tier", "roofline")
    res = run_cli(capsys, *args) if case != "concurrency" else servetune(*args)
    assert_one_error(res, f"runs.csv {column}")


def test_a_binary_published_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "runs.csv"
    f.write_bytes(b"\x8c\x00\xff\xfe binary \x80")
    res = servetune("validate", "--published", "--published-file", str(f))
    assert_one_error(res, "--published-file")
    assert "not a text file" in res.stderr


# -- mock-server ----------------------------------------------------------------------

MOCK_FLAGS = {
    "port_negative": (["--port", "-1"], "--port"),
    "port_too_big": (["--port", "99999"], "--port"),
    "tokens_per_chunk": (["--tokens-per-chunk", "0"], "--tokens-per-chunk"),
    "ttft": (["--ttft-ms", "-5"], "--ttft-ms"),
    "itl_nan": (["--itl-ms", "nan"], "--itl-ms"),
    "jitter": (["--jitter-ms", "-1"], "--jitter-ms"),
    "output_tokens": (["--output-tokens", "-3"], "--output-tokens"),
    "fault_over_1": (["--fault", "http_500=5"], "--fault"),
    "host_unknown": (["--host", "not.a.host.invalid"], "--host"),
    "host_not_here": (["--host", "192.0.2.1"], "--host"),  # TEST-NET-1: no machine's own
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", list(MOCK_FLAGS))
def test_mock_server_refuses_a_bad_flag(case: str) -> None:
    args, flag = MOCK_FLAGS[case]
    port = [] if "--port" in args else ["--port", str(free_port())]
    assert_one_error(servetune("mock-server", *port, *args), flag)


def test_mock_server_on_a_port_in_use_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        res = servetune("mock-server", "--port", str(taken.getsockname()[1]))
    assert_one_error(res, "--port")
    assert "in use" in res.stderr


# -- monitor export -------------------------------------------------------------------

HAND = ["--engine", "vllm", "--queue-target", "8", "--kv-threshold", "0.85"]
MONITOR_FLAGS = {
    "name": ([*HAND, "--name", "Bad Name!"], "--name"),
    "name_too_long": ([*HAND, "--name", "a" * 64], "--name"),
    "namespace_empty": ([*HAND, "--namespace", ""], "--namespace"),
    "job_quote": ([*HAND, "--job", 'a"b'], "--job"),
    "job_backslash": ([*HAND, "--job", "a\\b"], "--job"),
    "job_newline": ([*HAND, "--job", "a\nb"], "--job"),
    "job_empty": ([*HAND, "--job", ""], "--job"),
    "engine_first": (["--engine", "bogus"], "--engine"),
}


@pytest.mark.parametrize("case", list(MONITOR_FLAGS))
def test_monitor_export_refuses_what_kubernetes_or_prometheus_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    args, flag = MONITOR_FLAGS[case]
    out = tmp_path / "mon"
    cli = ("monitor", "export", "-o", str(out), *args)
    assert_one_error(run_cli(capsys, *cli) if case != "job_quote" else servetune(*cli), flag)
    assert not out.exists()  # nothing written


def test_monitor_export_into_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("keep me")
    assert_one_error(servetune("monitor", "export", "-o", str(f), *HAND), "--out")
    assert f.read_text() == "keep me"
