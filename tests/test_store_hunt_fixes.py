"""Experiment-store bug-hunt findings, each reproduced: `runs import` after the store failed
mid-run, imports that half-wrote a run or a file, an export that lost its study, runs of
one second in random order, newer files read silently, `runs list` filters, a killed run's
record, and deleting a study."""

from __future__ import annotations

import csv
import json
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cli_run import one_line_error as _one_line
from cli_run import run_cli
from servetune.errors import InputError
from servetune.results.schema import RequestRecord, RunResult
from servetune.status import RunStatus
from servetune.store import Store
from servetune.store.timestamps import utc_text
from servetune.store.transfer import read_import
from synthetic_runs import synthetic_run, synthetic_sweep

DEAD = f"{socket.gethostname()}:999999999:1"  # no such pid on this host: a killed writer


def _lost_run(db: Path, monkeypatch: pytest.MonkeyPatch, kept: int = 5) -> RunResult:
    """A bench whose store went away after `kept` of its records (database locked, then
    the writer ended): the run reads `incomplete`. Returns the bench's final result."""
    result, meta = synthetic_run(2, n_requests=30, seed=11)
    with monkeypatch.context() as m:
        m.setattr("servetune.store.store.writer_token", lambda: DEAD)
        with Store.open(str(db)) as store:
            store.begin_run(meta.model_copy(update={"study": "lost"}))
            store.append_records(result.id, result.records[:kept])
    return result


def _export(capsys: pytest.CaptureFixture[str], path: Path, *refs: str) -> dict[str, Any]:
    code, _, err = run_cli(capsys, "runs", "export", *refs, "-f", "json", "-o", str(path))
    assert code == 0, err
    return json.loads(path.read_text())


# -- 1: `runs import` finishes a run the store lost mid-way --------------------------------


def test_import_finishes_a_run_the_store_lost_mid_way(
    capsys: pytest.CaptureFixture[str], db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = _lost_run(db, monkeypatch)
    with Store.open(str(db), create=False) as store:
        assert store.get(result.id).status == RunStatus.INCOMPLETE
        assert store.get(result.id).n_records == 5
    partial = tmp_path / "partial.json"  # a file with fewer records than the store: kept
    short = result.model_copy(update={"records": result.records[:3]})
    partial.write_text(short.model_dump_json())
    code, out, err = run_cli(capsys, "runs", "import", str(partial))
    assert code == 0 and "skipped" in out and "more records" in out, (out, err)

    path = tmp_path / "result.json"  # what bench wrote beside the store
    path.write_text(result.model_dump_json())
    code, out, err = run_cli(capsys, "runs", "import", str(path), "--tag", "recovered")
    assert code == 0 and f"{result.id}: imported" in out, (out, err)
    with Store.open(str(db), create=False) as store:
        info = store.get(result.id)
        assert info.status == RunStatus.COMPLETED and info.n_records == 30
        assert info.study == "lost" and info.tags == ["recovered"]
        assert info.metrics is not None and info.metrics["ttft_ms"]["count"] > 5
        assert len(store.list_runs()) == 1
    code, out, _ = run_cli(capsys, "runs", "import", str(path))  # now final: skipped
    assert code == 0 and "skipped: already in the store" in out


# -- 2: a run that cannot be stored leaves nothing behind ----------------------------------


def test_an_out_of_range_record_field_is_refused_before_the_store(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    result, _ = synthetic_run(2, n_requests=10, seed=12)
    doc = json.loads(result.model_dump_json())
    doc["records"][3]["end_ns"] = 10**20
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "runs", "import", str(path))
    _one_line(code, err, "huge.json.records[3].end_ns", "100000000000000000000")
    assert not db.exists()


def test_save_result_is_one_transaction(db: Path) -> None:
    result, meta = synthetic_run(2, n_requests=10, seed=13)
    bad = result.records[2].model_copy(update={"end_ns": 10**20})  # the codec cannot hold it
    broken = result.model_copy(update={"records": [*result.records[:2], bad]})
    with Store.open(str(db)) as store:
        with pytest.raises(Exception):  # noqa: B017 - whatever the codec raises
            store.save_result(broken, meta)
        assert store.list_runs() == []  # no 0-record `incomplete` run left to block imports
        store.save_result(result, meta)
        assert store.get(result.id).n_records == 10


# -- 3: an export file is checked whole, and each run is written whole ---------------------


@pytest.mark.parametrize(
    ("part", "value"),
    [
        ("runs[1].meta.created_utc", "yesterday"),
        ("runs[1].result.created_utc", "no date"),
        ("runs[2].conclusion_note", {"x": 1}),
        ("runs[0].stop_reason", 5),
        ("runs[0].concluded_utc", 12345),
        ("runs[1].meta.tags", ["", " "]),
    ],
)
def test_a_bad_run_in_an_export_imports_nothing(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path, part: str, value: Any
) -> None:
    with Store.open(str(db)) as store:
        for r, m in synthetic_sweep((1, 2, 4), seed=2, n_requests=10):
            store.save_result(r, m, study="s")
    doc = _export(capsys, tmp_path / "all.json")
    *path, key = part.replace("[", ".").replace("]", "").split(".")
    obj = doc
    for p in path:
        obj = obj[int(p)] if p.isdigit() else obj[p]
    obj[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    other = tmp_path / "other.db"
    code, _, err = run_cli(capsys, "runs", "import", str(path), "--db", str(other))
    _one_line(code, err, f"bad.json.{part}")
    assert not other.exists()  # checked before the store is opened


def test_each_imported_run_is_written_whole(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    """A database that refuses a run's conclusion (here a trigger; in life a lock or a
    constraint) leaves none of that run: not a run without its verdict."""
    result, meta = synthetic_run(2, n_requests=10, seed=14)
    with Store.open(str(db)) as store:
        store.save_result(result, meta)
        store.conclude(result.id, "keep", "fast")
    doc = _export(capsys, tmp_path / "one.json")
    other = tmp_path / "other.db"
    Store.open(str(other)).close()
    con = sqlite3.connect(other)
    for event in ("INSERT", "UPDATE"):
        con.execute(
            f"CREATE TRIGGER no_verdict_{event} BEFORE {event} ON runs "
            "WHEN NEW.conclusion IS NOT NULL BEGIN SELECT RAISE(ABORT, 'no verdicts'); END"
        )
    con.commit()
    con.close()
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "runs", "import", str(path), "--db", str(other))
    _one_line(code, err, result.id, "one.json", "no verdicts")
    with Store.open(str(other), create=False) as store:
        assert store.list_runs() == []


# -- 4: an export keeps its studies' own record ---------------------------------------------


def test_export_import_keeps_the_study_meta(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    meta = {"fingerprint": "abc123", "settings": {"budget": 4}, "summary": {"best": "x"}}
    with Store.open(str(db)) as store:
        store.ensure_study("tuneA", kind="tune", note="first session")
        store.update_study_meta("tuneA", meta, kind="tune")
        for r, m in synthetic_sweep((1, 2), seed=3, n_requests=10):
            store.save_result(r, m, study="tuneA")
        want = next(s for s in store.studies() if s["name"] == "tuneA")
    doc = _export(capsys, tmp_path / "tune.json", "tuneA")
    other = tmp_path / "other.db"
    code, _, err = run_cli(
        capsys, "runs", "import", str(tmp_path / "tune.json"), "--db", str(other)
    )
    assert code == 0, err
    with Store.open(str(other), create=False) as store:
        assert store.study_meta("tuneA") == meta
        got = next(s for s in store.studies() if s["name"] == "tuneA")
    for key in ("kind", "note", "created_utc", "runs"):
        assert got[key] == want[key], key

    del doc["studies"]  # an export written before studies were exported still imports
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    third = tmp_path / "third.db"
    code, out, err = run_cli(capsys, "runs", "import", str(old), "--db", str(third))
    assert code == 0 and out.count(": imported") == 2, err


# -- 5 and 9: `runs list` filters ------------------------------------------------------------


def test_list_status_filter_comes_before_the_limit(
    capsys: pytest.CaptureFixture[str], db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = _lost_run(db, monkeypatch)
    newer, meta = synthetic_run(64, n_requests=10, seed=15)  # completed, and newer
    with Store.open(str(db)) as store:
        store.save_result(newer, meta.model_copy(update={"created_utc": "2099-01-01T00:00:00Z"}))
        assert store.list_runs()[-1].id == newer.id
    code, out, _ = run_cli(capsys, "runs", "list", "--status", "incomplete", "-n", "1", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [lost.id]


@pytest.mark.parametrize(
    "flag", [("--model", "x"), ("--tag", "t"), ("-n", "1"), ("--since", "2026-01-01")]
)
def test_list_studies_refuses_run_filters(
    capsys: pytest.CaptureFixture[str], db: Path, flag: tuple[str, str]
) -> None:
    Store.open(str(db)).close()
    code, _, err = run_cli(capsys, "runs", "list", "--studies", *flag)
    _one_line(code, err, flag[0], "--studies")


# -- 6: runs of one second keep the order they were stored in ---------------------------------


def test_runs_of_one_second_keep_their_order(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    ids = ["sim-f3", "sim-a1", "sim-c9", "sim-0b", "sim-e7", "sim-5d", "sim-b2", "sim-19"]
    with Store.open(str(db)) as store:
        for i, rid in enumerate(ids):
            r, m = synthetic_run(1, n_requests=5, seed=i)
            r.id = rid
            m = m.model_copy(update={"id": rid, "created_utc": "2026-02-01T00:00:00Z"})
            store.save_result(r, m, study="s")
        assert [i.id for i in store.list_runs()] == ids
        assert [i.id for i in store.list_runs(limit=3)] == ids[-3:]
        assert store.resolve(["last"]) == [ids[-1]]
        assert store.resolve(["s"]) == ids
    code, out, _ = run_cli(capsys, "runs", "compare", "s", "--json")
    assert code == 0 and json.loads(out)["runs"] == ids


def test_an_old_store_keeps_its_order_and_new_runs_come_last(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "compat_store.db"
    db = tmp_path / "old.db"
    db.write_bytes(data.read_bytes())
    con = sqlite3.connect(db)
    before = [r[0] for r in con.execute("SELECT id FROM runs ORDER BY created_utc, id")]
    last = con.execute("SELECT max(created_utc) FROM runs").fetchone()[0]
    con.close()
    with Store.open(str(db)) as store:
        assert [i.id for i in store.list_runs()] == before
        r, m = synthetic_run(1, n_requests=5, seed=1)
        r.id = m.id = "aaaa-new"  # sorts first by id, stored last in the same second
        store.save_result(r, m.model_copy(update={"created_utc": last}))
        assert [i.id for i in store.list_runs()] == [*before, "aaaa-new"]
        assert store.resolve(["last"]) == ["aaaa-new"]


# -- 7 and 8: files from a newer servetune, and a date that is no text ------------------------


def test_files_of_a_newer_servetune_are_refused(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    result, _ = synthetic_run(2, n_requests=5, seed=16)
    doc = json.loads(result.model_dump_json())
    doc["schema_version"] = 99
    path = tmp_path / "v99.json"
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "runs", "import", str(path))
    _one_line(code, err, "v99.json.schema_version", "newer servetune", "upgrade servetune")
    for version in (-3, 0):
        export = tmp_path / "exp.json"
        export.write_text(json.dumps({"servetune_export": version, "runs": []}))
        code, _, err = run_cli(capsys, "runs", "import", str(export))
        _one_line(code, err, "exp.json.servetune_export")
    assert not db.exists()


def test_a_date_that_is_not_text_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"concluded_utc: is a number, not an ISO date/time"):
        utc_text(12345, "concluded_utc")  # type: ignore[arg-type]


# -- 10: a killed run's record is the same in its store and imported elsewhere ----------------


def test_a_killed_run_shows_the_same_record_after_export_and_import(
    capsys: pytest.CaptureFixture[str], db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = _lost_run(db, monkeypatch, kept=25)
    _export(capsys, tmp_path / "k.json")
    other = tmp_path / "other.db"
    code, _, err = run_cli(capsys, "runs", "import", str(tmp_path / "k.json"), "--db", str(other))
    assert code == 0, err
    shown = []
    for where in (db, other):
        code, out, err = run_cli(capsys, "runs", "show", result.id, "--json", "--db", str(where))
        assert code == 0, err
        shown.append(json.loads(out))
    a, b = shown
    assert a["request_dist"]["input_tokens"] is not None
    assert a["request_dist"] == b["request_dist"] and a["stability"] == b["stability"]
    for made_up in ("duration_s", "started_unix_s"):  # the killed run never measured them
        assert made_up not in a["result"] and made_up not in b["result"]


# -- 11: deleting a study, and refs that name no runs -----------------------------------------


def test_deleting_a_study_deletes_it_and_an_empty_ref_is_refused(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    with Store.open(str(db)) as store:
        for r, m in synthetic_sweep((1, 2), seed=4, n_requests=5):
            store.save_result(r, m, study="simA")
        store.update_study_meta("simA", {"summary": "x"})
        store.ensure_study("empty")  # a study left with no runs (a tuner killed early)
    code, out, err = run_cli(capsys, "runs", "delete", "simA", "--yes")
    assert code == 0 and "deleted 2 run(s)" in out and "simA" in out, err
    code, out, _ = run_cli(capsys, "runs", "list", "--studies", "--json")
    assert [s["name"] for s in json.loads(out)] == ["empty"]
    with Store.open(str(db), create=False) as store:
        assert store.study_meta("simA") is None
    code, _, err = run_cli(capsys, "runs", "conclude", "simA", "keep")
    _one_line(code, err, "no run or study 'simA'")
    for args in (
        ("conclude", "empty", "keep"),
        ("tag", "empty", "x"),
        ("export", "empty", "-o", str(tmp_path / "e.csv")),
    ):
        code, _, err = run_cli(capsys, "runs", *args)
        _one_line(code, err, "'empty'", "no runs")
    assert not (tmp_path / "e.csv").exists()
    code, out, err = run_cli(capsys, "runs", "delete", "empty", "--yes")
    assert code == 0 and "deleted 0 run(s)" in out and "empty" in out, err
    code, out, _ = run_cli(capsys, "runs", "list", "--studies", "--json")
    assert json.loads(out) == []


# -- 12: blank tags, an export without runs, CSV sample sizes ---------------------------------


def test_an_export_without_runs_is_refused_and_leaves_no_store(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    path = tmp_path / "no_runs.json"
    path.write_text(json.dumps({"servetune_export": 1}))
    code, _, err = run_cli(capsys, "runs", "import", str(path))
    _one_line(code, err, "no_runs.json.runs", "missing")
    assert not db.exists()
    code, _, err = run_cli(capsys, "runs", "import", str(path), "--tag", " ")
    assert code == 2 and not db.exists()


def test_csv_export_carries_the_sample_size_of_each_percentile(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    result, meta = synthetic_run(2, n_requests=14, seed=17, error_rate=0.0)
    with Store.open(str(db)) as store:
        store.save_result(result, meta)
    path = tmp_path / "runs.csv"
    code, _, err = run_cli(capsys, "runs", "export", "-f", "csv", "-o", str(path))
    (row,) = list(csv.DictReader(path.open()))
    assert code == 0 and row["ttft_ms_count"] == str(result.metrics.ttft_ms.count) == "14", err


def test_read_import_names_each_record_field_out_of_range(tmp_path: Path) -> None:
    result, _ = synthetic_run(1, n_requests=5, seed=18)
    result.records[1] = RequestRecord.model_validate(
        {**result.records[1].model_dump(), "chunk_ns": [-(2**63) + 5]}
    )
    path = tmp_path / "r.json"
    path.write_text(result.model_dump_json())
    with pytest.raises(InputError, match=r"r\.json\.records\[1\]\.chunk_ns"):
        list(read_import(path))
