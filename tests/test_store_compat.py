"""A store written before the typed RunResult parts and status enums (tests/data, see its
README) still reads: runs list/show/compare, report data, a tune study's resume, every
typed part. And what is written now keeps the keys the old readers looked up."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servetune.engines.config import EngineConfig
from servetune.measure import Infeasible, PointResult
from servetune.report.data import load_report_data
from servetune.status import RequestStatus, RunStatus, TrialStatus
from servetune.store import RunInfo, Store
from servetune.tune.study import Recorder

DATA = Path(__file__).parent / "data"


@pytest.fixture
def old_db(tmp_path: Path) -> Path:
    """A private copy: reading may write (reaping, a resumed study's attempts)."""
    db = tmp_path / "old.db"
    shutil.copyfile(DATA / "compat_store.db", db)
    return db


def runs_by_study(db: Path) -> dict[str | None, list[RunInfo]]:
    out: dict[str | None, list[RunInfo]] = {}
    with Store.open(str(db), create=False) as store:
        for info in store.list_runs():
            out.setdefault(info.study, []).append(info)
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "servetune.cli.app", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_runs_list_show_and_compare_read_the_old_store(old_db: Path) -> None:
    out = cli("runs", "list", "--json", "--db", str(old_db))
    assert out.returncode == 0, out.stderr
    listed = {r["id"]: r for r in json.loads(out.stdout)}
    statuses = sorted(r["status"] for r in listed.values())
    assert statuses == ["completed"] * 7 + ["failed", "interrupted"]
    bench = sorted((r for r in listed.values() if r["id"].startswith("bench-")), key=str)
    assert [(r["load_kind"], r["rate"]) for r in bench] == [("poisson", 20.0), ("poisson", 40.0)]
    sim = next(r for r in listed.values() if r["id"].startswith("sim-"))
    shown = cli("runs", "show", sim["id"], "--db", str(old_db))
    assert shown.returncode == 0 and "llama-3.1-8b" in shown.stdout, shown.stderr
    comp = cli("runs", "compare", "compat-bench", "--json", "--db", str(old_db))
    assert comp.returncode == 0, comp.stderr
    factors = json.loads(comp.stdout)["factors"]
    assert sorted(factors["load.rate"]) == [20.0, 40.0]


def test_every_typed_part_of_the_old_runs_is_populated(old_db: Path) -> None:
    studies = runs_by_study(old_db)
    for info in studies["compat-bench"]:
        assert info.target.url and info.target.url.startswith("http://127.0.0.1:")
        assert info.target.api == "chat" and not info.target.sim and info.tune is None
        assert info.load.kind == "poisson" and info.load.rate in (20.0, 40.0)
        assert info.status is RunStatus.COMPLETED
    (sim,) = studies[None]
    t = sim.target
    assert (t.engine, t.model, t.hardware, t.tier) == (
        "vllm",
        "llama-3.1-8b",
        "h100-sxm",
        "roofline",
    )
    assert t.config == {"max_model_len": 4096, "max_num_seqs": 32} and t.max_num_seqs == 32
    assert t.kv_blocks and t.kv_capacity_tokens and t.efficiency
    assert t.sim.steps > 0 and t.sim.max_kv_blocks_used > 0 and "loop" in t.sim.phases_s
    assert sim.load.rate == 5.0
    for info in studies["compat-tune"]:
        tag = info.tune
        assert tag is not None and tag.phase == "trial" and tag.pid == f"{tag.key}/trial"
        assert tag.trial is not None and tag.trial["status"] == TrialStatus.OK
        assert (tag.load_kind, info.load.kind, info.load.concurrency) == (
            "concurrency",
            "closed",
            4,
        )
        assert info.target.sim.steps > 0  # the result's target, merged with the tag
    points = {i.status: i for i in studies["compat-points"]}
    done = points[RunStatus.COMPLETED].tune
    assert done is not None and (done.load_kind, done.load, done.rep) == ("concurrency", 2.0, 0)
    failed = points[RunStatus.FAILED].tune
    assert failed is not None and failed.failure is not None
    assert failed.failure.kind == "oom" and failed.failure.log_tail[-1] == "torch.OutOfMemoryError"
    assert points[RunStatus.INTERRUPTED].tune is not None


def test_old_results_load_with_their_records(old_db: Path) -> None:
    with Store.open(str(old_db), create=False) as store:
        for info in store.list_runs():
            res = store.load_result(info.id)
            assert res.status == (info.status if info.result else RunStatus.INTERRUPTED)
            assert res.load == info.load and res.target.tune == info.tune
            assert len(res.records) == info.n_records
            assert all(r.status == RequestStatus.OK for r in res.records)
            if info.metrics:
                assert res.metrics.completed == info.metrics["completed"]


def test_report_data_of_old_runs(old_db: Path) -> None:
    with Store.open(str(old_db), create=False) as store:
        data = load_report_data(store, ["compat-bench"])
        tune = load_report_data(store, ["compat-tune"])
    assert data.x_kind == "rate" and len(data.runs) == 2
    assert data.comparison is not None and "load.rate" in data.comparison.to_json()["differing"]
    assert all(r.result.target.url for r in data.runs)
    assert tune.x_kind == "concurrency" and len(tune.series) == 3  # one per config


class _Backend:
    """Just what the recorder reads from a backend when it writes a run."""

    name = "real"

    def meta(self) -> dict[str, Any]:
        return {}

    def command(self, cfg: EngineConfig) -> str:
        return "vllm serve"


def test_tune_resumes_the_old_studies(old_db: Path) -> None:
    sims = Recorder(str(old_db), "compat-tune", "sim")
    sims.refresh()
    keys = [i.tune.key for i in runs_by_study(old_db)["compat-tune"] if i.tune]
    trials = [sims.sim_trial(k) for k in keys]
    assert all(t is not None and t.status is TrialStatus.OK and t.points for t in trials)

    real = Recorder(str(old_db), "compat-points", "real")
    real.refresh()
    by_status = {i.status: i.tune for i in runs_by_study(old_db)["compat-points"]}
    done, failed = by_status[RunStatus.COMPLETED], by_status[RunStatus.FAILED]
    stopped = by_status[RunStatus.INTERRUPTED]
    assert done is not None and failed is not None and stopped is not None
    point = real.point(done.pid)
    assert isinstance(point, PointResult) and point.passed and point.status is RunStatus.COMPLETED
    assert point.load == 2.0 and point.signals["max_in_flight"] >= 1
    miss = real.point(failed.pid)
    assert isinstance(miss, Infeasible) and miss.kind == "oom"
    # The interrupted point is measured again, under its second attempt id.
    assert real.point(stopped.pid) is None
    cfg = EngineConfig(engine="vllm", max_num_seqs=16, max_model_len=4096)
    where = ("concurrency", 4.0, "probe", 0)
    again = real.begin_point(stopped.pid, _Backend(), cfg, "vllm serve", where)
    assert again is not None and again.endswith("-2")


def _paths(obj: Any, at: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path of a JSON object (a list stands for its first item)."""
    if isinstance(obj, dict):
        return {at + (k,) for k in obj} | {p for k, v in obj.items() for p in _paths(v, at + (k,))}
    if isinstance(obj, list) and obj:
        return _paths(obj[0], at + ("[]",))
    return set()


def _parts(info: RunInfo) -> dict[str, Any]:
    m, r = info.meta, info.result
    return {"meta.target": m["target"], "meta.load": m["load"], "result": r}


def _fixed(paths: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """Key paths less the free-form dicts whose keys vary by run: a sim trial's figures and
    the settings an engine reported (a simulated run records the KV cache dtype it resolved
    since stop 39; older ones have none), the expected error a simulated run states
    (since stop 44; optional, older runs have none), and the engine and --set knobs a
    bench run was given (in its target since stop 50, so its result file says who served
    it; older runs keep them in the run's meta only), and the servetune build a simulated
    run names (since stop 55; optional, older runs have none)."""
    free_or_new = {("tune", "trial"), ("sim", "expected_error"), ("sim", "build")}
    return {
        p
        for p in paths
        if p[:2] not in free_or_new and p[0] not in ("settings", "engine", "config")
    }


def _same_keys(old: RunInfo, new: RunInfo) -> None:
    """The new JSON has every key the old had; the typed parts exactly those."""
    for name, part in _parts(old).items():
        now = _parts(new)[name]
        assert _paths(part) <= _paths(now), name
        for key in ("target", "load"):
            if name == "result" and part:
                assert _fixed(_paths(part[key])) == _fixed(_paths(now[key])), f"{name}.{key}"
        if name != "result":
            assert _fixed(_paths(part)) == _fixed(_paths(now)), name


def test_json_written_now_has_the_old_keys(old_db: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "make_compat_store", DATA / "make_compat_store.py"
    )
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    new_db = tmp_path / "new.db"
    work = tmp_path / "work"
    work.mkdir()
    maker.cli_runs(f"sqlite:///{new_db}", work)
    old, new = runs_by_study(old_db), runs_by_study(new_db)
    for study in ("compat-bench", None):
        pairs = zip(old[study], new[study], strict=True)
        for a, b in pairs:
            _same_keys(a, b)
    new_trials = {i.tune.key: i for i in new["compat-tune"] if i.tune}
    for a in old["compat-tune"]:
        assert a.tune is not None
        _same_keys(a, new_trials[a.tune.key])
    # A real study's point runs, written now by the recorder.
    rec = Recorder(str(new_db), "compat-points", "real")
    old_points = {i.status: i for i in old["compat-points"]}
    done, failed = old_points[RunStatus.COMPLETED].tune, old_points[RunStatus.FAILED].tune
    assert done is not None and failed is not None
    cfg = EngineConfig(engine="vllm", max_num_seqs=16, max_model_len=4096)
    rec.begin_point(done.pid, _Backend(), cfg, "vllm serve", ("concurrency", 2.0, "probe", 0))
    rec.record_failure(failed.pid, _Backend(), cfg, Infeasible("oom", "x", ["a", "b"]))
    written = {i.tune.pid: i for i in runs_by_study(new_db)["compat-points"] if i.tune}
    for pid in (done.pid, failed.pid):
        before = next(i for i in old["compat-points"] if i.tune and i.tune.pid == pid)
        now = written[pid]
        assert _paths(before.meta["target"]) == _paths(now.meta["target"])
        assert before.meta["load"].keys() == now.meta["load"].keys()
