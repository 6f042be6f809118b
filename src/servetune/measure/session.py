"""What "measure a point" means: a `Point` (the workload at one load) goes into a
`Session` (the simulator running a config, or a server) and a `RunResult` comes out.

Both kinds of session return the same schema from the same workload object, so a
sim-vs-real comparison is a diff of two results (DESIGN.md, "The one data flow").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servetune.results.schema import RunResult
from servetune.store.writer import ResultStore
from servetune.workload.materialize import Request
from servetune.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class Point:
    """One load point: the workload at that load, and its name in progress lines and
    file names. `requests`: fixed requests to send (a replay); None draws them from
    `spec` (seeded, so the same spec gives the same requests)."""

    label: str
    spec: WorkloadSpec
    requests: list[Request] | None = None
    stop_when_missed: bool = False  # a probe: stop once its SLO miss is decided


@dataclass(frozen=True)
class Sinks:
    """Where a point's data goes while it is measured. `sweep` fills them in; a bare
    measurement (a tuner probe, a fidelity run) has none."""

    store: ResultStore | None = None  # the experiment store's writer
    records: Path | None = None  # a server's raw records as JSONL, flushed as they arrive
    trace: Path | None = None  # the simulator's per-step trace CSV
    live: Callable[[dict[str, Any]], None] | None = None  # a running point's figures


NO_SINKS = Sinks()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a point. A KeyboardInterrupt (callers that do not look stop as on
    any Ctrl-C), carrying the part of the point already measured (status "interrupted")."""

    def __init__(self, result: RunResult) -> None:
        super().__init__("interrupted")
        self.result = result


class Session(Protocol):
    """Something that measures load points: the simulator running one config, or a
    server (launched by servetune or already running at a URL)."""

    launch_command: str | None

    def measure(self, point: Point, sinks: Sinks = NO_SINKS) -> RunResult: ...
