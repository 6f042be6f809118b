"""Where a tuning trial's load points are measured: the simulator or a real engine.

A backend checks a config against the planner (a config that cannot fit is skipped with
the planner's reason, never launched), opens a *session* for it (the simulator running
it, or a launched engine) and probes loads of the study's workload in that session.
Both measure through the same `Session.measure` as `simulate` and `bench`, and reduce the
same `RunResult` to a `PointResult`, so the tuner never knows which one it talks to. A
config that fails at start or under load raises `Infeasible` with the engine's own log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from servetune.engines import install
from servetune.engines.config import EngineConfig
from servetune.engines.process import EngineError, launch
from servetune.engines.registry import launch_command
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.measure.loads import probe_point
from servetune.measure.real import EngineSession
from servetune.measure.result import Infeasible, PointResult
from servetune.measure.session import NO_SINKS, Session, Sinks
from servetune.measure.simulated import SimSession
from servetune.measure.steady import SteadyRule, apply_steady_state, default_rule
from servetune.model import get_model
from servetune.model.catalog import serving_reference
from servetune.plan.planner import evaluate
from servetune.results.schema import RunResult
from servetune.sim.engine import setup
from servetune.sim.profile import load_profile
from servetune.slo import SLO, parse_slo
from servetune.store.meta import host_info
from servetune.workload.spec import WorkloadSpec, parse_workload


class Backend(Protocol):
    name: str

    def check(self, cfg: EngineConfig) -> str | None: ...

    def command(self, cfg: EngineConfig) -> str: ...

    def meta(self) -> dict[str, Any]: ...

    def session(self, cfg: EngineConfig) -> contextlib.AbstractContextManager[Session]: ...

    def probe(
        self, session: Session, kind: str, load: float, *, search: bool = False
    ) -> tuple[PointResult, RunResult]: ...


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
    steady: SteadyRule | None = None  # open-loop sizing and verdict (None: the kind's)
    launch_timeout_s: float = 600.0
    request_timeout_s: float = 120.0


def make_backend(spec: BackendSpec) -> SimBackend | RealBackend:
    if spec.kind == "sim":
        return SimBackend(spec)
    if spec.kind == "real":
        return RealBackend(spec)
    raise InputError("--backend", f"unknown backend {spec.kind!r}", "sim, real or hybrid")


def _planner_inputs(spec: BackendSpec) -> tuple[Any, Any]:

    return get_model(spec.model), get_hardware(spec.hardware, spec.hardware_file)


def planner_reason(model: Any, hw: Any, cfg: EngineConfig) -> str | None:
    """Why the planner proves `cfg` cannot start (None when it fits)."""
    try:
        ev = evaluate(model, hw, cfg)
    except InputError as exc:
        return exc.one_line()
    return None if ev.fits else f"planner: {ev.verdict}"


class _Probes:
    """What both backends share: the study's workload and SLO, and `probe`."""

    # A live terminal view of each probe (bench.live.LiveView: called with the runner's
    # progress, closed after the probe); `tune` sets it in its own process only.
    live: Any = None

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        self.workload: WorkloadSpec = parse_workload(spec.workload)
        self.slo: SLO = parse_slo(spec.slo)
        self.steady: SteadyRule = spec.steady or default_rule(spec.kind)

    def probe(
        self, session: Session, kind: str, load: float, *, search: bool = False
    ) -> tuple[PointResult, RunResult]:
        """Measure the study's workload at `load` (`kind`: concurrency or rate); an
        open-loop point that does not reach steady state fails (`measure.steady`). A
        capacity search's point (`search`) asks only pass or fail: it stops once its SLO
        miss is decided (`metrics.decided`); repetitions and sweeps measure whole."""
        point = probe_point(self.workload, kind, load, self.spec.per_user, self.steady)
        point = replace(point, stop_when_missed=search)
        try:
            res = session.measure(point, Sinks(live=self.live) if self.live else NO_SINKS)
        finally:
            if self.live is not None:
                self.live.close()
        steady = apply_steady_state(res, point.spec, self.steady)
        out = PointResult.from_run(res, kind, load)
        if kind == "rate" and point.spec.sessions is not None:
            out.signals["rate_unit"] = "sessions/s"  # the schedule starts sessions
        if steady is not None:
            out.signals |= steady.signals()
        return out, res


# --- simulator ---------------------------------------------------------------------------


class SimBackend(_Probes):
    name = "sim"

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        self.model, self.hw = _planner_inputs(spec)
        self.profile = None
        if spec.profile:
            self.profile = load_profile(spec.profile)
        self.cache: dict[str, Any] = {}  # point id -> (PointResult, RunResult): sims repeat

    def command(self, cfg: EngineConfig) -> str:

        device = "cpu" if self.hw.kind == "cpu" else "gpu"
        model = self.spec.model_path or serving_reference(self.spec.model)
        return launch_command(cfg.engine, cfg, model, device=device).shell()

    def meta(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "hardware": {"gpu": self.hw.name, "kind": self.hw.kind},
            "workload": self.spec.workload,
            "slo": self.spec.slo,
        }

    def check(self, cfg: EngineConfig) -> str | None:
        reason = planner_reason(self.model, self.hw, cfg)
        if reason:
            return reason
        try:
            setup(self.model, self.hw, cfg, self.profile)
        except InputError as exc:
            return f"simulator: {exc.one_line()}"
        return None

    @contextlib.contextmanager
    def session(self, cfg: EngineConfig) -> Iterator[Session]:
        yield SimSession(
            self.model,
            self.hw,
            cfg,
            profile=self.profile,
            slo=self.slo,
            launch_command=self.command(cfg),
        )


# --- real engine -------------------------------------------------------------------------


class RealBackend(_Probes):
    name = "real"

    def __init__(self, spec: BackendSpec) -> None:
        self.found = install.require(spec.engine, spec.executable)  # not installed: exit 2
        super().__init__(spec)
        self.model = self.hw = None
        with contextlib.suppress(InputError):
            self.model, self.hw = _planner_inputs(spec)
        self._requests: dict[str, list] = {}  # one model, one tokenizer: prompts are reusable

    def command(self, cfg: EngineConfig) -> str:
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
    def session(self, cfg: EngineConfig) -> Iterator[Session]:

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
        if self.live is not None:
            self.live.target(srv.url, srv.engine)
        try:
            yield EngineSession(srv, self.slo, self.spec.request_timeout_s, self._requests)
        finally:
            srv.stop()
