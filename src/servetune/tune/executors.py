"""Where trials run: one after another here (default: one engine at a time on this
machine), or as Ray tasks across a cluster (`--executor ray [--address ...]`), each task
reserving the GPUs its config needs and writing its points into the same store.

A task gets only picklable inputs (`TrialTask`); the backend and the store handle are
built once per worker process and reused by the tasks that land there.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure.backends import BackendSpec, make_backend
from servetune.tune.objective import Objective, gpus_of
from servetune.tune.study import Recorder
from servetune.tune.trial import SearchSettings, TrialResult, run_trial

EXECUTORS: tuple[str, ...] = ("local", "ray")


@dataclass(frozen=True)
class TrialTask:
    backend: BackendSpec
    db: str
    study: str
    objective: Objective
    search: SearchSettings
    config: dict[str, Any]
    label: str
    start_index: int = 0
    verbose: bool = True
    deadline_unix_s: float | None = None
    cold_index: int | None = None  # where a failing warm start restarts


_BACKENDS: dict[str, Any] = {}
_RECORDERS: dict[tuple[str, str, str], Any] = {}


def backend_for(spec: BackendSpec) -> Any:
    """One backend per spec and process (its simulator cache and prompts are reused)."""
    k = json.dumps(asdict(spec), sort_keys=True, default=str)
    if k not in _BACKENDS:
        _BACKENDS[k] = make_backend(spec)
    return _BACKENDS[k]


def recorder_for(db: str, study: str, kind: str) -> Any:
    k = (db, study, kind)
    if k not in _RECORDERS:  # read the study once per process; our own writes keep it current
        _RECORDERS[k] = Recorder(db, study, kind)
        _RECORDERS[k].refresh()
    return _RECORDERS[k]


def execute(task: TrialTask) -> TrialResult:
    """Run one trial (in this process or a Ray worker)."""
    backend = backend_for(task.backend)
    recorder = recorder_for(task.db, task.study, backend.name)
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if task.verbose else None
    return run_trial(
        backend,
        EngineConfig.model_validate(task.config),
        objective=task.objective,
        search=task.search,
        recorder=recorder,
        label=task.label,
        start_index=task.start_index,
        say=say,
        deadline_unix_s=task.deadline_unix_s,
        cold_index=task.cold_index,
    )


class LocalExecutor:
    name = "local"
    parallel = 1

    def map(self, tasks: list[TrialTask]) -> Iterator[TrialResult]:
        for t in tasks:
            yield execute(t)

    def close(self) -> None:
        pass


class RayExecutor:
    """Trials as Ray tasks. `address=None` starts a local Ray with `num_cpus` CPUs;
    "auto" or "ray://host:port" joins a running cluster."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise InputError(
                "--executor", "ray is not installed", "pip install 'servetune[ray]'"
            ) from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": True, "include_dashboard": False}
            if address:
                kwargs["address"] = address
            else:  # a private single-node Ray, on loopback only
                cpus = 2 if num_cpus is None else num_cpus
                kwargs.update(num_cpus=cpus, _node_ip_address="127.0.0.1")
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise InputError("--address", f"cannot reach Ray at {address}: {exc}") from None
            self.started = True
        self.parallel = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(execute)

    def map(self, tasks: list[TrialTask]) -> Iterator[TrialResult]:
        refs = []
        for t in tasks:
            cfg = EngineConfig.model_validate(t.config)
            gpus = gpus_of(cfg) if t.backend.kind == "real" and t.backend.device == "gpu" else 0
            refs.append(self._remote.options(num_cpus=1, num_gpus=gpus).remote(t))
        order = {r: i for i, r in enumerate(refs)}
        results: list[TrialResult | None] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for r in done:
                results[order[r]] = self.ray.get(r)
        yield from (r for r in results if r is not None)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def check_executor(name: str, address: str | None, num_cpus: int | None) -> None:
    """Refuse executor flags that would be ignored or mean nothing, before anything runs:
    --address and --ray-cpus without Ray, --ray-cpus with a cluster (it has its own
    CPUs), and fewer than 1 CPU (0 silently became 2)."""
    if name not in EXECUTORS:
        raise InputError("--executor", f"unknown executor {name!r}", "local or ray")
    if name == "local":
        if address:
            raise InputError("--address", "only with --executor ray")
        if num_cpus is not None:
            raise InputError("--ray-cpus", "only with --executor ray")
    if num_cpus is not None and num_cpus < 1:
        raise InputError("--ray-cpus", f"{num_cpus} runs no trial", "give at least 1 CPU")
    if num_cpus is not None and address:
        raise InputError("--ray-cpus", "sizes a local Ray only", "drop it with --address")


def make_executor(name: str, address: str | None = None, num_cpus: int | None = None) -> Any:
    check_executor(name, address, num_cpus)
    if name == "ray":
        return RayExecutor(address, num_cpus)
    return LocalExecutor()
