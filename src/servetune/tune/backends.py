"""Where a trial's load points are measured: the simulator or a real engine.

A backend checks a config against the planner (a config that cannot fit is skipped with
the planner's reason, never launched), opens a *session* for it (nothing for the
simulator; a launched engine for a real one) and measures load points in that session.
Both return the same `PointResult`, reduced from the same `RunResult`, so the tuner never
knows which one it is talking to. A config that fails at start or under load raises
`Infeasible` with the engine's own log lines.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.results.schema import Metrics, RunResult
from servetune.slo import SLO
from servetune.workload.spec import WorkloadSpec


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
    status: str = "completed"
    run_id: str | None = None

    @classmethod
    def from_metrics(
        cls,
        m: Metrics,
        load_kind: str,
        load: float,
        *,
        signals: dict[str, Any] | None = None,
        status: str = "completed",
        run_id: str | None = None,
    ) -> PointResult:
        passed = bool(m.slo_pass) and status == "completed" and m.completed > 0
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

    def missed(self) -> list[dict[str, Any]]:
        """The SLO checks this point failed, worst (value/target) first."""
        bad = [c for c in self.checks if not c.get("ok")]
        return sorted(bad, key=lambda c: -(c.get("value") or 0) / (c.get("target") or 1))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PointResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def load_spec(workload: WorkloadSpec, kind: str, load: float, per_user: int) -> WorkloadSpec:
    """The workload at one load point. Closed loop: `per_user` requests per user at least,
    so a high concurrency is not measured on a handful of requests."""
    if kind == "concurrency":
        c = int(load)
        count = max(workload.count or 0, per_user * c) or None
        return workload.with_load(concurrency=c, count=count)
    return workload.with_load(rate=load)


class Session(Protocol):
    launch_command: str

    def probe(self, kind: str, load: float) -> tuple[PointResult, RunResult]: ...


class Backend(Protocol):
    name: str

    def check(self, cfg: EngineConfig) -> str | None: ...

    def command(self, cfg: EngineConfig) -> str: ...

    def meta(self) -> dict[str, Any]: ...

    def session(self, cfg: EngineConfig) -> contextlib.AbstractContextManager[Session]: ...


@dataclass(frozen=True)
class BackendSpec:
    """Everything needed to rebuild a backend in another process (Ray workers)."""

    kind: str  # sim | real
    engine: str
    model: str  # catalog name or config path (planner/simulator)
    hardware: str
    workload: dict[str, Any]
    slo: dict[str, Any]
    model_path: str | None = None  # what a real engine serves (GGUF file, HF dir)
    hardware_file: str | None = None
    profile: str | None = None
    device: str | None = None
    executable: str | None = None
    per_user: int = 4
    launch_timeout_s: float = 600.0
    request_timeout_s: float = 120.0


def make_backend(spec: BackendSpec) -> SimBackend | RealBackend:
    if spec.kind == "sim":
        return SimBackend(spec)
    if spec.kind == "real":
        return RealBackend(spec)
    raise InputError("--backend", f"unknown backend {spec.kind!r}", "sim, real or hybrid")


def _planner_inputs(spec: BackendSpec) -> tuple[Any, Any]:
    from servetune.hardware import get_hardware
    from servetune.model import get_model

    return get_model(spec.model), get_hardware(spec.hardware, spec.hardware_file)


def planner_reason(model: Any, hw: Any, cfg: EngineConfig) -> str | None:
    """Why the planner proves `cfg` cannot start (None when it fits)."""
    from servetune.plan.planner import evaluate

    try:
        ev = evaluate(model, hw, cfg)
    except InputError as exc:
        return exc.one_line()
    return None if ev.fits else f"planner: {ev.verdict}"


# --- simulator ---------------------------------------------------------------------------


class SimBackend:
    name = "sim"

    def __init__(self, spec: BackendSpec) -> None:
        from servetune.slo import parse_slo
        from servetune.workload.spec import parse_workload

        self.spec = spec
        self.model, self.hw = _planner_inputs(spec)
        self.workload = parse_workload(spec.workload)
        self.slo: SLO = parse_slo(spec.slo)
        self.profile = None
        if spec.profile:
            from servetune.sim.profile import load_profile

            self.profile = load_profile(spec.profile)
        self.cache: dict[str, Any] = {}  # point id -> (PointResult, RunResult): sims repeat

    def command(self, cfg: EngineConfig) -> str:
        from servetune.engines.registry import launch_command

        device = "cpu" if self.hw.kind == "cpu" else "gpu"
        model = self.spec.model_path or self.model.name
        return launch_command(cfg.engine, cfg, model, device=device).shell()

    def meta(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "hardware": {"gpu": self.hw.name, "kind": self.hw.kind},
            "workload": self.spec.workload,
            "slo": self.spec.slo,
        }

    def check(self, cfg: EngineConfig) -> str | None:
        from servetune.sim.engine import setup

        reason = planner_reason(self.model, self.hw, cfg)
        if reason:
            return reason
        try:
            setup(self.model, self.hw, cfg, self.profile)
        except InputError as exc:
            return f"simulator: {exc.one_line()}"
        return None

    @contextlib.contextmanager
    def session(self, cfg: EngineConfig) -> Iterator[SimSession]:
        yield SimSession(self, cfg)


class SimSession:
    def __init__(self, backend: SimBackend, cfg: EngineConfig) -> None:
        self.b = backend
        self.cfg = cfg
        self.launch_command = backend.command(cfg)

    def probe(self, kind: str, load: float) -> tuple[PointResult, RunResult]:
        from servetune.sim.engine import simulate

        b = self.b
        spec = load_spec(b.workload, kind, load, b.spec.per_user)
        res, _ = simulate(b.model, b.hw, self.cfg, spec, profile=b.profile, slo=b.slo)
        sim = res.target.get("sim", {})
        signals = {
            "preemptions": sim.get("preemptions", 0),
            "rejected": sim.get("rejected", 0),
            "kv_blocks": res.target.get("kv_blocks"),
            "max_kv_blocks_used": sim.get("max_kv_blocks_used"),
            "max_num_seqs": res.target.get("max_num_seqs"),
            "max_in_flight": res.metrics.max_in_flight,
        }
        return PointResult.from_metrics(res.metrics, kind, load, signals=signals), res


# --- real engine -------------------------------------------------------------------------


class RealBackend:
    name = "real"

    def __init__(self, spec: BackendSpec) -> None:
        from servetune.engines import install
        from servetune.slo import parse_slo
        from servetune.workload.spec import parse_workload

        self.spec = spec
        self.found = install.require(spec.engine, spec.executable)  # not installed: exit 2
        self.workload = parse_workload(spec.workload)
        self.slo = parse_slo(spec.slo)
        self.model = self.hw = None
        with contextlib.suppress(InputError):
            self.model, self.hw = _planner_inputs(spec)
        self._requests: dict[str, list] = {}

    def command(self, cfg: EngineConfig) -> str:
        from servetune.engines.registry import launch_command

        device = self.spec.device or "gpu"
        model = self.spec.model_path or self.spec.model
        spec = launch_command(
            cfg.engine,
            cfg,
            model,
            device=device,  # type: ignore[arg-type]
            prefix=list(self.found.prefix),
        )
        return spec.shell()

    def meta(self) -> dict[str, Any]:
        from servetune.store.meta import host_info

        return {
            "model": self.model.name if self.model is not None else self.spec.model,
            "hardware": host_info(),
            "software": {"engine_version": self.found.version},
            "workload": self.spec.workload,
            "slo": self.spec.slo,
        }

    def check(self, cfg: EngineConfig) -> str | None:
        if self.model is None or self.hw is None:
            return None  # nothing to plan with: the engine will say
        return planner_reason(self.model, self.hw, cfg)

    @contextlib.contextmanager
    def session(self, cfg: EngineConfig) -> Iterator[RealSession]:
        from servetune.engines.process import EngineError, launch

        try:
            srv = launch(
                self.spec.engine,
                cfg,
                self.spec.model_path or self.spec.model,
                device=self.spec.device,  # type: ignore[arg-type]
                executable=self.spec.executable,
                timeout_s=self.spec.launch_timeout_s,
            )
        except EngineError as exc:
            raise Infeasible(exc.kind, f"failed to start: {exc.problem}", exc.log_tail) from None
        try:
            yield RealSession(self, srv)
        finally:
            srv.stop()


class RealSession:
    def __init__(self, backend: RealBackend, srv: Any) -> None:
        self.b = backend
        self.srv = srv
        self.launch_command = srv.spec.shell()

    def probe(self, kind: str, load: float) -> tuple[PointResult, RunResult]:
        from servetune.bench.client import Timeouts
        from servetune.bench.runner import BenchInterrupted, BenchOptions, run_point
        from servetune.bench.server_metrics import engine_adapter, http_fetcher
        from servetune.engines.process import EngineError
        from servetune.store.meta import server_summary
        from servetune.workload.materialize import materialize
        from servetune.workload.tokenizer import load_tokenizer

        b, srv = self.b, self.srv
        spec = load_spec(b.workload, kind, load, b.spec.per_user)
        key = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
        if key not in b._requests:  # same model, same tokenizer: prompts are reusable
            b._requests[key] = materialize(spec, load_tokenizer("server", srv.url))
        t = b.spec.request_timeout_s
        opts = BenchOptions(
            url=srv.url,
            model=srv.served_model,
            timeouts=Timeouts(10.0, t, min(60.0, t), 2 * t),
            metrics_fetch=http_fetcher(srv.url, engine_adapter(srv.engine)),
            keep_text=False,
            drain_s=2 * t,
        )
        try:
            res = run_point(spec, b._requests[key], opts, b.slo, label=f"{kind}={load:g}")
        except BenchInterrupted:
            raise KeyboardInterrupt from None
        try:
            srv.check()
        except EngineError as exc:
            raise Infeasible(exc.kind, f"died under load: {exc.problem}", exc.log_tail) from None
        res.target.update(
            engine=srv.engine,
            config=srv.cfg.model_dump(mode="json", exclude_defaults=True),
            settings=srv.settings,
        )
        signals = server_summary(res.server)
        signals["max_in_flight"] = res.metrics.max_in_flight
        point = PointResult.from_metrics(
            res.metrics, kind, load, signals=signals, status=res.status
        )
        return point, res
