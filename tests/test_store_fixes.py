"""Experiment-store and report bug-hunt findings, each reproduced: outputs written over the
store or another file, a killed bench's record log imported without its SLO and warm-up, a
record log appended to, `runs list` filters, over-long tags, the pre-migration backup and
WAL, a study outliving its rolled-back run, and the §16 record and report charts."""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cli_run import one_line_error as _one_line
from cli_run import run_cli
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure.sweep import ResultFiles, StoreSettings
from servetune.results.files import RecordLog
from servetune.results.schema import RunResult, TelemetrySeries
from servetune.slo import SLO
from servetune.status import RequestStatus
from servetune.store import RunMeta, Store
from synthetic_runs import TOY_SLO, synthetic_run
from test_store_roundtrip import pg_url, store  # noqa: F401 - SQLite and PostgreSQL stores

DEAD = f"{socket.gethostname()}:999999999:1"  # no such pid on this host: a killed writer


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVETUNE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("COLUMNS", "250")


def _saved(tmp_path: Path, n: int = 1, **meta: Any) -> list[str]:
    ids = []
    with Store.open(str(tmp_path / "runs.db")) as s:
        for i in range(n):
            run, m = synthetic_run(2 + i, n_requests=20, seed=i)
            ids.append(s.save_result(run, m.model_copy(update=meta)))
    return ids


# -- 1: -o never writes over the store or a file of another kind ---------------------------


@pytest.mark.parametrize("suffix", ["", "-wal", "-journal"])
def test_export_refuses_to_write_over_the_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    _saved(tmp_path)
    db = tmp_path / "runs.db"
    before = db.read_bytes()
    code, _, err = run_cli(capsys, "runs", "export", "-f", "json", "-o", f"{db}{suffix}")
    _one_line(code, err, "--output", "is the store's database")
    assert db.read_bytes() == before
    with Store.open(str(db), create=False) as s:
        assert len(s.list_runs()) == 1


def test_export_replaces_its_own_kind_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _saved(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("measured by hand: 12 ms\n")
    code, _, err = run_cli(capsys, "runs", "export", "-o", str(notes))
    _one_line(code, err, "--output", "exists and is not a CSV table")
    assert notes.read_text() == "measured by hand: 12 ms\n"
    for fmt_, name in (("csv", "a.csv"), ("json", "a.json")):  # an earlier export: replaced
        for _ in range(2):
            code, _, err = run_cli(capsys, "runs", "export", "-f", fmt_, "-o", name)
            assert code == 0, err
    code, _, err = run_cli(capsys, "runs", "export", "-f", "json", "-o", "a.csv")
    _one_line(code, err, "exists and is not a JSON result or export")


def test_a_sweep_refuses_its_files_before_it_measures(tmp_path: Path) -> None:
    """bench/simulate -o, --csv, --trace: each point's file, its record log, the store."""
    from servetune.measure.sweep import check_files

    db = tmp_path / "runs.db"
    _saved(tmp_path)
    settings = StoreSettings(str(db), "bench")
    with pytest.raises(InputError, match="store's database"):
        check_files(ResultFiles(output=db), ["rate1"], settings)
    with pytest.raises(InputError, match="store's database"):  # --no-store: the default file
        check_files(ResultFiles(csv=db), ["rate1"], None)
    (tmp_path / "w-rate2.json").write_bytes(db.read_bytes())  # a sweep's second point file
    with pytest.raises(InputError, match="w-rate2.json exists and is not a JSON"):
        check_files(ResultFiles(output=tmp_path / "w.json"), ["rate1", "rate2"], settings)
    (tmp_path / "t-rate1.csv").write_text("name: chat\n")
    with pytest.raises(InputError, match="--trace"):
        check_files(ResultFiles(trace=tmp_path / "t.csv"), ["rate1", "rate2"], settings)
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "r.records.jsonl").write_text('{"index": 0}\n')  # not a record log
    with pytest.raises(InputError, match="r.records.jsonl exists and is not a bench record"):
        check_files(ResultFiles(output=tmp_path / "r.json"), ["c1"], settings)
    (tmp_path / "r.records.jsonl").write_text('{"run": {"id": "x"}}\n')  # an earlier log
    check_files(ResultFiles(output=tmp_path / "r.json"), ["c1"], settings)


def test_bench_o_the_store_is_refused_and_the_store_kept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from servetune.mock.server import MockConfig, mock_in_thread

    _saved(tmp_path)
    db = tmp_path / "runs.db"
    before = db.read_bytes()
    wl = tmp_path / "w.yaml"
    wl.write_text(
        "count: 3\narrival: {kind: poisson, rate: 100}\n"
        "input_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 4}\n"
    )
    with mock_in_thread(MockConfig()) as srv:
        code, _, err = run_cli(
            capsys, "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(wl),
            "--tokenizer", "word", "-o", str(db),
        )  # fmt: skip
    _one_line(code, err, "--output", "is the store's database")
    assert db.read_bytes() == before


def test_the_report_check_is_the_shared_one(tmp_path: Path) -> None:
    from servetune.report.build import check_replaceable as report_check
    from servetune.results.files import check_replaceable

    page = tmp_path / "r.html"
    page.write_text("<!DOCTYPE html><html></html>")
    report_check(page, None)  # an earlier report: replaced
    with pytest.raises(InputError, match="exists and is not a JSON result"):
        check_replaceable(page, None, "--output", "json")
    with pytest.raises(InputError, match="--report: .* is the store's database"):
        report_check(tmp_path / "x.db-shm", str(tmp_path / "x.db"), "--report")


# -- 2: a killed bench's record log keeps its SLO and warm-up --------------------------------


def _killed_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RunResult, Path]:
    """A bench with a warm-up and an SLO killed after streaming 10 records to the store;
    its record log (written as bench writes it) holds all 40."""
    result, meta = synthetic_run(2, n_requests=40, seed=3)
    workload = {"name": "chat", "warmup_s": 2.0, "stream": True}
    meta = meta.model_copy(update={"workload": workload, "slo": TOY_SLO})
    with monkeypatch.context() as m:
        m.setattr("servetune.store.store.writer_token", lambda: DEAD)
        with Store.open(str(tmp_path / "runs.db")) as s:
            s.begin_run(meta)
            s.append_records(result.id, result.records[:10])
    log = tmp_path / "k.records.jsonl"
    rl = RecordLog(log)
    rl.header({"id": result.id, "load": result.load.model_dump(mode="json"), "url": "http://x"})
    rl.write([r.model_dump(mode="json") for r in result.records])
    rl.close()
    return result, log


def test_importing_a_killed_benchs_log_keeps_its_slo_and_warmup(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servetune.store.meta import records_metrics

    result, log = _killed_bench(tmp_path, monkeypatch)
    code, out, err = run_cli(capsys, "runs", "import", str(log))
    assert code == 0 and "finished" in out, err
    want = records_metrics(
        result.records, {"warmup_s": 2.0, "stream": True}, SLO.model_validate(TOY_SLO)
    )
    with Store.open(str(tmp_path / "runs.db"), create=False) as s:
        got = s.get(result.id).metrics
    assert got["slo_pass"] is not None and got["slo_pass"] == want.slo_pass
    assert got["measured"] == want.measured < 40  # the warm-up left out
    assert got["ttft_ms"]["p99"] == pytest.approx(want.ttft_ms.p99)


def test_a_log_header_with_workload_and_slo_imports_into_a_new_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = synthetic_run(2, n_requests=30, seed=4)
    log = tmp_path / "h.records.jsonl"
    head = {"id": result.id, "load": result.load.model_dump(mode="json")}
    head |= {"workload": {"warmup_s": 1.0}, "slo": TOY_SLO}
    lines = [json.dumps({"run": head})] + [r.model_dump_json() for r in result.records]
    log.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(capsys, "runs", "import", str(log), "--db", str(tmp_path / "new.db"))
    assert code == 0, err
    with Store.open(str(tmp_path / "new.db"), create=False) as s:
        info = s.get(result.id)
    assert info.metrics["slo_pass"] is not None
    assert info.part("slo") and info.part("workload")["warmup_s"] == 1.0
    bare = tmp_path / "bare.records.jsonl"  # a header without them: said, not guessed
    lines[0] = json.dumps({"run": {"id": "bench-bare"}})
    bare.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(capsys, "runs", "import", str(bare), "--db", str(tmp_path / "new.db"))
    assert code == 0, err
    with Store.open(str(tmp_path / "new.db"), create=False) as s:
        info = s.get("bench-bare")
    assert info.stop_reason.endswith(
        "no workload or SLO recorded: no warm-up left out, no SLO judged"
    )
    assert info.metrics["slo_pass"] is None


# -- 3: one record log per run ----------------------------------------------------------------


def test_a_second_run_starts_the_record_log_afresh(tmp_path: Path) -> None:
    log = tmp_path / "same.records.jsonl"
    for rid in ("first", "second"):
        rl = RecordLog(log)
        rl.header({"id": rid})
        rl.write([{"index": 0}])
        rl.close()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == {"run": {"id": "second"}}


def test_an_appended_log_names_the_second_header(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = synthetic_run(2, n_requests=4, seed=5)
    recs = [r.model_dump_json() for r in result.records]
    log = tmp_path / "two.records.jsonl"
    head = json.dumps({"run": {"id": result.id}})
    log.write_text("\n".join([head, *recs[:2], head.replace(result.id, "b2"), *recs[2:]]) + "\n")
    code, _, err = run_cli(capsys, "runs", "import", str(log))
    _one_line(code, err, "two.records.jsonl:4", "second run header", "split the file before line 4")


# -- 4: runs list filters -------------------------------------------------------------------


def test_model_filter_ignores_case_and_reads_like_wildcards_literally(tmp_path: Path) -> None:
    with Store.open(str(tmp_path / "runs.db")) as s:
        for rid, model in (("a", "Llama_3-8B"), ("b", "llamax3-8b")):
            run, meta = synthetic_run(2, n_requests=10)
            run.id = meta.id = rid
            s.save_result(run, meta.model_copy(update={"model": model}))
        assert [i.id for i in s.list_runs(model="llama_3")] == ["a"]
        assert [i.id for i in s.list_runs(model="LLAMA")] == ["a", "b"]
        assert s.list_runs(model="%") == []


def test_engine_filter_ignores_case_and_refuses_unknown_engines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = EngineConfig(engine="vllm", max_num_seqs=8).model_dump(mode="json")
    (rid,) = _saved(tmp_path, engine_config=cfg)
    code, out, err = run_cli(capsys, "runs", "list", "--engine", "vLLM", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [rid], err
    code, _, err = run_cli(capsys, "runs", "list", "--engine", "vlmm")
    _one_line(code, err, "--engine", "unknown engine 'vlmm'", "did you mean vllm")


def test_an_unknown_study_is_refused_with_the_closest_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _saved(tmp_path, study="sweep-a")
    code, _, err = run_cli(capsys, "runs", "list", "--study", "swep-a")
    _one_line(code, err, "--study", "no study 'swep-a'", "did you mean sweep-a")
    code, _, err = run_cli(capsys, "runs", "list", "--study", "zzzzzzzz")
    _one_line(code, err, "--study", "runs list --studies")
    code, out, _ = run_cli(capsys, "runs", "list", "--study", "sweep-a", "--json")
    assert code == 0 and len(json.loads(out)) == 1


def test_until_to_the_minute_includes_that_minute(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with Store.open(str(tmp_path / "runs.db")) as s:
        run, meta = synthetic_run(2, n_requests=10)
        s.save_result(run, meta.model_copy(update={"created_utc": "2026-12-06T19:24:37Z"}))
    for until, n in (("2026-12-06T19:24", 1), ("2026-12-06T19", 1), ("2026-12-06T19:23", 0)):
        code, out, _ = run_cli(capsys, "runs", "list", "--until", until, "--json")
        assert code == 0 and len(json.loads(out)) == n, until
    code, out, _ = run_cli(capsys, "runs", "list", "--until", "2026-12-06T19:24:36", "--json")
    assert json.loads(out) == []


# -- 5: text longer than the store keeps ---------------------------------------------------------


def test_an_over_long_tag_is_one_line_on_every_backend(store: Store) -> None:  # noqa: F811
    run, meta = synthetic_run(2, n_requests=10)
    rid = store.save_result(run, meta)
    with pytest.raises(InputError, match=r"^tag: .* is 101 characters; the store keeps at most"):
        store.tag([rid], add=["x" * 101])
    assert store.get(rid).tags == []
    run2, meta2 = synthetic_run(3, n_requests=10)
    for update, field in (({"tags": ["t" * 101]}, "tag"), ({"study": "s" * 201}, "study")):
        with pytest.raises(InputError, match=f"^{field}: "):
            store.save_result(run2, meta2.model_copy(update=update))
    with pytest.raises(InputError, match="^model: "):
        store.save_result(run2, meta2.model_copy(update={"model": "m" * 301}))
    assert [i.id for i in store.list_runs()] == [rid]


def test_bench_refuses_an_over_long_tag_before_it_measures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(capsys, "bench", "--url", "http://127.0.0.1:9", "--tag", "t" * 101)
    _one_line(code, err, "--tag", "101 characters")
    code, _, err = run_cli(capsys, "runs", "import", "x.json", "--study", "s" * 201)
    _one_line(code, err, "--study", "201 characters")


def test_an_export_with_an_over_long_tag_imports_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A SQLite store kept the tag; its export is refused whole while it is read."""
    _saved(tmp_path, n=2)
    code, _, err = run_cli(capsys, "runs", "export", "-f", "json", "-o", "e.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "e.json").read_text())
    doc["runs"][1]["meta"]["tags"] = ["t" * 101]
    (tmp_path / "e.json").write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "runs", "import", "e.json", "--db", str(tmp_path / "pg.db"))
    _one_line(code, err, "e.json.runs[1].meta.tags[0]", "101 characters")
    assert not (tmp_path / "pg.db").exists()


# -- 6: the pre-migration backup has what the WAL held ---------------------------------------


def test_the_schema_backup_keeps_what_the_wal_holds(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    db.write_bytes((Path(__file__).parent / "data" / "compat_store.db").read_bytes())
    held = sqlite3.connect(db)  # a writer still open: its last commit is in old.db-wal
    held.execute("PRAGMA journal_mode = WAL")
    held.execute("PRAGMA wal_autocheckpoint = 0")
    held.execute("UPDATE runs SET conclusion_note = 'in the wal'")
    held.commit()
    assert (tmp_path / "old.db-wal").stat().st_size
    try:
        Store.open(str(db)).close()
    finally:
        held.close()
    bak = sqlite3.connect(tmp_path / "old.db.schema1.bak")
    notes = {n for (n,) in bak.execute("SELECT conclusion_note FROM runs")}
    version = bak.execute("SELECT value FROM servetune_info WHERE key = 'schema'").fetchone()
    bak.close()
    assert notes == {"in the wal"} and version == ("1",)


# -- 7: a failed run leaves no study behind ----------------------------------------------------


def test_a_study_made_by_a_failed_run_is_rolled_back(
    store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run, meta = synthetic_run(2, n_requests=10)

    def broken(*_: Any) -> None:
        raise RuntimeError("the result could not be stored")

    with monkeypatch.context() as m:  # fails after the run's row and its new study
        m.setattr(Store, "_finish", broken)
        with pytest.raises(RuntimeError):
            store.save_result(run, meta, study="fresh")
    assert store.studies() == [] and store.list_runs() == []
    store.save_result(run, meta, study="fresh")  # made when a run is stored
    assert [st["name"] for st in store.studies()] == ["fresh"]
    assert store.ensure_study("fresh") == store.studies()[0]["id"]


# -- 8, 9, 13 and `extra_args`: the §16 record ------------------------------------------------


def _record(tmp_path: Path, **edit: Any) -> dict[str, str]:
    from servetune.report.experiment import experiment_record

    run, meta = synthetic_run(2, n_requests=20)
    run = run.model_copy(update=edit.pop("result", {}))
    with Store.open(str(tmp_path / "runs.db")) as s:
        rid = s.save_result(run, meta.model_copy(update=edit))
        info = s.get(rid)
    return {k: v for _, rows in experiment_record(info) for k, v in rows}


def test_a_sessions_run_offers_sessions_per_second(tmp_path: Path) -> None:
    from servetune.results.schema import Load

    run, _ = synthetic_run(2, n_requests=20)
    metrics = run.metrics.model_copy(update={"offered_req_s": 1.5, "offered_unit": "sessions/s"})
    load = Load(kind="poisson", rate=1.5)
    rec = _record(tmp_path, result={"metrics": metrics, "load": load}, load=load)
    assert rec["rate (offered / achieved)"].startswith("1.5 sessions/s / ")
    assert rec["rate (offered / achieved)"].endswith(" req/s")


def test_gpu_memory_and_utilisation_read_as_gib_and_percent(tmp_path: Path) -> None:
    tel = TelemetrySeries(
        t_ns=[0, 10**9],
        values=[
            {"gpu_memory_used": 68.0 * 2**30, "gpu_util": 0.86},
            {"gpu_memory_used": 60.0 * 2**30, "gpu_util": 0.90},
        ],
        sources=["nvml"],
    )
    assert _record(tmp_path, result={"telemetry": tel})["GPU memory / util"] == (
        "68.0 GiB peak / 88% mean"
    )


def test_nccl_is_said_to_be_not_recorded_and_default_knobs_are_not_listed(
    tmp_path: Path,
) -> None:
    cfg = EngineConfig(engine="vllm", max_num_seqs=8).model_dump(mode="json")
    assert cfg["extra_args"] == []  # a tuple default, kept as a list
    rec = _record(tmp_path, engine_config=cfg)
    assert rec["NCCL"].startswith("not recorded")
    assert "driver / CUDA / NCCL" not in rec
    assert "extra_args" not in rec.get("other knobs", "")


# -- 10, 11, 12: report charts ------------------------------------------------------------------


def test_configs_differing_only_by_workload_are_named_by_it(tmp_path: Path) -> None:
    from servetune.report.data import load_report_data

    with Store.open(str(tmp_path / "runs.db")) as s:
        for name in ("chat", "rag"):
            run, meta = synthetic_run(2, n_requests=20)
            run.id = meta.id = name
            wl = {"name": name, "input_tokens": {"dist": "fixed", "value": len(name)}}
            s.save_result(run.model_copy(update={"workload": wl}), meta)
        data = load_report_data(s, ["chat", "rag"])
    assert sorted(data.series) == ["chat", "rag"]
    assert data.context["chat"]["workload"] == "chat"


def _data_of(tmp_path: Path, run: RunResult, meta: RunMeta) -> Any:
    from servetune.report.data import load_report_data

    with Store.open(str(tmp_path / "runs.db")) as s:
        rid = s.save_result(run, meta)
        return load_report_data(s, [rid])


def _all_failed(run: RunResult) -> RunResult:
    recs = [
        r.model_copy(update={"status": RequestStatus.ERROR, "error": "http_5xx", "chunk_ns": []})
        for r in run.records
    ]
    return run.model_copy(update={"records": recs})


def test_telemetry_with_nothing_drawable_is_one_line(tmp_path: Path) -> None:
    from servetune.report.telemetry_section import telemetry

    run, meta = synthetic_run(2, n_requests=20)
    tel = TelemetrySeries(t_ns=[0, 10**9], values=[{"x_unknown": 1.0}, {"x_unknown": 2.0}])
    chart = telemetry(
        _data_of(tmp_path, _all_failed(run).model_copy(update={"telemetry": tel}), meta)
    )
    assert chart.fig is None and chart.note.startswith("Nothing to draw")


def test_an_all_failed_run_draws_no_empty_cdf(tmp_path: Path) -> None:
    from servetune.report.charts import cdfs

    run, meta = synthetic_run(2, n_requests=20)
    chart = cdfs(_data_of(tmp_path, _all_failed(run), meta))
    assert chart.fig is None and "No request succeeded" in chart.note


def test_records_metrics_lives_in_one_place() -> None:
    """The store's readers and the record-log importer compute alike."""
    from servetune.store import store as store_mod
    from servetune.store import transfer
    from servetune.store.meta import records_metrics

    assert store_mod.records_metrics is transfer.records_metrics is records_metrics
