"""The hybrid tuner without an engine: the simulator under a real backend's name (fast,
deterministic points), and the settings of a small hybrid study on an H100's simulator.
Shared by the time-plan and busy-host tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from servetune.measure import BackendSpec
from servetune.measure.backends import SimBackend
from servetune.slo import parse_slo
from servetune.tune import executors
from servetune.tune.capacity import concurrency_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import SearchSpace
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import TuneSettings
from servetune.workload.spec import parse_workload


class SimAsReal(SimBackend):
    """The simulator under a real backend's name."""

    name = "real"


def serve_real_with(monkeypatch: pytest.MonkeyPatch, fake: type[SimBackend]) -> Iterator[None]:
    """Every real backend the tuner makes is `fake` over the simulator (a fixture's body)."""
    made = executors.make_backend

    def make(spec: BackendSpec):
        return fake(replace(spec, kind="sim")) if spec.kind == "real" else made(spec)

    monkeypatch.setattr(executors, "make_backend", make)
    executors._BACKENDS.clear()
    yield
    executors._BACKENDS.clear()


def hybrid_settings(
    tmp_path: Path,
    name: str,
    space: SearchSpace,
    *,
    ttft_p95_ms: float,
    max_load: int,
    max_probes: int,
    top_k: int,
    finalists: int,
    repeats: int,
    time_budget_s: float | None = None,
) -> TuneSettings:
    """A hybrid study of llama-3.1-8b on h100-sxm, 256-token prompts and 64-token answers.
    No model file: the calibration cannot run and the simulator ranks uncalibrated."""
    workload = parse_workload(
        {
            "name": name,
            "count": 8,
            "input_tokens": {"dist": "fixed", "value": 256},
            "output_tokens": {"dist": "fixed", "value": 64},
            "arrival": {"kind": "closed", "concurrency": 1},
        }
    )
    slo = parse_slo({"ttft_ms": {"p95": ttft_p95_ms}})
    common = dict(
        engine=space.engine,
        model="llama-3.1-8b",
        hardware="h100-sxm",
        workload=workload.model_dump(mode="json"),
        slo=slo.model_dump(mode="json", exclude_none=True),
        per_user=2,
    )
    return TuneSettings(
        space=space,
        mode="hybrid",
        objective=Objective("goodput"),
        search=SearchSettings("concurrency", concurrency_lattice(max_load), max_probes=max_probes),
        sim=BackendSpec(kind="sim", **common),
        real=BackendSpec(kind="real", **common),
        strategy="grid",
        top_k=top_k,
        finalists=finalists,
        repeats=repeats,
        db=str(tmp_path / f"{name}.db"),
        time_budget_s=time_budget_s,
        edge=False,
        verbose=False,
    )
