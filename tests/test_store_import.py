"""`runs import` / `runs export` keep what a run is, and a run that never finished shows the
same figures everywhere (list, show, CSV export): each test reproduces a bug-hunt finding."""

from __future__ import annotations

import csv
import json
import socket
import sqlite3
from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.results.schema import Target
from servetune.status import RunStatus
from servetune.store import Store
from synthetic_runs import synthetic_run


def _killed_run(db: Path, monkeypatch: pytest.MonkeyPatch, n: int = 22) -> str:
    """A bench killed after `n` records: begun by a writer that is gone, records committed,
    no final result."""
    dead = f"{socket.gethostname()}:999999999:1"  # no such pid on this host
    monkeypatch.setattr("servetune.store.store.writer_token", lambda: dead)
    result, meta = synthetic_run(4, n_requests=40, seed=3)
    with Store.open(str(db)) as store:
        rid = store.begin_run(meta.model_copy(update={"study": "killed"}))
        store.append_records(rid, result.records[:n])
    return rid


def test_a_killed_run_has_one_set_of_figures(
    capsys: pytest.CaptureFixture[str], db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rid = _killed_run(db, monkeypatch)
    with Store.open(str(db), create=False) as store:
        assert store.get(rid).status == RunStatus.INCOMPLETE
        want = store.load_result(rid).metrics  # what `runs show` and diagnose read
    assert want.ttft_ms.count == 22 and want.output_tok_s > 0

    code, out, _ = run_cli(capsys, "runs", "list", "--json")
    row = json.loads(out)[0]
    assert code == 0 and row["status"] == "incomplete"
    assert row["metrics"]["ttft_ms.p99"] == want.ttft_ms.p99
    assert row["metrics"]["output_tok_s"] == want.output_tok_s
    code, out, _ = run_cli(capsys, "runs", "list")
    assert code == 0 and " 22 " in out  # n, not `-`

    csv_path = tmp_path / "runs.csv"
    code, _, _ = run_cli(capsys, "runs", "export", rid, "-o", str(csv_path))
    (exported,) = list(csv.DictReader(csv_path.open()))
    assert code == 0 and float(exported["ttft_ms_p99"]) == pytest.approx(want.ttft_ms.p99)
    assert float(exported["output_tok_s"]) == pytest.approx(want.output_tok_s)


def _show(capsys: pytest.CaptureFixture[str], rid: str, db: Path) -> dict:
    code, out, err = run_cli(capsys, "runs", "show", rid, "--json", "--db", str(db))
    assert code == 0, err
    return json.loads(out)


def test_export_then_import_is_a_faithful_round_trip(
    capsys: pytest.CaptureFixture[str], db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    killed = _killed_run(db, monkeypatch)
    done, meta = synthetic_run(8, n_requests=40, seed=4)
    with Store.open(str(db)) as store:
        store.save_result(done, meta, study="kept", tags=["baseline"])
        store.conclude(done.id, "keep", "fast")
    with sqlite3.connect(db) as conn:  # concluded long before the import
        conn.execute(
            "UPDATE runs SET concluded_utc = '2026-01-02T03:04:05Z' WHERE id = ?", (done.id,)
        )
    export = tmp_path / "runs.json"
    code, _, err = run_cli(capsys, "runs", "export", "-f", "json", "-o", str(export))
    assert code == 0, err
    other = tmp_path / "other.db"
    code, _, err = run_cli(capsys, "runs", "import", str(export), "--db", str(other))
    assert code == 0, err

    keys = ("status", "stop_reason", "study", "tags", "created_utc", "n_records", "engine")
    keys += ("hardware", "conclusion", "conclusion_note", "concluded_utc", "metrics")
    for rid in (killed, done.id):
        a, b = _show(capsys, rid, db), _show(capsys, rid, other)
        assert {k: b[k] for k in keys} == {k: a[k] for k in keys}, rid
        assert b["meta"]["software"] == a["meta"]["software"]
    assert _show(capsys, killed, other)["status"] == "incomplete"  # not `interrupted`
    assert _show(capsys, done.id, other)["concluded_utc"] == "2026-01-02T03:04:05Z"


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("status", "bogus", "runs[0].status: 'bogus' is not one of running, completed"),
        ("concluded_utc", "someday", "runs[0].concluded_utc: not an ISO date/time"),
    ],
)
def test_a_bad_export_field_is_refused_before_anything_is_written(
    capsys: pytest.CaptureFixture[str],
    db: Path,
    tmp_path: Path,
    field: str,
    value: str,
    needle: str,
) -> None:
    result, meta = synthetic_run(2, n_requests=20)
    with Store.open(str(db)) as store:
        store.save_result(result, meta)
    export = tmp_path / "runs.json"
    assert run_cli(capsys, "runs", "export", "-f", "json", "-o", str(export))[0] == 0
    doc = json.loads(export.read_text())
    doc["runs"][0][field] = value
    export.write_text(json.dumps(doc))
    other = tmp_path / "other.db"
    code, out, err = run_cli(capsys, "runs", "import", str(export), "--db", str(other))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not other.exists()  # refused before the store is opened


def test_a_result_file_import_keeps_its_engine_device_and_knobs(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    result, _ = synthetic_run(4, n_requests=20, backend="sim")
    result.target = Target(
        model="llama-3.1-8b", engine="vllm", hardware="h100-sxm", config={"max_num_seqs": 64}
    )
    path = tmp_path / "sim.json"
    path.write_text(result.model_dump_json())
    code, _, err = run_cli(capsys, "runs", "import", str(path))
    assert code == 0, err
    shown = _show(capsys, result.id, db)
    assert shown["engine"] == "vllm"
    assert shown["hardware"] == "NVIDIA H100 80GB SXM5"
    assert shown["meta"]["engine_config"] == {"max_num_seqs": 64, "engine": "vllm"}
    # the file records no versions: unknown, not the importing host's
    software = shown["meta"]["software"]
    assert software["python"] is None and software["servetune"] is None
    assert software["servetune_build"] is None
    code, out, _ = run_cli(capsys, "runs", "show", result.id)
    assert "max_num_seqs=64" in out and "no engine config recorded" not in out


def test_a_record_log_with_only_its_header_imports_as_an_empty_interrupted_run(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    log = tmp_path / "bench.records.jsonl"
    head = {"id": "bench-20260101T000000-abcdef", "load": {"kind": "closed", "concurrency": 4}}
    log.write_text(json.dumps({"run": {**head, "url": "http://127.0.0.1:8000"}}) + "\n")
    code, out, err = run_cli(capsys, "runs", "import", str(log))
    assert code == 0 and "bench-20260101T000000-abcdef: imported" in out, err
    with Store.open(str(db), create=False) as store:
        info = store.get("bench-20260101T000000-abcdef")
    assert info.status == RunStatus.INTERRUPTED and info.n_records == 0
    assert info.created_utc == "2026-01-01T00:00:00Z" and info.concurrency == 4


def test_a_bad_file_among_several_imports_none_and_creates_no_store(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    """Every file is read before the store is opened: a bad second file used to leave the
    first imported alone, and a refused file an empty store behind."""
    good, _ = synthetic_run(4, n_requests=10, seed=5)
    first = tmp_path / "good.json"
    first.write_text(good.model_dump_json())
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    code, _, err = run_cli(capsys, "runs", "import", str(first), str(bad))
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: FILE: bad.json")
    assert not db.exists()
    code, out, err = run_cli(capsys, "runs", "import", str(first))
    assert code == 0 and f"{good.id}: imported" in out, err
