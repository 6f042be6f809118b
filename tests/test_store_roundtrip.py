"""Store round trip on SQLite and on a real PostgreSQL (the throwaway cluster that
scripts/services.sh starts; started here if it is not running — never skipped)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from servetune.build import build_id
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.status import RunStatus
from servetune.store import RunMeta, Store
from servetune.store.transfer import export
from synthetic_runs import synthetic_run, synthetic_sweep

ROOT = Path(__file__).resolve().parents[1]


def _pg_server_url() -> str:
    """$SERVETUNE_PG_URL, else the cluster of scripts/services.sh (started if needed)."""
    url = os.environ.get("SERVETUNE_PG_URL")
    if url:
        return url
    out = subprocess.run(
        [str(ROOT / "scripts" / "services.sh"), "pg"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, f"scripts/services.sh pg failed:\n{out.stderr[-2000:]}"
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SERVETUNE_PG_URL="))
    return line.split("=", 1)[1]


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh database on the PostgreSQL server for this test session, dropped after."""
    server = _pg_server_url()
    name = f"servetune_test_{secrets.token_hex(4)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(server).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = str(tmp_path / "runs.db")
    else:
        url = request.getfixturevalue("pg_url")
    with Store.open(url) as s:
        yield s
    if request.param == "postgresql":  # each test starts from an empty schema
        eng = create_engine(url)
        with eng.begin() as c:
            c.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
        eng.dispose()


def test_migrations_create_exactly_the_models(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from servetune.store.models import Base

    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def _dump(records: list) -> list[dict]:
    return [r.model_dump() for r in records]


def test_save_and_load_result_round_trip(store: Store) -> None:
    result, meta = synthetic_run(8, n_requests=60)
    rid = store.save_result(result, meta, study="rt", tags=["baseline"])
    assert rid == result.id
    back = store.load_result(rid)
    assert _dump(back.records) == _dump(result.records)
    assert back.metrics == result.metrics
    assert back.server == result.server
    assert back.slo == result.slo and back.load == result.load
    info = store.get(rid)
    assert (info.status, info.study, info.tags, info.n_records) == (
        "completed",
        "rt",
        ["baseline"],
        60,
    )
    assert info.engine == "vllm" and info.model == "llama-3.1-8b" and info.concurrency == 8
    assert info.meta["hardware"]["gpu"] == "h100-sxm"
    # which servetune wrote it: the version and the build (servetune.build)
    assert info.meta["software"]["servetune_build"] == build_id()
    assert info.request_dist["input_tokens"]["p99"] >= info.request_dist["input_tokens"]["p50"]
    assert info.stability["errors"] == result.metrics.failed


def test_incremental_writes_then_finish(store: Store) -> None:
    result, meta = synthetic_run(4, n_requests=50)
    rid = store.begin_run(meta)
    assert store.get(rid).status == RunStatus.RUNNING  # this process is alive
    for i in range(0, 50, 20):
        store.append_records(rid, [r.model_dump() for r in result.records[i : i + 20]])
    assert store.get(rid).n_records == 50
    partial = store.load_result(rid)  # no final result yet: metrics from the records
    assert partial.metrics.completed == result.metrics.completed
    store.finish_run(rid, result)
    assert store.get(rid).status == RunStatus.COMPLETED
    assert _dump(store.records(rid)) == _dump(result.records)


def test_list_filters_resolve_tag_conclude_delete(store: Store) -> None:
    for r, m in synthetic_sweep((1, 2, 4), seed=1):
        store.save_result(r, m, study="sweep")
    other, om = synthetic_run(2, seed=2, config=EngineConfig(engine="sglang"), backend="sim")
    store.save_result(other, om)
    assert len(store.list_runs()) == 4
    assert [i.concurrency for i in store.list_runs(study="sweep")] == [1, 2, 4]
    assert [i.id for i in store.list_runs(engine="sglang")] == [other.id]
    assert [i.id for i in store.list_runs(backend="sim")] == [other.id]
    assert len(store.list_runs(since="2026-01-01T00:02:00Z")) == 3
    assert len(store.list_runs(limit=2)) == 2
    ids = store.resolve(["sweep"])
    assert len(ids) == 3 and store.resolve([f"{ids[0]},{other.id}"]) == [ids[0], other.id]
    assert store.resolve([other.id[:-2]]) == [other.id]  # unique prefix
    store.tag(ids[:2], add=["candidate"])
    store.tag(ids[:1], remove=["candidate"])
    assert [i.id for i in store.list_runs(tag="candidate")] == [ids[1]]
    store.conclude(ids[1], "keep", "best goodput")
    assert (store.get(ids[1]).conclusion, store.get(ids[1]).conclusion_note) == (
        "keep",
        "best goodput",
    )
    with pytest.raises(InputError, match="verdict"):
        store.conclude(ids[1], "maybe")
    store.delete(ids)
    assert [i.id for i in store.list_runs()] == [other.id]
    assert store.load_result(other.id).server == other.server  # shared blobs survive
    with pytest.raises(InputError, match="no run or study"):
        store.get(ids[0])


def test_identical_request_lists_are_stored_once(store: Store) -> None:
    from servetune.workload.materialize import Request

    reqs = [
        Request(index=i, sub="default", prompt="hi " * i, prompt_tokens=i, output_tokens=8)
        for i in range(50)
    ]
    for c in (1, 2):
        r, m = synthetic_run(c, n_requests=20)
        r.requests = reqs
        store.save_result(r, m)
    with store.engine.connect() as c:
        n_blobs = c.execute(text("SELECT count(*) FROM blobs")).scalar_one()
    assert n_blobs == 3  # one request list + two server series
    assert store.load_result(r.id).requests == reqs


def test_export_json_imports_into_another_store(store: Store, tmp_path: Path) -> None:
    r, m = synthetic_run(4, n_requests=40)
    rid = store.save_result(r, m, study="move-me", tags=["t1"])
    store.conclude(rid, "next", "try fp8 KV")
    store.set_quality(rid, {"task_accuracy": 0.71})
    path = tmp_path / "export.json"
    assert export(store, [rid], path, "json") == 1
    with Store.open(str(tmp_path / "other.db")) as other:
        assert other.import_file(path) == [(rid, "imported")]
        assert other.import_file(path) == [(rid, "skipped: already in the store")]
        info = other.get(rid)
        assert (info.study, info.tags, info.conclusion) == ("move-me", ["t1"], "next")
        assert info.quality == {"task_accuracy": 0.71}
        assert _dump(other.records(rid)) == _dump(r.records)


def test_import_bench_result_file_and_record_log(store: Store, tmp_path: Path) -> None:
    r, _ = synthetic_run(2, n_requests=30)
    f = tmp_path / "result.json"
    f.write_text(r.model_dump_json())
    assert store.import_file(f, study="old") == [(r.id, "imported")]
    assert store.load_result(r.id).metrics == r.metrics
    log = tmp_path / "records.jsonl"
    lines = [
        '{"run": {"id": "bench-20260102T030405-aaaaaa", "load": {"kind": "closed", '
        '"concurrency": 2}, "url": "http://127.0.0.1:1"}}'
    ]
    lines += [rec.model_dump_json() for rec in r.records]
    log.write_text("\n".join(lines) + "\n")
    [(rid, what)] = store.import_file(log)
    info = store.get(rid)
    assert what == "imported" and info.status == RunStatus.INTERRUPTED and info.n_records == 30
    assert info.created_utc == "2026-01-02T03:04:05Z"
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x", "records": [{"index": "nope"}]}')
    with pytest.raises(InputError, match="bad.json"):
        store.import_file(bad)


def test_meta_is_validated(store: Store) -> None:
    with pytest.raises(InputError, match="run meta"):
        store.begin_run({"modle": "typo"})
    rid = store.begin_run(RunMeta(model="m", engine_config={"engine": "tgi"}))
    with pytest.raises(InputError, match="already"):
        store.begin_run(RunMeta(id=rid))


def test_a_gpu_count_left_unsaid_is_the_configs_world(store: Store) -> None:
    """A run on a GPU whose host did not count its GPUs (an import): TP x PP x DP of its
    config, as the tuner counts GPUs per replica (DP was left out: TP2 DP2 read 2)."""
    rid = store.begin_run({"backend": "real", "hardware": {"gpu": "h100-sxm"},
                           "engine_config": {"tensor_parallel_size": 2,
                                             "data_parallel_size": 2}})  # fmt: skip
    assert store.get(rid).gpu_count == 4
