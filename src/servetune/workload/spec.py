"""WorkloadSpec: what load to offer, shared by `bench` (real server) and `simulate`.

A spec is deterministic given its seed: `materialize()` turns it into the exact
request list (prompt token counts, arrival offsets, priority, prefix group), so
two runs of the same spec send the same requests (field notes, reproducibility).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servetune.errors import InputError, from_validation_error
from servetune.yamlfile import load_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- length distributions -------------------------------------------------------------


class _Bounded(_Strict):
    min: int = Field(1, ge=0, description="Samples are clipped to at least this many tokens.")
    max: int | None = Field(None, ge=1, description="Samples are clipped to at most this.")

    @model_validator(mode="after")
    def _check_bounds(self) -> _Bounded:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class Fixed(_Bounded):
    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=0)


class Uniform(_Bounded):
    """Integers drawn uniformly from [low, high] inclusive."""

    dist: Literal["uniform"] = "uniform"
    low: int = Field(ge=0)
    high: int = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class Normal(_Bounded):
    dist: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)


class LogNormal(_Bounded):
    """Parameterised by the distribution's own mean (tokens) and the log-space sigma.

    mu = ln(mean) - sigma^2 / 2, since E[X] = exp(mu + sigma^2/2) for a lognormal
    (standard identity), so `mean` is the mean the user sees in the data.
    """

    dist: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    sigma: float = Field(ge=0)


class Empirical(_Bounded):
    """Either discrete `values` (+ optional `weights`) or a histogram (`bin_edges` + `counts`,
    uniform inside each bin), e.g. lengths measured from production logs."""

    dist: Literal["empirical"] = "empirical"
    values: list[int] | None = None
    weights: list[float] | None = None
    bin_edges: list[int] | None = None
    counts: list[float] | None = None

    @model_validator(mode="after")
    def _shape(self) -> Empirical:
        if self.values is not None:
            if not self.values:
                raise ValueError("values must not be empty")
            if self.weights is not None and len(self.weights) != len(self.values):
                raise ValueError("weights must have one entry per value")
            if self.weights is not None and (min(self.weights) < 0 or sum(self.weights) <= 0):
                raise ValueError("weights must be >= 0 with a positive sum")
        elif self.bin_edges is not None and self.counts is not None:
            if len(self.bin_edges) != len(self.counts) + 1:
                raise ValueError("bin_edges must have one more entry than counts")
            if any(b >= a for a, b in zip(self.bin_edges[1:], self.bin_edges[:-1], strict=True)):
                raise ValueError("bin_edges must increase")
            if min(self.counts) < 0 or sum(self.counts) <= 0:
                raise ValueError("counts must be >= 0 with a positive sum")
        else:
            raise ValueError("give either values (+weights) or bin_edges + counts")
        return self


LengthDist = Annotated[
    Fixed | Uniform | Normal | LogNormal | Empirical, Field(discriminator="dist")
]


# --- sources ---------------------------------------------------------------------------


class Dataset(_Strict):
    """Prompts from a file. `jsonl`: one object per line with `prompt` (text) or `messages`
    (chat), optional `output_tokens`. `sharegpt`: the ShareGPT JSON list; the first human
    turn is the prompt and the first reply's token count the output length (the common
    practice of vLLM's and SGLang's benchmarks)."""

    path: Path
    format: Literal["jsonl", "sharegpt"] = "jsonl"
    shuffle: bool = True


class Trace(_Strict):
    """Trace replay: JSONL lines with `timestamp` (ms), `input_length`, `output_length` and
    optional `hash_ids` (Mooncake trace format: each hash id names one block of
    `block_tokens` prompt tokens, so equal ids are shared prefixes)."""

    path: Path
    block_tokens: int = Field(512, ge=1, description="Mooncake traces use 512-token blocks.")
    time_scale: float = Field(1.0, gt=0, description="2.0 replays twice as fast.")


class PrefixGroups(_Strict):
    """Shared prefixes (system prompts reused across requests; seed 003 §4 prefix cache).
    Each request picks one of `groups` prefixes of `tokens` tokens, then its own suffix.
    The suffix length is the request's input length minus the prefix."""

    groups: int = Field(1, ge=1)
    tokens: int = Field(ge=1)


class SubWorkload(_Strict):
    """One class of traffic. Weighted mixes model long/short blends (seed 003 §14 stage 6)."""

    name: str = "default"
    weight: float = Field(1.0, gt=0)
    input_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    dataset: Dataset | None = None
    prefix: PrefixGroups | None = None
    priority: int | None = Field(None, description="Sent as `priority` (vLLM priority policy).")

    @model_validator(mode="after")
    def _source(self) -> SubWorkload:
        if self.dataset is None and self.input_tokens is None:
            raise ValueError("give input_tokens (synthetic) or dataset")
        if self.dataset is None and self.output_tokens is None:
            raise ValueError("synthetic workloads need output_tokens")
        return self


# --- arrivals --------------------------------------------------------------------------


class Arrival(_Strict):
    """How requests arrive. `closed`: `concurrency` users, each sends the next request when
    its previous one ends. `constant`/`poisson`/`gamma`: open loop at `rate` req/s, the
    schedule precomputed and every send anchored to it; `concurrency` then caps in-flight
    requests (waiting time is reported as client queue time, never hidden). `gamma` uses
    shape = `burstiness` (1.0 is Poisson, <1 burstier), as vLLM's bench does.
    `trace` takes the timestamps of the workload's trace."""

    kind: Literal["closed", "constant", "poisson", "gamma", "trace"] = "poisson"
    rate: float | None = Field(None, gt=0, description="Offered requests per second.")
    concurrency: int | None = Field(None, ge=1)
    burstiness: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _needs(self) -> Arrival:
        if self.kind == "closed" and self.concurrency is None:
            raise ValueError("closed-loop arrival needs concurrency (number of users)")
        return self

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"


class Sampling(_Strict):
    """Generation parameters sent with every request. `ignore_eos` and `min_tokens` (vLLM,
    llama.cpp accept them) make the output length the one asked for."""

    temperature: float = 0.0
    ignore_eos: bool = True
    min_tokens_equal_max: bool = True
    extra_body: dict[str, Any] = Field(default_factory=dict)


class WorkloadSpec(_Strict):
    name: str = "workload"
    seed: int = 0
    api: Literal["chat", "completions"] = "chat"
    model: str | None = Field(None, description="Model name sent to the server.")
    stream: bool = True
    count: int | None = Field(None, ge=1, description="Requests to send (incl. warm-up).")
    duration_s: float | None = Field(None, gt=0)
    warmup_s: float = Field(0.0, ge=0, description="Excluded from the measurement window.")
    cooldown_s: float = Field(0.0, ge=0, description="Excluded from the window's end.")
    arrival: Arrival = Field(default_factory=Arrival)
    trace: Trace | None = None
    mix: list[SubWorkload] = Field(default_factory=list)
    sampling: Sampling = Field(default_factory=Sampling)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """Top-level input_tokens/output_tokens/dataset/prefix/priority = one sub-workload."""
        if not isinstance(data, dict):
            return data
        keys = ("input_tokens", "output_tokens", "dataset", "prefix", "priority")
        if any(k in data for k in keys):
            if data.get("mix"):
                raise ValueError("give either `mix` or top-level input_tokens/dataset, not both")
            data = dict(data)
            data["mix"] = [{k: data.pop(k) for k in keys if k in data}]
        return data

    @model_validator(mode="after")
    def _whole(self) -> WorkloadSpec:
        if self.trace is None and not self.mix:
            raise ValueError("give input_tokens/output_tokens, a dataset, a mix or a trace")
        if self.arrival.kind == "trace" and self.trace is None:
            raise ValueError("arrival.kind trace needs a `trace` file")
        if self.arrival.kind in ("constant", "poisson", "gamma") and self.arrival.rate is None:
            raise ValueError(f"arrival.kind {self.arrival.kind} needs a rate (req/s)")
        if self.count is None and self.duration_s is None and self.trace is None:
            raise ValueError("give count or duration_s")
        return self

    def with_load(
        self,
        *,
        rate: float | None = None,
        concurrency: int | None = None,
        count: int | None = None,
        duration_s: float | None = None,
    ) -> WorkloadSpec:
        """One point of a sweep: the same requests under another load (CLI --rate/--concurrency)."""
        arrival = self.arrival.model_dump()
        if rate is not None:
            arrival["rate"] = rate
            if arrival["kind"] in ("closed", "trace"):
                arrival["kind"] = "poisson"
        elif concurrency is not None:
            if arrival["kind"] == "trace" or math.isinf(concurrency):
                raise ValueError("concurrency sweeps need a non-trace workload")
            arrival["kind"] = "closed"
            arrival["rate"] = None  # a closed loop offers no rate: the users set the pace
        if concurrency is not None:
            arrival["concurrency"] = concurrency
        data = self.model_dump()
        data["arrival"] = arrival
        if count is not None:
            data["count"] = count
        if duration_s is not None:
            data["duration_s"] = duration_s
        return WorkloadSpec.model_validate(data)


def load_workload(path: str | Path, swept: bool = False) -> WorkloadSpec:
    """Read a YAML/JSON workload file; problems become one InputError naming the field.

    `swept`: the command line sets the load (--rate/--concurrency), so the file need not."""
    data = load_yaml(path, "--workload")
    return parse_workload(data, base_dir=Path(path).parent, swept=swept)


def parse_workload(data: Any, base_dir: Path | None = None, swept: bool = False) -> WorkloadSpec:
    if not isinstance(data, dict):
        raise InputError("workload", "must be a mapping of fields", "see docs/bench.md")
    if swept:  # placeholders that every sweep point's with_load() replaces
        arrival = dict(data.get("arrival") or {"kind": "closed"})
        if arrival.get("kind", "poisson") == "closed":
            arrival.setdefault("concurrency", 1)
        elif arrival.get("kind", "poisson") != "trace":
            arrival.setdefault("rate", 1.0)
        data = {**data, "arrival": arrival}
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, "workload") from None
    return _resolve_paths(spec, base_dir) if base_dir is not None else spec


def _resolve_paths(spec: WorkloadSpec, base: Path) -> WorkloadSpec:
    """Relative dataset/trace paths are relative to the workload file."""
    data = spec.model_dump()
    if data["trace"] and not Path(data["trace"]["path"]).is_absolute():
        data["trace"]["path"] = base / data["trace"]["path"]
    for sub in data["mix"]:
        if sub["dataset"] and not Path(sub["dataset"]["path"]).is_absolute():
            sub["dataset"]["path"] = base / sub["dataset"]["path"]
    return WorkloadSpec.model_validate(data)
