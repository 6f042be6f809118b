"""The §16 record of a simulated run stored as `tune` stores a trial (metrics, no
records): its request count and lengths redrawn from its workload, not `0` and `-`; KV
usage and preemptions from the simulator's counters (`target.sim`), not `-`; and "not
recorded by the simulator" where nothing can be redrawn."""

from __future__ import annotations

from pathlib import Path

import servetune
from servetune.build import build_id
from servetune.engines.config import EngineConfig
from servetune.hardware import get_hardware
from servetune.metrics.pct import dist_text
from servetune.model import get_model
from servetune.report.experiment import NOT_RECORDED_SIM, experiment_record
from servetune.results.schema import RunResult
from servetune.sim.engine import simulate
from servetune.store import Store
from servetune.store.meta import RunMeta
from servetune.workload.spec import parse_workload

M, HW = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
# A small pool under a burst: the simulator preempts and fills its KV pool.
CFG = EngineConfig(max_model_len=2048, kv_cache_space_gib=0.5, max_num_seqs=256)
WORKLOAD = {
    "input_tokens": {"dist": "lognormal", "mean": 400, "sigma": 0.6, "min": 16, "max": 1500},
    "output_tokens": {"dist": "uniform", "low": 20, "high": 200},
    "count": 300,
    "arrival": {"kind": "poisson", "rate": 500},
}


def _rows(store: Store, run_id: str) -> dict[str, str]:
    info = store.get(run_id)
    return {k: v for _, rows in experiment_record(info) for k, v in rows}


def _save(store: Store, res: RunResult, run_id: str, *, records: bool) -> None:
    """Stored whole (as `simulate` does) or as `tune` stores a trial: no records."""
    kept = res if records else res.model_copy(update={"records": [], "requests": []})
    kept = kept.model_copy(update={"id": run_id})
    store.save_result(kept, RunMeta(id=run_id, backend="sim", model="llama-3.1-8b"))


def _stored_twice(tmp_path: Path):
    """One simulated run stored whole and as a trial: (result, scheduler, the two §16
    records' rows, the whole run's stored request distribution)."""
    res, sched = simulate(M, HW, CFG, parse_workload(WORKLOAD))
    with Store.open(str(tmp_path / "r.db")) as store:
        _save(store, res, "whole", records=True)
        _save(store, res, "trial", records=False)
        rows = _rows(store, "whole"), _rows(store, "trial")
        dist = store.get("whole").request_dist or {}
    return res, sched, rows, dist


def test_a_simulated_trial_record_is_filled_from_what_it_stores(tmp_path: Path) -> None:
    _, _, (whole, trial), dist = _stored_twice(tmp_path)
    assert trial["requests"].startswith("300 (redrawn from the workload")
    for row in ("input tokens P50/P95/P99", "output tokens P50/P95/P99"):
        assert trial[row] != "-" and "(n=300" in trial[row]
    # the very lengths the records of the same run give
    assert trial["input tokens P50/P95/P99"] == whole["input tokens P50/P95/P99"]
    assert trial["input tokens P50/P95/P99"] == dist_text(dist["input_tokens"], n=300)
    # the §16 software row names the servetune that stored it, version and build
    assert whole["servetune"] == f"{servetune.__version__} (build {build_id()})"


def test_simulated_kv_usage_and_preemptions_come_from_its_counters(tmp_path: Path) -> None:
    res, sched, (whole, trial), _ = _stored_twice(tmp_path)
    used, blocks = res.target.sim.max_kv_blocks_used, res.target.kv_blocks
    assert blocks and used and sched.stats.preemptions > 0
    for rows in (trial, whole):
        assert rows["KV cache usage max"].endswith(f"({used:,} of {blocks:,} blocks)")
        assert rows["preemptions"] == str(sched.stats.preemptions)


def test_lengths_the_simulator_cannot_redraw_are_said_so(tmp_path: Path) -> None:
    res, _ = simulate(M, HW, CFG, parse_workload(WORKLOAD))
    res.workload = {**res.workload, "mix": [], "trace": {"path": "/gone/trace.jsonl"}}
    with Store.open(str(tmp_path / "r.db")) as store:
        _save(store, res, "trial", records=False)
        rows = _rows(store, "trial")
    for row in ("requests", "input tokens P50/P95/P99", "output tokens P50/P95/P99"):
        assert rows[row] == NOT_RECORDED_SIM


def test_a_real_run_without_server_metrics_is_unchanged(tmp_path: Path) -> None:
    from synthetic_runs import synthetic_run

    r, m = synthetic_run(4)
    r.server = None
    with Store.open(str(tmp_path / "r.db")) as store:
        store.save_result(r, m)
        rows = _rows(store, r.id)
    assert rows["KV cache usage max"] == "-" and rows["preemptions"] == "-"
    assert rows["requests"] == str(len(r.records))
