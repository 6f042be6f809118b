"""RunInfo: one stored run as `runs list/show/compare`, the report and exports read it
(the row and its derived §16 fields; records not loaded)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from servetune.results.schema import Load, Target, TuneTag
from servetune.status import RunStatus
from servetune.store.liveness import effective_status
from servetune.store.models import Run


@dataclass
class RunInfo:
    """One run as listed/shown/compared (records not loaded)."""

    id: str
    study: str | None
    created_utc: str
    updated_utc: str
    backend: str
    status: RunStatus
    stop_reason: str | None
    model: str | None
    engine: str | None
    engine_version: str | None
    hardware: str | None
    gpu_count: int | None
    load_kind: str | None
    rate: float | None
    concurrency: int | None
    n_records: int
    meta: dict[str, Any]
    result: dict[str, Any]
    metrics: dict[str, Any] | None
    request_dist: dict[str, Any] | None
    stability: dict[str, Any] | None
    quality: dict[str, Any] | None
    conclusion: str | None
    conclusion_note: str | None
    concluded_utc: str | None
    tags: list[str] = field(default_factory=list)

    @property
    def engine_config(self) -> dict[str, Any]:
        return dict(self.meta.get("engine_config") or {})

    def part(self, name: str) -> Any:
        """target/workload/load/slo: the final result's, else what begin_run was told."""
        return self.result.get(name) or self.meta.get(name)

    @property
    def target(self) -> Target:
        """What was measured: the final result's target over what begin_run was told (all
        a run that never finished has; where tune keeps its tag)."""
        told, final = self.meta.get("target") or {}, self.result.get("target") or {}
        return Target.model_validate({**told, **final})

    @property
    def load(self) -> Load:
        return Load.model_validate(self.part("load") or {})

    @property
    def tune(self) -> TuneTag | None:
        """The tuner's tag, for a run stored by `tune`."""
        return self.target.tune

    def load_label(self) -> str:
        if self.concurrency is not None and self.load_kind in (None, "closed", "concurrency"):
            return f"c={self.concurrency}"
        if self.rate is not None:  # a sessions workload's schedule starts sessions
            unit = "sessions/s" if (self.part("workload") or {}).get("sessions") else "req/s"
            return f"{self.rate:g} {unit}"
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        return self.load_kind or "-"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_info(run: Run, now: datetime) -> RunInfo:
    """The row as readers see it: the status corrected for a writer that is gone."""
    return RunInfo(
        id=run.id,
        study=run.study.name if run.study else None,
        created_utc=run.created_utc,
        updated_utc=run.updated_utc,
        backend=run.backend,
        status=effective_status(run.status, run.writer, run.updated_utc, now),
        stop_reason=run.stop_reason,
        model=run.model,
        engine=run.engine,
        engine_version=run.engine_version,
        hardware=run.hardware,
        gpu_count=run.gpu_count,
        load_kind=run.load_kind,
        rate=run.rate,
        concurrency=run.concurrency,
        n_records=run.n_records,
        meta=run.meta or {},
        result=run.result or {},
        metrics=run.metrics,
        request_dist=run.request_dist,
        stability=run.stability,
        quality=run.quality,
        conclusion=run.conclusion,
        conclusion_note=run.conclusion_note,
        concluded_utc=run.concluded_utc,
        tags=sorted(t.tag for t in run.tags),
    )
