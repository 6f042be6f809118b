"""A tuning study: its state lives in the store, so a study killed at any point (even
SIGKILL) continues where it was when the same command runs again.

How nothing is lost or repeated: every measured point is a run of the study whose id is
derived from (study, config, load, phase, repetition). The search is deterministic for
its seed and for what it is told, so a restarted study asks for the same points in the
same order, and each point already in the store is read back instead of measured; a
point that was running when the process died is `incomplete` and is measured again (a
new attempt id; the partial one stays, as the record of what happened). Simulator
trials are stored one run per trial (its best point; the other points are recomputed in
milliseconds). The study's settings fingerprint, progress and final summary live in the
`studies.meta` column.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure.result import Infeasible, PointResult, sim_signals
from servetune.results.schema import (
    Load,
    Metrics,
    RunResult,
    Target,
    TuneFailure,
    TuneTag,
)
from servetune.status import RunStatus
from servetune.store import RunInfo, RunMeta, Store
from servetune.tune.trial import TrialResult

TUNE_KIND = "tune"


class Recorder:
    """The store side of a study: look points up, write them as runs."""

    def __init__(self, db: str | None, study: str, kind: str) -> None:
        self.store = Store.open(db)
        self.study = study
        self.kind = kind  # sim | real: sim stores one run per trial
        self._points: dict[str, Any] = {}  # pid -> PointResult | Infeasible
        self._trials: dict[str, TrialResult] = {}
        self._attempts: dict[str, int] = {}

    def refresh(self) -> None:
        """Re-read the study. Simulator trial runs left `incomplete` by a killed writer
        hold nothing (no records, no result) and are removed, so the trial is stored once
        when it is recomputed; a real point's incomplete attempt stays as the record of the
        interruption and the point is measured again under a new attempt id."""
        self._points.clear()
        self._trials.clear()
        self._attempts.clear()
        partial = []
        for info in self.store.list_runs(study=self.study):
            tag = info.tune
            if tag is None:
                continue
            pid = tag.pid
            if info.status == RunStatus.INCOMPLETE and info.backend == "sim":
                partial.append(info.id)
                continue
            self._attempts[pid] = self._attempts.get(pid, 0) + 1  # run ids: one space
            if (info.backend == "sim") != (self.kind == "sim"):
                continue  # the other backend's point: never read back as this one's
            if info.status == RunStatus.COMPLETED:
                if tag.trial is not None and info.backend == "sim":
                    self._trials[tag.key] = TrialResult.from_json(tag.trial)
                if info.metrics is not None and tag.load_kind and tag.load is not None:
                    self._points[pid] = _point_from_info(info, tag.load_kind, tag.load)
            elif info.status == RunStatus.FAILED and tag.failure is not None:
                f = tag.failure
                self._points.setdefault(
                    pid, Infeasible(f.kind, info.stop_reason or f.reason, f.log_tail)
                )
        if partial:
            self.store.delete(partial)

    # -- reading ----------------------------------------------------------------------

    def point(self, pid: str) -> PointResult | Infeasible | None:
        return self._points.get(pid)

    def sim_trial(self, key: str) -> TrialResult | None:
        return self._trials.get(key)

    # -- writing ----------------------------------------------------------------------

    def _run_id(self, pid: str) -> str:
        base = "tune-" + hashlib.sha1(f"{self.study}|{pid}".encode()).hexdigest()[:16]
        n = self._attempts.get(pid, 0)
        self._attempts[pid] = n + 1
        return base if n == 0 else f"{base}-{n + 1}"

    def _meta(
        self,
        run_id: str,
        backend: Any,
        cfg: EngineConfig,
        command: str | None,
        tag: TuneTag,
        load: Load,
    ) -> RunMeta:
        m = backend.meta()
        return RunMeta(
            id=run_id,
            backend="sim" if backend.name == "sim" else "real",
            study=self.study,
            study_kind=TUNE_KIND,
            tags=["tune", tag.phase],
            model=m.get("model"),
            engine_config=cfg.model_dump(mode="json"),
            launch_command=command,
            hardware=m.get("hardware") or {},
            software=m.get("software") or {},
            target=Target(tune=tag),
            workload=m.get("workload") or {},
            load=load,
            slo=m.get("slo"),
        )

    def begin_point(
        self,
        pid: str,
        backend: Any,
        cfg: EngineConfig,
        command: str | None,
        where: tuple[str, float, str, int],
    ) -> str | None:
        kind, load, phase, rep = where
        if self.kind == "sim" and phase == "probe":
            return None  # simulator probes: stored per trial (save_sim_trial)
        run_id = self._run_id(pid)
        key = pid.split("/")[0]
        tag = TuneTag(pid=pid, key=key, load_kind=kind, load=load, phase=phase, rep=rep)
        self.store.begin_run(self._meta(run_id, backend, cfg, command, tag, Load.point(kind, load)))
        return run_id

    def finish_point(
        self, pid: str, run_id: str | None, res: RunResult, point: PointResult
    ) -> None:
        if run_id is None:
            return
        self.store.finish_run(run_id, res)
        self._points[pid] = point

    def fail_point(self, run_id: str | None, exc: Infeasible) -> None:
        if run_id is None:
            return
        self.store.abandon_run(run_id, RunStatus.FAILED, _failure_text(exc))

    def abandon_point(self, run_id: str | None) -> None:
        if run_id is not None:
            self.store.abandon_run(run_id, RunStatus.INTERRUPTED, "stopped while measuring")

    def record_failure(self, pid: str, backend: Any, cfg: EngineConfig, exc: Infeasible) -> None:
        """A config that would not start: a failed run quoting the engine's log."""
        run_id = self._run_id(pid)
        failure = TuneFailure(kind=exc.kind, reason=exc.reason, log_tail=exc.log_tail[-30:])
        tag = TuneTag(pid=pid, key=pid.split("/")[0], phase="launch", failure=failure)
        self.store.begin_run(self._meta(run_id, backend, cfg, backend.command(cfg), tag, Load()))
        self.store.abandon_run(run_id, RunStatus.FAILED, _failure_text(exc))
        self._points[pid] = exc

    def save_sim_trial(self, trial: TrialResult, res: RunResult | None, backend: Any) -> None:
        """One run per simulated trial: its best point, without per-request records (the
        simulator regenerates them exactly), the whole trial in meta."""
        pid = f"{trial.key}/trial"
        if trial.key in self._trials:
            return
        run_id = self._run_id(pid)
        best = trial.best or (trial.points[-1] if trial.points else None)
        tag = TuneTag(pid=pid, key=trial.key, phase="trial", trial=trial.to_json())
        load = Load()
        if best is not None:
            tag.load_kind, tag.load = best.load_kind, best.load
            load = Load.point(best.load_kind, best.load)
        meta = self._meta(run_id, backend, trial.cfg, trial.launch_command, tag, load)
        if res is None:
            self.store.begin_run(meta)
            self.store.abandon_run(run_id, RunStatus.FAILED, trial.reason or str(trial.status))
        else:
            light = res.model_copy(update={"id": run_id, "records": [], "requests": []})
            self.store.save_result(light, meta)
        self._trials[trial.key] = trial


def _failure_text(exc: Infeasible) -> str:
    lines = " | ".join(exc.log_tail[-5:])
    return f"{exc.kind}: {exc.reason}" + (f" [engine log: {lines}]" if lines else "")


def _point_from_info(info: RunInfo, load_kind: str, load: float) -> PointResult:
    m = Metrics.model_validate(info.metrics)
    result = info.result or {}
    signals = (
        sim_signals(info.target)
        if info.backend == "sim"
        else dict(result.get("server_summary") or {})
    )
    signals["max_in_flight"] = m.max_in_flight
    return PointResult.from_metrics(
        m,
        load_kind,
        load,
        signals=signals,
        status=RunStatus(result.get("status") or info.status),
        run_id=info.id,
    )


def fingerprint(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def open_study(
    store: Store,
    name: str,
    fp: str,
    settings: dict[str, Any],
    fresh: bool,
    named: bool = True,
    parts: dict[str, Any] | None = None,
) -> str:
    """Create or resume study `name`. A study started with other settings is refused
    (resuming it would mix two searches), naming which of `parts` (the settings the
    fingerprint `fp` hashes) differ; `fresh` picks a new name instead. An unnamed
    (fingerprint-named) study that already finished is not replayed: running the same
    command again measures again, under `NAME-2`, ... (a killed one is resumed)."""
    part_fps = {k: fingerprint({k: v}) for k, v in (parts or {}).items()}
    meta = store.study_meta(name)
    if meta is not None and not named and meta.get("status") != "running":
        fresh = True
    if meta is not None and fresh:
        k = 2
        while store.study_meta(f"{name}-{k}") is not None:
            k += 1
        name = f"{name}-{k}"
        meta = None
    if meta is not None and meta.get("fingerprint") not in (None, fp):
        before = meta.get("parts") or {}
        changed = sorted(k for k in part_fps if k in before and before[k] != part_fps[k])
        what = ", ".join(changed) or "space, workload, SLO, backend or strategy"
        raise InputError(
            "--study",
            f"study {name!r} was started with other settings ({what})",
            "give another --study name, or --fresh",
        )
    store.update_study_meta(
        name,
        {
            "fingerprint": fp,
            "parts": part_fps,
            "settings": settings,
            "status": "running",
            "started_unix_s": (meta or {}).get("started_unix_s") or time.time(),
            "resumed": (meta or {}).get("resumed", -1) + 1,
        },
        TUNE_KIND,
    )
    return name
