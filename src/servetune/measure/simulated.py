"""Simulated measurements: `SimSession.measure` replays a point's requests through the
engine simulator (`sim.engine.simulate`) and returns the same RunResult schema as a real
server (backend "sim"). `simulate`, the tuner's simulator backend and the fidelity
harness all measure through it."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from servetune.build import build_id
from servetune.engines.config import EngineConfig
from servetune.hardware.spec import HardwareSpec
from servetune.measure.session import NO_SINKS, Point, Sinks
from servetune.model.spec import ModelSpec
from servetune.results.schema import RunResult
from servetune.sim.engine import SimSetup, materialize_for_sim, setup, simulate
from servetune.sim.pool_doubt import pool_doubt
from servetune.sim.profile import Profile
from servetune.sim.trace import write_trace
from servetune.slo import SLO
from servetune.store import RunMeta


class SimSession:
    """The simulator running `cfg` for `model` on `hw`. `shapes`: the step sizes the
    simulated engine has already run, shared across points (None: every point starts
    from a fresh engine); the fidelity harness chains runs made against one real engine."""

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        cfg: EngineConfig,
        *,
        profile: Profile | None = None,
        slo: SLO | None = None,
        shapes: set[int] | None = None,
        launch_command: str | None = None,
    ) -> None:
        self.model, self.hw, self.cfg = model, hw, cfg
        self.profile, self.slo, self.shapes = profile, slo, shapes
        self.launch_command = launch_command

    @cached_property
    def setup(self) -> SimSetup:
        """The resolved scheduler knobs and step-time tier; raises the one-line
        InputError of a config the engine would refuse."""
        return setup(self.model, self.hw, self.cfg, self.profile)

    def measure(self, point: Point, sinks: Sinks = NO_SINKS) -> RunResult:
        """Simulate the point (its fixed requests, else the spec's, counted without
        text). The per-step trace and the store row are written when the sinks ask."""
        reqs = point.requests if point.requests is not None else materialize_for_sim(point.spec)
        res, sched = simulate(
            self.model,
            self.hw,
            self.cfg,
            point.spec,
            reqs,
            profile=self.profile,
            slo=self.slo,
            trace=sinks.trace is not None,
            shapes=self.shapes,
        )
        # which servetune simulated it (not in `simulate`: its ~13 ms digest, once a
        # process, would count against the simulator's end-to-end speed target)
        res.target.sim.build = build_id()
        # a GPU point at its KV pool's edge: again on the pool servetune may overstate (set
        # only there: a stored part writes the keys it was given, the store's old shape)
        doubt = pool_doubt(
            self.model, self.hw, self.cfg, point.spec, reqs, res, profile=self.profile, slo=self.slo
        )
        if doubt is not None:
            res.target.sim.pool_doubt = doubt
        if sinks.trace is not None:
            write_trace(sched, sinks.trace)
        if sinks.store is not None:
            sinks.store.save(res)
        return res

    def run_meta(self) -> RunMeta:
        """What the store records about every run of this session: the model, the
        config, the step-time tier (and profile), and the simulated device."""
        prof = self.profile
        software = {"engine": self.cfg.engine, "step_model": self.setup.step_model.tier}
        if prof is not None:
            software |= {"engine_version": prof.engine_version, "profile": prof.key}
        return RunMeta(
            backend="sim",
            model=self.model.name,
            engine_config=self.cfg.model_dump(mode="json"),
            hardware=self.hardware_record(),
            software=software,
            slo=self.slo.model_dump(mode="json") if self.slo is not None else None,
        )

    def hardware_record(self) -> dict[str, Any]:
        """The simulated device as the store's §16 hardware record: the catalog entry,
        not this host (`simulated: true`), with the spec the step times were priced from."""
        hw, spec = self.hw, self.hw.model_dump(mode="json")
        if hw.kind == "cpu":
            return {"cpu": hw.display_name, "catalog": hw.name, "simulated": True, "spec": spec}
        return {
            "gpu": hw.display_name,
            "gpu_count": self.cfg.world_size,
            "catalog": hw.name,
            "simulated": True,
            "spec": spec,
        }
