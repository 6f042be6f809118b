"""A study SIGKILLed at every phase boundary (and inside the phases that store points)
resumes to the study an uninterrupted run gives: every phase's runs present once, none
stored twice, the study done, the same winner.

The study is hybrid, so it has every phase: baseline and ranking on the simulator, the
real engine's verification, the sim-vs-real check, the finalists' repetitions, the sweet
spot sweep, the OOM edge, the keep conclusion, the done mark and the report. The "real
engine" is the simulator stored point by point like a real one (no engine to start), and
the calibration is skipped (it needs a launched engine). Each child process is killed
right after a phase returns (`KILLS`), the next one resumes and is killed at the next
phase, and a last one finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from servetune.measure import BackendSpec, SimBackend
from servetune.status import RunStatus
from servetune.store import Store
from servetune.tune import executors
from servetune.tune.capacity import rate_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import parse_space
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import Tuner, TuneSettings

COMMON: dict[str, Any] = dict(
    engine="vllm",
    model="llama-3.1-8b",
    hardware="h100-sxm",
    workload={"count": 40, "input_tokens": {"dist": "fixed", "value": 256},
              "output_tokens": {"dist": "fixed", "value": 64},
              "arrival": {"kind": "poisson", "rate": 1.0}},
    slo={"ttft_ms": {"p95": 400}, "tpot_ms": {"p95": 40}},
)  # fmt: skip
SIM = BackendSpec(kind="sim", **COMMON)
REAL = BackendSpec(kind="real", **COMMON)
LATTICE = rate_lattice(1.0, 64.0, steps_per_doubling=2)

# Where each child dies: right after this Tuner method returns (its first call), or
# `point:PHASE:N` right after the N-th point of PHASE is stored, or after the report.
KILLS = [
    "baseline",  # the baseline trial (first run_batch), on the simulator
    "search_phase",  # the simulator's ranking
    "verify_phase",  # the real engine's trials of the simulator's top configs
    "_sim_vs_real",  # the simulator at the verified loads (phase `check`)
    "point:rep:1",  # inside the finalists' repetitions
    "finalist_phase",
    "point:sweet:3",  # inside the sweet-spot sweep
    "sweet_phase",  # every sweet-spot point stored, the study not done
    "edge_phase",
    "_conclude",  # the keep conclusion written
    "_finish",  # the study marked done, its report not written
    "report",
]


class StoredLikeReal(SimBackend):
    """The simulator as a real engine: its points are stored one by one."""

    name = "real"


def settings(db: str, study: str) -> TuneSettings:
    space = parse_space({"engine": "vllm", "fixed": {"max_model_len": 4096},
                         "knobs": {"max_num_seqs": [8, 32],
                                   "gpu_memory_utilization": [0.85, 0.9]}})  # fmt: skip
    return TuneSettings(
        space=space,
        mode="hybrid",
        objective=Objective("goodput"),
        search=SearchSettings("rate", LATTICE, max_probes=6),
        sim=SIM,
        real=REAL,
        strategy="grid",
        top_k=2,
        finalists=1,
        repeats=2,
        start_index=LATTICE.index_of(1.0),
        db=db,
        study=study,
        verbose=False,
    )


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_after(kill_at: str) -> None:
    """Patch the named boundary to SIGKILL this process once it is passed."""
    from servetune.tune import study as study_mod
    from servetune.tune import tuner as tuner_mod

    if kill_at.startswith("point:"):
        _, phase, n = kill_at.split(":")
        seen: list[str] = []
        finish = study_mod.Recorder.finish_point

        def finish_then_die(self: Any, pid: str, *a: Any) -> None:
            finish(self, pid, *a)
            if f"/{phase}/" in pid:
                seen.append(pid)
                if len(seen) == int(n):
                    _die()

        study_mod.Recorder.finish_point = finish_then_die  # type: ignore[method-assign]
        return
    name = "run_batch" if kill_at == "baseline" else kill_at
    orig = getattr(tuner_mod.Tuner, name)

    def then_die(self: Any, *a: Any, **k: Any) -> Any:
        out = orig(self, *a, **k)
        _die()
        return out

    setattr(tuner_mod.Tuner, name, then_die)


def child(db: str, study: str, kill_at: str) -> None:
    """One process of the study (run by the test with `python -c`)."""
    from servetune.cli.tune_cmd import write_report
    from servetune.tune import tuner as tuner_mod

    key = json.dumps(asdict(REAL), sort_keys=True, default=str)
    executors._BACKENDS[key] = StoredLikeReal(REAL)
    tuner_mod.for_hybrid = lambda *a, **k: (None, None)  # calibrating needs a real engine
    if kill_at not in ("", "report"):
        _kill_after(kill_at)
    tuner = Tuner(settings(db, study), lambda _: None)
    out = tuner.run()
    write_report(tuner.store, out, Path(db).with_name(f"{study}.html"))
    if kill_at == "report":
        _die()
    assert out.winner is not None
    print(json.dumps({"winner": out.winner.key, "recommended": out.recommended}))


def _run_child(db: Path, study: str, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"import test_resume_kill as t; t.child({str(db)!r}, {study!r}, {kill_at!r})"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def _runs(db: Path, study: str) -> list:
    with Store.open(str(db)) as st:
        return st.list_runs(study=study)


def _pids(runs: list) -> Counter:
    return Counter(r.tune.pid for r in runs if r.tune is not None)


@pytest.mark.timeout(600)  # ~25 child processes of a few seconds each on a busy host
def test_kill_at_every_phase_then_resume_stores_each_run_once(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    ref = _run_child(db, "ref")
    assert ref.returncode == 0, ref.stderr
    ref_runs = _runs(db, "ref")
    ref_pids = _pids(ref_runs)
    assert max(ref_pids.values()) == 1
    phases = {r.tune.phase for r in ref_runs if r.tune is not None}
    # every phase that stores runs ran (`check` stores only loads the simulator's own
    # search did not probe: none here, the "real engine" being the simulator)
    assert {"trial", "probe", "rep", "sweet"} <= phases

    for kill_at in KILLS:
        p = _run_child(db, "killed", kill_at)
        assert p.returncode == -signal.SIGKILL, f"{kill_at} was never reached: {p.stderr}"
        pids = _pids(_runs(db, "killed"))
        doubled = [pid for pid, n in pids.items() if n > 1]
        assert not doubled, f"stored twice after a kill at {kill_at}: {doubled}"
    done = _run_child(db, "killed")
    assert done.returncode == 0, done.stderr

    runs = _runs(db, "killed")
    assert _pids(runs) == ref_pids  # each phase's runs, once each, as uninterrupted
    assert all(r.status == RunStatus.COMPLETED for r in runs)
    assert json.loads(done.stdout) == json.loads(ref.stdout)  # the same winner and advice
    with Store.open(str(db)) as st:
        assert st.study_meta("killed")["status"] == "done"
    keeps = [r for r in runs if r.conclusion == "keep"]
    assert len(keeps) == 1


def test_a_point_cached_by_another_study_is_stored_in_this_one(tmp_path: Path) -> None:
    """Two studies in one process share the simulator (its point cache): the second
    study's sweet-spot runs are stored too, not skipped as already measured."""
    db = str(tmp_path / "c.db")
    executors._BACKENDS.clear()
    executors._RECORDERS.clear()
    base = settings(db, "first")
    sim_only = dict(base.__dict__, mode="sim", real=None, finalists=0, edge=False)
    Tuner(TuneSettings(**sim_only)).run()
    Tuner(TuneSettings(**{**sim_only, "study": "second"})).run()
    executors._BACKENDS.clear()
    executors._RECORDERS.clear()
    with Store.open(db) as st:
        sweet = {s: [r for r in st.list_runs(study=s) if "sweet" in r.tags]
                 for s in ("first", "second")}  # fmt: skip
    assert len(sweet["first"]) >= 3
    assert len(sweet["second"]) == len(sweet["first"])
    assert {r.load.concurrency for r in sweet["second"]} == {
        r.load.concurrency for r in sweet["first"]
    }
