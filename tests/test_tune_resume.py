"""A study killed at any point continues where it was: nothing measured is lost, nothing
is measured twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from servetune.measure import BackendSpec, SimBackend
from servetune.status import RunStatus
from servetune.store import Store
from servetune.tune import executors
from servetune.tune.capacity import concurrency_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import parse_space
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import Tuner, TuneSettings

SPACE = """
engine: vllm
fixed: {max_model_len: 8192}
knobs:
  max_num_seqs: [8, 16, 32, 64, 128, 192]
  max_num_batched_tokens: [2048, 8192]
  gpu_memory_utilization: [0.9]
"""


def _count(db: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
            return c.execute("select count(*) from runs").fetchone()[0]
    except sqlite3.Error:
        return 0


def _trial_runs(db: Path, study: str) -> list:
    with Store.open(str(db)) as st:
        return [r for r in st.list_runs(study=study) if "trial" in r.tags]


def test_sigkill_then_resume_loses_and_repeats_no_trial(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    db = tmp_path / "t.db"
    Store.open(str(db)).close()  # the schema exists before the poller reads it
    cmd = [sys.executable, "-m", "servetune.cli.app", "tune", "--backend", "sim",
           "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--space", "space.yaml",
           "--strategy", "grid", "--db", str(db), "--study", "kill", "-o", "r.html",
           "--no-edge", "--json", "-q"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    before: list = []
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        if db.exists():
            before = _trial_runs(db, "kill")
            if len(before) >= 4:
                break
    assert proc.poll() is None, "the study finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _trial_runs(db, "kill")
    assert 4 <= len(before) < 13
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    after = _trial_runs(db, "kill")
    keys = [r.tune.key for r in after]
    assert len(keys) == len(set(keys)), "a trial was stored twice"
    assert len(after) == 13  # 12 grid configs + the baseline, none lost
    assert all(r.status == RunStatus.COMPLETED for r in after)
    kept = {r.id: r.created_utc for r in after}
    done_before = [r for r in before if r.status == RunStatus.COMPLETED]
    assert len(before) - len(done_before) <= 1  # at most the trial being written
    assert all(kept[r.id] == r.created_utc for r in done_before)  # never redone
    assert out["counts"]["trials"] == 13


class CountingReal(SimBackend):
    """The simulator dressed as a real engine: points are stored one by one like a real
    engine's, and the test can stop it mid-trial like a kill."""

    name = "real"

    def __init__(self, spec: BackendSpec, stop_after: int | None) -> None:
        super().__init__(spec)
        self.probes = 0
        self.stop_after = stop_after

    def probe(self, session, kind: str, load: float, *, search: bool = False):  # type: ignore[override]
        if self.stop_after is not None and self.probes >= self.stop_after:
            raise KeyboardInterrupt
        self.probes += 1
        return super().probe(session, kind, load, search=search)


def _settings(tmp_path: Path, spec: BackendSpec) -> TuneSettings:
    space = parse_space({"engine": "vllm", "fixed": {"max_model_len": 4096},
                         "knobs": {"max_num_seqs": [2, 4, 16]}})  # fmt: skip
    return TuneSettings(
        space=space,
        mode="real",
        objective=Objective("goodput"),
        search=SearchSettings("concurrency", concurrency_lattice(32), max_probes=8),
        real=spec,
        strategy="grid",
        finalists=1,
        repeats=3,
        db=str(tmp_path / "real.db"),
        study="pointwise",
        edge=False,
        verbose=False,
    )


def test_point_level_resume_measures_each_point_once(tmp_path: Path) -> None:
    spec = BackendSpec(
        kind="real",
        engine="vllm",
        model="llama-3.1-8b",
        hardware="h100-sxm",
        workload={"count": 20, "input_tokens": {"dist": "fixed", "value": 256},
                  "output_tokens": {"dist": "fixed", "value": 64},
                  "arrival": {"kind": "closed", "concurrency": 1}},
        slo={"ttft_ms": {"p95": 150}, "tpot_ms": {"p95": 30}},
    )  # fmt: skip
    key = json.dumps(asdict(spec), sort_keys=True, default=str)
    executors._BACKENDS.clear()
    executors._RECORDERS.clear()
    first = CountingReal(spec, stop_after=7)
    executors._BACKENDS[key] = first
    with pytest.raises(KeyboardInterrupt):
        Tuner(_settings(tmp_path, spec)).run()
    assert first.probes == 7
    with Store.open(str(tmp_path / "real.db")) as st:
        runs = st.list_runs(study="pointwise")
    assert sum(r.status == RunStatus.COMPLETED for r in runs) == 7
    assert sum(r.status == RunStatus.INTERRUPTED for r in runs) == 1  # the point being measured
    second = CountingReal(spec, stop_after=None)
    executors._BACKENDS[key] = second
    executors._RECORDERS.clear()  # as a new process would: the study is read from the store
    out = Tuner(_settings(tmp_path, spec)).run()
    whole = CountingReal(spec, stop_after=None)
    executors._BACKENDS[key] = whole
    ref = Tuner(_settings(tmp_path, spec).__class__(**{**_settings(tmp_path, spec).__dict__,
                                                     "study": "ref"})).run()  # fmt: skip
    executors._BACKENDS.clear()
    # the resumed study measured exactly what the uninterrupted one did, minus the 7
    assert second.probes == whole.probes - 7
    assert [t.key for t in out.ranked] == [t.key for t in ref.ranked]
    assert [t.score for t in out.ranked] == [t.score for t in ref.ranked]
    assert out.winner.ci is not None and out.winner.ci["n"] == 3


def test_a_refused_resume_names_the_settings_that_differ(tmp_path: Path) -> None:
    """A study resumed with another --trials or --max-probes was refused as "(space,
    workload, SLO, backend or strategy)", whatever differed; --max-probes was not in the
    fingerprint at all, so the old result was replayed as the new one's."""
    from servetune.errors import InputError
    from servetune.store import Store
    from servetune.tune.study import fingerprint, open_study

    first = {"--trials": 1, "the load search": ["concurrency", 8]}
    again = {"--trials": 1, "the load search": ["concurrency", 3]}
    with Store.open(str(tmp_path / "s.db")) as store:
        open_study(store, "s", fingerprint(first), {}, False, parts=first)
        with pytest.raises(InputError, match=r"other settings \(the load search\)"):
            open_study(store, "s", fingerprint(again), {}, False, parts=again)
        assert open_study(store, "s", fingerprint(first), {}, False, parts=first) == "s"
