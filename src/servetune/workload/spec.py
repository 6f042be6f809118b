"""WorkloadSpec: what load to offer, shared by `bench` (real server) and `simulate`.

A spec is deterministic given its seed: `materialize()` turns it into the exact
request list (prompt token counts, arrival offsets, priority, prefix group), so
two runs of the same spec send the same requests (field notes, reproducibility).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from servetune.errors import InputError, from_validation_error, refuse_bool
from servetune.yamlfile import load_yaml

if TYPE_CHECKING:
    from servetune.workload.sessions import Sessions

# The longest prompt or output a spec may ask for: 10M tokens, the largest context window
# of an open model (Llama 4 Scout). Beyond it a length is a typo, and numpy's int64 cast of
# a larger float (1e29) silently wraps.
MAX_TOKENS = 10_000_000
# Requests one point may send: the simulator holds ~100 bytes a request in its columns, so
# 10M is ~1 GB; a real server sending more in one point is no longer a benchmark.
MAX_REQUESTS = 10_000_000
# The slowest open-loop rate: one request in ~12 days. Slower offers no load, and the
# gaps (1/rate s) overflow a float near 1e-308 req/s.
MIN_RATE = 1e-6


class StrictModel(BaseModel):
    """Every field finite (no .inf/.nan), no unknown keys, no true/false for a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool(cls, data: Any) -> Any:
        return refuse_bool(cls.model_fields, data)


# --- length distributions -------------------------------------------------------------


class _Bounded(StrictModel):
    min: int = Field(
        1, ge=0, le=MAX_TOKENS, description="Samples are clipped to at least this many tokens."
    )
    max: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Samples are clipped to at most this."
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> _Bounded:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class Fixed(_Bounded):
    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _inside(self) -> Fixed:
        # Clipping a fixed value would run another length than the one written.
        if self.value < self.min or (self.max is not None and self.value > self.max):
            top = "" if self.max is None else f" .. max {self.max}"
            raise ValueError(f"value {self.value} is outside min {self.min}{top}")
        return self


class Uniform(_Bounded):
    """Integers drawn uniformly from [low, high] inclusive."""

    dist: Literal["uniform"] = "uniform"
    low: int = Field(ge=0, le=MAX_TOKENS)
    high: int = Field(ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class Normal(_Bounded):
    dist: Literal["normal"] = "normal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    std: float = Field(ge=0, le=MAX_TOKENS)


class LogNormal(_Bounded):
    """Parameterised by the distribution's own mean (tokens) and the log-space sigma.

    mu = ln(mean) - sigma^2 / 2, since E[X] = exp(mu + sigma^2/2) for a lognormal
    (standard identity), so `mean` is the mean the user sees in the data.
    """

    dist: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    sigma: float = Field(ge=0, le=10, description="Log-space; 10 already spans e^±50.")


class Empirical(_Bounded):
    """Either discrete `values` (+ optional `weights`) or a histogram (`bin_edges` + `counts`,
    uniform inside each bin), e.g. lengths measured from production logs."""

    dist: Literal["empirical"] = "empirical"
    values: list[Annotated[int, Field(ge=0, le=MAX_TOKENS)]] | None = None
    weights: list[float] | None = None
    bin_edges: list[Annotated[int, Field(ge=0, le=MAX_TOKENS)]] | None = None
    counts: list[float] | None = None

    @model_validator(mode="after")
    def _shape(self) -> Empirical:
        if self.values is not None:
            if self.counts is not None or self.bin_edges is not None:
                # they used to be dropped unseen: values [100, 200] + counts [9, 1] drew 50/50
                raise ValueError(
                    "counts, bin_edges: not read with values (weight values with weights, "
                    "or drop values for a histogram)"
                )
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


def as_fixed(data: Any) -> Any:
    """A bare number is a `fixed` distribution of it (`input_tokens: 1024` is `{dist:
    fixed, value: 1024}`, `think_time_s: 2` two seconds): the form one writes first. A bool
    is no number here (YAML's `true`)."""
    if isinstance(data, int | float) and not isinstance(data, bool):
        return {"dist": "fixed", "value": data}
    return data


LengthDist = Annotated[
    Fixed | Uniform | Normal | LogNormal | Empirical,
    Field(discriminator="dist"),
    BeforeValidator(as_fixed),
]


def with_lengths(spec: WorkloadSpec, input_len: int | None, output_len: int | None) -> WorkloadSpec:
    """`spec` with every class of traffic at a fixed prompt and reply length (`--input-len`,
    `--output-len`: the ISL/OSL what-if AIConfigurator and `vllm bench serve --random-*-len`
    ask), its load and the rest kept. A trace or sessions workload, and a dataset's prompts,
    set their own lengths: refused, as is a length outside 1..MAX_TOKENS."""
    given = {"--input-len": input_len, "--output-len": output_len}
    for flag, n in given.items():
        if n is not None and not 1 <= n <= MAX_TOKENS:
            raise InputError(flag, f"{n} tokens", f"give 1 to {MAX_TOKENS:,}")
    if input_len is None and output_len is None:
        return spec
    flag = "--input-len" if input_len is not None else "--output-len"
    if spec.trace is not None or spec.sessions is not None:
        what = "a trace" if spec.trace is not None else "a sessions workload"
        raise InputError(flag, f"{what} sets its own lengths", "drop it, or give another workload")
    data = spec.model_dump(mode="json", exclude_unset=True)
    for sub in data["mix"]:
        if input_len is not None:
            if sub.get("dataset") is not None:
                raise InputError(
                    "--input-len", "a dataset's prompts set their own lengths", "drop it"
                )
            sub["input_tokens"] = input_len  # a bare number is fixed (`as_fixed`)
        if output_len is not None:
            sub["output_tokens"] = output_len
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:  # a prefix as long as the prompt: the flag's doing
        err = from_validation_error(exc, "workload", data=data)
        raise InputError(flag, err.problem, err.fix) from None


def longest(d: LengthDist) -> int | None:
    """The most tokens `d` can draw, where its fields bound it (None: unbounded)."""
    tops = [d.max] if d.max is not None else []
    if isinstance(d, Fixed):
        tops.append(d.value)
    elif isinstance(d, Uniform):
        tops.append(d.high)
    elif isinstance(d, Empirical):
        tops.append(max(d.values) if d.values is not None else max(d.bin_edges or [0]))
    return min(tops) if tops else None


# --- sources ---------------------------------------------------------------------------


class Dataset(StrictModel):
    """Prompts from a file. `jsonl`: one object per line with `prompt` (text) or `messages`
    (chat), optional `output_tokens`. `sharegpt`: the ShareGPT JSON list; the first human
    turn is the prompt and the first reply's token count the output length (the common
    practice of vLLM's and SGLang's benchmarks)."""

    path: Path
    format: Literal["jsonl", "sharegpt"] = "jsonl"
    shuffle: bool = True


class Trace(StrictModel):
    """Trace replay: JSONL lines with `timestamp` (ms), `input_length`, `output_length` and
    optional `hash_ids` (Mooncake trace format: each hash id names one block of
    `block_tokens` prompt tokens, so equal ids are shared prefixes)."""

    path: Path
    block_tokens: int = Field(
        512, ge=1, le=MAX_TOKENS, description="Mooncake traces use 512-token blocks."
    )
    time_scale: float = Field(1.0, ge=1e-6, le=1e6, description="2.0 replays twice as fast.")


class PrefixGroups(StrictModel):
    """Shared prefixes (system prompts reused across requests; seed 003 §4 prefix cache).
    Each request picks one of `groups` prefixes of `tokens` tokens, then its own suffix.
    The suffix length is the request's input length minus the prefix."""

    groups: int = Field(1, ge=1, le=MAX_REQUESTS)
    tokens: int = Field(ge=1, le=MAX_TOKENS)


# a workload's top-level keys that stand for its one sub-workload (`WorkloadSpec._shorthand`)
SHORTHAND_KEYS = ("input_tokens", "output_tokens", "dataset", "prefix", "priority")


class SubWorkload(StrictModel):
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
        if self.dataset is not None and self.input_tokens is not None:
            raise ValueError("input_tokens: a dataset's prompts set their own lengths")
        if self.dataset is not None and self.prefix is not None:
            raise ValueError("prefix: a dataset's prompts are sent as they are, unprefixed")
        top = longest(self.input_tokens) if self.input_tokens is not None else None
        if self.prefix is not None and top is not None and self.prefix.tokens >= top:
            # a prompt holds the prefix and a token of its own: it was sent longer unseen
            raise ValueError(
                f"prefix.tokens ({self.prefix.tokens}) leaves no room in input_tokens (at "
                f"most {top}): a prompt is its prefix plus its own tokens (lower prefix.tokens)"
            )
        if self.dataset is None and self.input_tokens is None:
            raise ValueError("give input_tokens (synthetic) or dataset")
        if self.dataset is None and self.output_tokens is None:
            raise ValueError("synthetic workloads need output_tokens")
        if self.output_tokens is not None and self.output_tokens.min < 1:
            raise ValueError("output_tokens.min must be >= 1: every request generates a token")
        return self


# --- arrivals --------------------------------------------------------------------------


class Arrival(StrictModel):
    """How requests arrive. `closed`: `concurrency` users, each sends the next request when
    its previous one ends. `constant`/`poisson`/`gamma`: open loop at `rate` req/s, the
    schedule precomputed and every send anchored to it; `concurrency` then caps in-flight
    requests (waiting time is reported as client queue time, never hidden). `gamma` uses
    shape = `burstiness` (1.0 is Poisson, <1 burstier), as vLLM's bench does.
    `trace` takes the timestamps of the workload's trace."""

    kind: Literal["closed", "constant", "poisson", "gamma", "trace"] = "poisson"
    rate: float | None = Field(
        None, ge=MIN_RATE, le=1e9, description="Offered requests per second."
    )
    concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    burstiness: float = Field(1.0, ge=1e-3, le=1e3, description="Gamma shape: CV^2 = 1/b.")

    @model_validator(mode="after")
    def _needs(self) -> Arrival:
        """What the kind needs, and no field it would ignore: a closed loop's or a trace's
        rate, a burstiness other than gamma's (each used to run as if not given)."""
        if self.kind == "closed" and self.concurrency is None:
            raise ValueError("closed-loop arrival needs concurrency (number of users)")
        if self.kind in ("closed", "trace") and self.rate is not None:
            why = "its users set the pace" if self.kind == "closed" else "it replays its times"
            raise ValueError(f"rate: arrival.kind {self.kind} has no rate ({why})")
        if self.kind != "gamma" and self.burstiness != 1.0:
            raise ValueError(f"burstiness: only arrival.kind gamma reads it, not {self.kind}")
        return self

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"


class Sampling(StrictModel):
    """Generation parameters sent with every request. `ignore_eos` and `min_tokens` (vLLM,
    llama.cpp accept them) make the output length the one asked for."""

    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0: greedy.")
    ignore_eos: bool = True
    min_tokens_equal_max: bool = True
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_override(self) -> Sampling:
        """`extra_body` adds fields; one servetune sets itself (`bench.client.build_body`)
        would replace it unseen: `max_tokens: 50` sent 50-token answers recorded as 5,
        `stream: false` read as streamed. Those come from the workload's own fields."""
        if taken := sorted(set(self.extra_body) & BODY_FIELDS):
            raise ValueError(
                f"extra_body: {', '.join(taken)} set by servetune itself (use output_tokens, "
                "stream, temperature, api, model or the sampling fields)"
            )
        return self


# Request fields servetune sets from the workload (`bench.client.build_body`).
BODY_FIELDS = frozenset(
    {"model", "messages", "prompt", "max_tokens", "ignore_eos", "min_tokens", "temperature",
     "stream", "stream_options", "priority",
     # vLLM's chat API reads it before max_tokens (the OpenAI name for the same cap)
     "max_completion_tokens"}
)  # fmt: skip


# Why a trace cannot be swept by users (with_load's ValueError, said to the user as such)
TRACE_USERS = "a trace replays its own send times, so it cannot be run at a number of users"


class WorkloadSpec(StrictModel):
    name: str = "workload"
    seed: int = Field(0, ge=0, description="numpy seeds are non-negative.")
    api: Literal["chat", "completions"] = "chat"
    model: str | None = Field(None, description="Model name sent to the server.")
    stream: bool = True
    count: int | None = Field(
        None, ge=1, le=MAX_REQUESTS, description="Requests to send (incl. warm-up)."
    )
    duration_s: float | None = Field(None, gt=0, le=1e7, description="At most ~4 months.")
    warmup_s: float = Field(0.0, ge=0, le=1e7, description="Excluded from the measurement window.")
    cooldown_s: float = Field(0.0, ge=0, le=1e7, description="Excluded from the window's end.")
    arrival: Arrival = Field(default_factory=Arrival)
    trace: Trace | None = None
    mix: list[SubWorkload] = Field(default_factory=list)
    sampling: Sampling = Field(default_factory=Sampling)
    sessions: Sessions | None = Field(None, description="Conversations or agent loops.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """Top-level input_tokens/output_tokens/dataset/prefix/priority = one sub-workload."""
        if not isinstance(data, dict):
            return data
        keys = SHORTHAND_KEYS
        if any(k in data for k in keys):
            if data.get("mix"):
                raise ValueError("give either `mix` or top-level input_tokens/dataset, not both")
            data = dict(data)
            data["mix"] = [{k: data.pop(k) for k in keys if k in data}]
        return data

    @model_validator(mode="after")
    def _whole(self) -> WorkloadSpec:
        if self.sessions is not None and (self.trace is not None or self.mix):
            raise ValueError("give sessions or requests (input_tokens, dataset, trace), not both")
        if self.trace is None and not self.mix and self.sessions is None:
            raise ValueError("give input_tokens/output_tokens, a dataset, a mix or a trace")
        if self.arrival.kind == "trace" and self.trace is None:
            raise ValueError("arrival.kind trace needs a `trace` file")
        if self.trace is not None and self.mix:
            raise ValueError("give a trace or input_tokens/dataset/mix, not both")
        if self.arrival.kind == "trace" and self.duration_s is not None:
            raise ValueError("duration_s: a trace replays its own span (count cuts it short)")
        if self.arrival.kind in ("constant", "poisson", "gamma") and self.arrival.rate is None:
            raise ValueError(f"arrival.kind {self.arrival.kind} needs a rate (req/s)")
        if self.count is None and self.duration_s is None and self.trace is None:
            raise ValueError("give count or duration_s")
        if self.count is not None and self.duration_s is not None:
            raise ValueError("give count or duration_s, not both (the count ends the run first)")
        names = [m.name for m in self.mix]
        if dup := next((n for i, n in enumerate(names) if n in names[:i]), None):
            # results are kept per class by name: two of one name were merged, and the
            # simulator read one's prefix for both
            raise ValueError(f"mix: two entries named {dup!r} (give each its own name)")
        rate, span = self.arrival.rate, self.duration_s
        open_loop = self.count is None and self.arrival.open_loop
        if open_loop and span and rate and rate * span > MAX_REQUESTS:
            raise ValueError(
                f"rate x duration_s = {rate * span:.3g} requests, over {MAX_REQUESTS:,}: "
                "give count or a shorter duration"
            )
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
                if arrival["kind"] == "closed":  # its users are not an open loop's in-flight cap
                    arrival["concurrency"] = None
                arrival["kind"] = "poisson"
        elif concurrency is not None:
            if arrival["kind"] == "trace" or math.isinf(concurrency):
                raise ValueError(TRACE_USERS)
            arrival["kind"] = "closed"
            arrival["rate"] = None  # a closed loop offers no rate: the users set the pace
            arrival["burstiness"] = 1.0  # nor a burstiness
        if concurrency is not None:
            arrival["concurrency"] = concurrency
        data = self.model_dump()
        data["arrival"] = arrival
        if count is not None:
            data["count"] = count
            data["duration_s"] = None  # the count ends the run (materialize: count first)
        if duration_s is not None:
            data["duration_s"] = duration_s
            if count is None:  # --duration alone sizes the run: the file's count would end it
                data["count"] = None  # first (count wins in materialize), as if not given
        return WorkloadSpec.model_validate(data)


def load_workload(path: str | Path, swept: bool = False, sized: bool = False) -> WorkloadSpec:
    """Read a YAML/JSON workload file; problems become one InputError naming the field.

    `swept`: the command line sets the load (--rate/--concurrency), so the file need not;
    `sized`: it sets the count or duration (--count/--duration), likewise."""
    data = load_yaml(path, "--workload")
    return parse_workload(data, base_dir=Path(path).parent, swept=swept, sized=sized)


def parse_workload(
    data: Any, base_dir: Path | None = None, swept: bool = False, sized: bool = False
) -> WorkloadSpec:
    if not isinstance(data, dict):
        raise InputError("workload", "must be a mapping of fields", "see docs/bench.md")
    given = data  # as written: the placeholders below are no key of the user's
    if sized and data.get("count") is None and data.get("duration_s") is None:
        data = {**data, "count": 1}  # a placeholder every point's with_load() replaces
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
        from servetune.filekinds import check_kind

        check_kind(given, "workload", "workload")
        raise from_validation_error(exc, "workload", data=data, model=WorkloadSpec) from None
    if base_dir is None:
        return spec
    # A workload file: its dataset and trace are read (every line checked) now, before a
    # run starts. A dict's (a preset's, a stored run's) are checked when a run reads them.
    from servetune.workload.sources import check_files, check_replay_span  # imports this

    spec = _resolve_paths(spec, base_dir)
    check_files(spec)
    if not swept:  # a swept load may replace the trace's own arrival: checked at the run
        check_replay_span(spec)
    return spec


def _resolve_paths(spec: WorkloadSpec, base: Path) -> WorkloadSpec:
    """Relative dataset/trace paths are relative to the workload file."""
    data = spec.model_dump()
    if data["trace"] and not Path(data["trace"]["path"]).is_absolute():
        data["trace"]["path"] = base / data["trace"]["path"]
    for sub in data["mix"]:
        if sub["dataset"] and not Path(sub["dataset"]["path"]).is_absolute():
            sub["dataset"]["path"] = base / sub["dataset"]["path"]
    ds = (data["sessions"] or {}).get("dataset")
    if ds and str(ds["path"]) != "builtin" and not Path(ds["path"]).is_absolute():
        ds["path"] = base / ds["path"]
    return WorkloadSpec.model_validate(data)


# The session models use the length distributions above; importing them here defines
# `Sessions` and completes WorkloadSpec (servetune.workload.sessions rebuilds it).
import servetune.workload.sessions  # noqa: E402, F401
