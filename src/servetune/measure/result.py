"""A measured point as the tuner sees it (`PointResult`), and a config that cannot be
measured at all (`Infeasible`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from servetune.measure.steady import rate_unit
from servetune.results.schema import Metrics, RunResult, SimStats, Target
from servetune.status import RunStatus
from servetune.store.meta import server_summary
from servetune.telemetry.contention import contention
from servetune.telemetry.sampler import summarize


class Infeasible(Exception):
    """The engine would not start or died under load (OOM, crash, bad flag)."""

    def __init__(self, kind: str, reason: str, log_tail: list[str] | None = None) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.log_tail = log_tail or []


@dataclass
class PointResult:
    """One load point, reduced to what ranking, bisection and the explanation need."""

    load_kind: str
    load: float
    passed: bool
    req_s: float = 0.0
    output_tok_s: float = 0.0
    goodput_req_s: float | None = None
    attainment: float | None = None
    error_rate: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    completed: int = 0
    failed: int = 0
    checks: list[dict[str, Any]] = field(default_factory=list)
    signals: dict[str, Any] = field(default_factory=dict)
    status: RunStatus = RunStatus.COMPLETED
    run_id: str | None = None

    @classmethod
    def from_metrics(
        cls,
        m: Metrics,
        load_kind: str,
        load: float,
        *,
        signals: dict[str, Any] | None = None,
        status: RunStatus = RunStatus.COMPLETED,
        run_id: str | None = None,
    ) -> PointResult:
        passed = bool(m.slo_pass) and status == RunStatus.COMPLETED and m.completed > 0
        return cls(
            load_kind=load_kind,
            load=load,
            passed=passed,
            req_s=m.req_s,
            output_tok_s=m.output_tok_s,
            goodput_req_s=m.goodput_req_s,
            attainment=m.slo_attainment,
            error_rate=m.error_rate,
            ttft_p50_ms=m.ttft_ms.p50,
            ttft_p95_ms=m.ttft_ms.p95,
            ttft_p99_ms=m.ttft_ms.p99,
            tpot_p50_ms=m.tpot_ms.p50,
            tpot_p95_ms=m.tpot_ms.p95,
            e2e_p95_ms=m.e2e_ms.p95,
            completed=m.completed,
            failed=m.failed,
            checks=[c.model_dump() for c in m.slo_checks],
            signals=signals or {},
            status=status,
            run_id=run_id,
        )

    @classmethod
    def from_run(cls, res: RunResult, load_kind: str, load: float) -> PointResult:
        """The tuner's view of a measured run: its metrics, status and `signals`."""
        return cls.from_metrics(
            res.metrics, load_kind, load, signals=signals(res), status=res.status
        )

    @property
    def unit(self) -> str:
        """The unit of `load`: users, req/s, or sessions/s (a sessions workload's rate)."""
        return "users" if self.load_kind == "concurrency" else rate_unit(self.signals)

    def missed(self) -> list[dict[str, Any]]:
        """The SLO checks this point failed, worst (value/target) first."""
        bad = [c for c in self.checks if not c.get("ok")]
        return sorted(bad, key=lambda c: -(c.get("value") or 0) / (c.get("target") or 1))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PointResult:
        p = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        p.status = RunStatus(p.status)
        return p


def sim_signals(target: Target) -> dict[str, Any]:
    """The simulator's scheduler counters the explanation reads (a fresh run's target, or
    one read back from the store on resume)."""
    sim = target.sim or SimStats()
    out = {
        "preemptions": sim.preemptions,
        "rejected": sim.rejected,
        "kv_blocks": target.kv_blocks,
        "max_kv_blocks_used": sim.max_kv_blocks_used,
        "max_num_seqs": target.max_num_seqs,
    }
    d = sim.pool_doubt
    if d is not None:  # a GPU point at its pool's edge (sim.pool_doubt), said by `explain`
        out |= {
            "smaller_pool_share": d.share,
            "smaller_pool_tokens": d.kv_capacity_tokens,
            "smaller_pool_slo_pass": d.slo_pass,
        }
    return out


def signals(res: RunResult) -> dict[str, Any]:
    """What the explanation reads besides the metrics: the simulator's scheduler counters,
    or the engine's own /metrics summary (peaks, preemptions) for a real run, and the
    host's contention when other processes held cores its threads wanted."""
    if res.backend == "sim":
        out = sim_signals(res.target)
    else:
        out = server_summary(res.server, res.telemetry)
        held = contention(summarize(res.telemetry))
        if held is not None:  # the tuner fits the engine's threads to the host (tune.hostfit)
            out |= {"free_cores": held.free_cores, "contention": held.describe()}
    out["max_in_flight"] = res.metrics.max_in_flight
    return out


def whole_points(points: Iterable[PointResult]) -> list[PointResult]:
    """The points measured whole: not a probe stopped at its decided SLO miss, whose
    figures are those of part of its rounds (`metrics.decided`): its throughput is no
    rate of its load (a loop of 6 users stopped after 2 answers read 0.43 req/s where 4
    users served 2.3)."""
    return [p for p in points if p.status != RunStatus.SLO_MISSED]
