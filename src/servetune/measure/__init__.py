"""The one way a load point is measured (DESIGN.md, "The one data flow").

A `Point` (the workload at one load) goes into a `Session` and a `RunResult` comes out:
`SimSession` replays it through the engine simulator, `ServerSession` sends it to a
server at a URL with bench's load generator, `EngineSession` does the same to an engine
servetune launched. `sweep` is the one loop over points (store, result files,
stop-on-failure, Ctrl-C); `run_bench` / `run_simulate` are the commands' entry points,
and the tuner's `Backend`s (`make_backend`) probe through the same sessions.
"""

from servetune.measure.backends import (
    Backend,
    BackendSpec,
    RealBackend,
    SimBackend,
    make_backend,
    planner_reason,
)
from servetune.measure.commands import (
    DEFAULT_WORKLOAD,
    BenchSettings,
    SimulateSettings,
    run_bench,
    run_simulate,
)
from servetune.measure.loads import SweepLoads, load_spec, probe_point, sweep_points
from servetune.measure.real import EngineSession, ServerSession, server_software
from servetune.measure.result import Infeasible, PointResult, signals
from servetune.measure.session import NO_SINKS, Interrupted, Point, Session, Sinks
from servetune.measure.simulated import SimSession
from servetune.measure.steady import SteadyRule, apply_steady_state
from servetune.measure.sweep import Hooks, ResultFiles, StoreSettings, sweep
from servetune.outfile import point_file

__all__ = [
    "DEFAULT_WORKLOAD",
    "NO_SINKS",
    "Backend",
    "BackendSpec",
    "BenchSettings",
    "EngineSession",
    "Hooks",
    "Infeasible",
    "Interrupted",
    "Point",
    "PointResult",
    "RealBackend",
    "ResultFiles",
    "ServerSession",
    "Session",
    "SimBackend",
    "SimSession",
    "SimulateSettings",
    "Sinks",
    "SteadyRule",
    "StoreSettings",
    "SweepLoads",
    "apply_steady_state",
    "load_spec",
    "make_backend",
    "planner_reason",
    "point_file",
    "probe_point",
    "run_bench",
    "run_simulate",
    "server_software",
    "signals",
    "sweep",
    "sweep_points",
]
