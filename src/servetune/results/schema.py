"""RunResult: raw per-request records plus the metrics computed from them.

All times are integer nanoseconds on the monotonic clock, relative to the run's anchor
(`RunResult.anchor_ns`), so records from several worker processes share one time axis.
`bench` and `simulate` both write this schema; a sim-vs-real comparison is a diff.
What was measured and at what load are typed parts (`Target`, `Load`, tune's `TuneTag`)
that read and write the same JSON objects as the plain dicts of earlier versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
)

from servetune.slo import SLO
from servetune.status import RequestStatus, RunStatus
from servetune.workload.materialize import Request
from servetune.workload.spec import Arrival

SCHEMA_VERSION = 1

# Status fields are Literals of the enum's members rather than the enum: input strings
# still validate to members, and records built without validation on the hot path (plain
# strings) serialise without a type warning.
RecordStatus = Literal[
    RequestStatus.OK, RequestStatus.ERROR, RequestStatus.CANCELLED, RequestStatus.ABORTED
]
# What a finished RunResult can say; `running`/`incomplete` exist only in the store.
ResultStatus = Literal[
    RunStatus.COMPLETED,
    RunStatus.INTERRUPTED,
    RunStatus.CIRCUIT_BREAKER,
    RunStatus.SLO_MISSED,
    RunStatus.FAILED,
]

# Error classes (docs/bench.md). Timeouts follow seed 003 §10's split.
ERROR_CLASSES = (
    "connect_error",  # refused, DNS, TLS
    "connect_timeout",
    "ttft_timeout",  # no content before the TTFT deadline (includes slow headers)
    "idle_timeout",  # stream stalled between chunks
    "total_timeout",
    "http_429",
    "http_4xx",
    "http_5xx",
    "server_error_event",  # an `error` object inside a 200 stream
    "malformed_response",  # bad SSE/JSON/HTTP framing
    "truncated_stream",  # the stream ended before [DONE]/finish_reason
    "connection_reset",  # RST or EOF before any response
    "client_error",  # a bug or resource limit on our side (e.g. too many open files)
)


class RequestRecord(BaseModel):
    """What one request did, as measured. Built without validation on the hot path."""

    model_config = ConfigDict(extra="ignore")

    index: int
    sub: str = "default"
    priority: int | None = None
    prefix_group: int | None = None
    worker: int = 0
    scheduled_ns: int | None = Field(None, description="Open loop: when the schedule said send.")
    queue_ns: int = Field(0, description="Time spent waiting on the client concurrency cap.")
    send_ns: int = Field(description="Request started (connect, if any, then write).")
    connect_ns: int = Field(0, description="Part of TTFT spent opening a new connection.")
    first_event_ns: int | None = Field(None, description="First SSE event, role-only included.")
    chunk_ns: list[int] = Field(default_factory=list, description="Content chunk arrivals.")
    chunk_tokens: list[int] = Field(default_factory=list, description="Tokens per content chunk.")
    first_answer_ns: int | None = Field(None, description="First non-reasoning content.")
    end_ns: int
    status: RecordStatus = RequestStatus.OK
    error: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = Field(None, description="Expected, from materialisation.")
    max_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    tokenizer_completion_tokens: int | None = None
    server_timings: dict[str, float] | None = None
    output_text: str | None = None
    resent: bool = Field(
        False,
        description="Sent again once on a new connection: the server closed its reused "
        "keep-alive connection without a byte of answer (times count from the first send).",
    )

    @property
    def output_tokens(self) -> int:
        """Server usage when given, else the client tokenizer, else the per-chunk counts."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        if self.tokenizer_completion_tokens is not None:
            return self.tokenizer_completion_tokens
        return sum(self.chunk_tokens)

    @property
    def input_tokens(self) -> int:
        if self.usage_prompt_tokens is not None:
            return self.usage_prompt_tokens
        return self.prompt_tokens or 0


class Dist(BaseModel):
    """Summary of a sample; percentiles use numpy's default linear interpolation
    (Hyndman & Fan type 7), as vLLM's and SGLang's benchmarks do."""

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class SLOCheck(BaseModel):
    metric: str
    stat: str
    target: float
    value: float | None
    ok: bool
    note: str | None = None  # why a check could not be measured


class Metrics(BaseModel):
    """Every figure here is computed from the raw records (docs/metrics.md)."""

    window_start_ns: int = 0
    window_end_ns: int = 0
    window_s: float = 0.0
    window_whole_run: bool = Field(
        False,
        description="The window was too short (a handful of requests): the whole "
        "run, first send to last end, was measured instead.",
    )
    window_trim_s: float = Field(
        0.0, description="The warm-up + cool-down asked, cut from the window's ends."
    )
    completion_shift_s: float = Field(
        0.0,
        description="Completions and arriving tokens are counted in the window moved "
        "this much later (the median latency): no ramp-up deficit in the rates.",
    )
    measured: int = Field(0, description="Requests sent inside the window (the denominator).")
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    aborted: int = 0
    error_rate: float = 0.0
    errors_by_class: dict[str, int] = Field(default_factory=dict)
    ttft_ms: Dist = Field(default_factory=Dist)
    first_event_ms: Dist = Field(default_factory=Dist)
    tpot_ms: Dist = Field(default_factory=Dist)
    itl_ms: Dist = Field(default_factory=Dist)
    itl_per_token_ms: Dist = Field(default_factory=Dist)
    e2e_ms: Dist = Field(default_factory=Dist)
    send_lag_ms: Dist = Field(default_factory=Dist)
    queue_ms: Dist = Field(default_factory=Dist)
    input_tokens: int = 0
    output_tokens: int = 0
    output_tok_s: float = 0.0
    total_tok_s: float = 0.0
    req_s: float = 0.0
    offered_req_s: float | None = None
    # What offered_req_s counts: requests, or sessions (a sessions workload's schedule
    # starts sessions; a follow-up turn is sent when its answer and think time are over).
    offered_unit: Literal["req/s", "sessions/s"] = "req/s"
    offered_arrivals: int | None = None  # the scheduled arrivals offered_req_s counts
    sent_req_s: float = 0.0
    goodput_req_s: float | None = None
    slo_attainment: float | None = None
    slo_pass: bool | None = None
    slo_checks: list[SLOCheck] = Field(default_factory=list)
    token_count_compared: int = 0
    token_count_mismatched: int = 0
    token_count_max_abs_diff: int = 0
    max_in_flight: int = 0
    stream_buffered: bool = Field(
        False,
        description="The server held the stream to the end (metrics/buffering.py): "
        "TTFT, TPOT and ITL are not measurable and left empty.",
    )
    stream_buffered_requests: int = 0
    tpot_at_once_requests: int = Field(
        0,
        description="Streamed answers of 2+ tokens with no TPOT: every token arrived at "
        "once (one chunk, or chunks faster than any decode: metrics.compute.has_tpot), as "
        "when a busy host held the client or the API server.",
    )


class ClientInfo(BaseModel):
    workers: int = 1
    cpu_s: float = 0.0
    cpu_util: float = 0.0
    event_loop: str = "asyncio"
    # how late the client's own event loop ran (P99 of its workers' worst): a latency the
    # client measured may be this much its own, not the server's
    loop_lag_p99_ms: float = 0.0
    bottleneck: bool = False
    warnings: list[str] = Field(default_factory=list)


class ServerSeries(BaseModel):
    """The engine's /metrics, scraped about once a second, under canonical names."""

    interval_s: float = 1.0
    t_ns: list[int] = Field(default_factory=list)
    values: list[dict[str, float]] = Field(default_factory=list)
    deltas: dict[str, float] = Field(default_factory=dict)
    errors: int = 0

    def series(self, name: str) -> list[float]:
        """One canonical metric's samples, in scrape order (absent samples skipped)."""
        return [v[name] for v in self.values if name in v]

    def peak(self, name: str) -> float | None:
        vals = self.series(name)
        return max(vals) if vals else None


class TelemetrySeries(ServerSeries):
    """Host, engine-process and GPU samples taken on the client's clock while the run went
    (servetune.telemetry; names in docs/telemetry.md). `notes` say which sources were
    skipped and why; `sampler_cpu_s` is what the sampling itself cost."""

    sources: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    sampler_cpu_s: float = 0.0


class StoredPart(BaseModel):
    """A typed part of a stored run. Unknown keys are kept (an older or newer servetune
    may write more), and only the keys that were given are written back, so a part reads
    and writes the same JSON object as the plain dict it replaces. Like that dict, a part
    with nothing given is falsy."""

    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in out.items() if k in given}

    def __bool__(self) -> bool:
        return bool(self.model_fields_set or self.model_extra)


class PoolDoubt(StoredPart):
    """A point that ran a GPU's KV pool to its edge, simulated again with a pool
    `share` smaller (plan.memory.POOL_DOUBT): how far its figures rest on a pool servetune
    knows only to within that share of vLLM's own."""

    share: float
    kv_capacity_tokens: int
    preemptions: int
    rejected: int = 0  # requests the smaller pool cannot hold at all
    ttft_mean_ms: float | None = None
    ttft_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    output_tok_s: float | None = None
    slo_pass: bool | None = None  # the run's SLO on the smaller pool (None: no SLO)


class SimStats(StoredPart):
    """What the simulator did to produce a run (sim.engine.simulate)."""

    steps: int = 0
    jumps: int = 0  # idle gaps skipped to the next arrival
    preemptions: int = 0
    rejected: int = 0  # requests that can never fit (prompt beyond the pool or max length)
    prefix_hit_tokens: int = 0
    prefill_tokens_computed: int = 0
    kv_evictions: int = 0
    max_kv_blocks_used: int = 0
    wall_s: float = 0.0
    phases_s: dict[str, float] = Field(default_factory=dict)
    # the tier's track record at this run's load (sim.expected_error): what its figures
    # may be off by, so a stored or piped prediction carries it too
    expected_error: str | None = None
    # a GPU point at its KV pool's edge, again with a smaller pool (sim.pool_doubt)
    pool_doubt: PoolDoubt | None = None
    # the servetune build that simulated it (servetune.build.build_id): a later build that
    # no longer reproduces the run can say that the simulator changed since
    build: str | None = None


class TuneFailure(StoredPart):
    """Why a tuned config could not be measured, in the engine's own words."""

    kind: str  # oom, crash, timeout, bad_flag, ...
    reason: str
    log_tail: list[str] = Field(default_factory=list)


class TuneTag(StoredPart):
    """What `tune` attaches to each run it stores (the study itself is the run's study).
    `key` is the config id (tune.space.config_key); `pid` the point id, the key that
    makes a resumed study find the run again."""

    pid: str
    key: str
    phase: str  # the run's role: probe | rep | sweet (sweet-spot sweep) | trial | launch
    load_kind: str | None = None  # concurrency | rate
    load: float | None = None
    rep: int | None = None
    failure: TuneFailure | None = None
    trial: dict[str, Any] | None = None  # tune.trial.TrialResult.to_json(): sim trials


class Target(StoredPart):
    """What was measured: the server (bench), the simulated engine (simulate), the
    launched engine (tune), and the tuner's tag. Every field is optional: each producer
    fills what it knows."""

    url: str | None = None
    api: str | None = None
    model: str | None = None
    engine: str | None = None
    hardware: str | None = None
    config: dict[str, Any] | None = Field(None, description="EngineConfig, non-default knobs.")
    settings: dict[str, Any] | None = Field(None, description="What the engine ran (reported).")
    tier: str | None = Field(None, description="Simulator step-time tier.")
    profile: str | None = Field(None, description="Simulator profile key.")
    efficiency: dict[str, float] | None = None
    kv_blocks: int | None = None
    kv_capacity_tokens: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    sim: SimStats = Field(default_factory=SimStats)  # empty (falsy) but for simulated runs
    tune: TuneTag | None = None


class Load(StoredPart):
    """The load a run was measured at: the arrival process, rate and concurrency."""

    kind: str | None = None  # closed | constant | poisson | gamma | trace
    rate: float | None = None  # offered req/s (open loop)
    concurrency: int | None = None  # users (closed loop) or the in-flight cap (open loop)
    burstiness: float | None = None  # gamma shape

    @classmethod
    def of(cls, arrival: Arrival) -> Load:
        """The load of a workload's arrival process (bench and simulate)."""
        gamma = arrival.kind == "gamma"
        return cls(
            kind=arrival.kind,
            rate=arrival.rate,
            concurrency=arrival.concurrency,
            burstiness=arrival.burstiness if gamma else None,
        )

    @classmethod
    def point(cls, load_kind: str, load: float) -> Load:
        """A tuning point: `load` closed-loop users, or `load` req/s of Poisson arrivals."""
        if load_kind == "concurrency":
            return cls(kind="closed", concurrency=int(load))
        return cls(kind="poisson", rate=load)


class RunResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    id: str
    created_utc: str
    backend: Literal["real", "sim"] = "real"
    target: Target = Field(default_factory=Target)
    workload: dict[str, Any] = Field(default_factory=dict)
    load: Load = Field(default_factory=Load)
    slo: SLO | None = None
    status: ResultStatus = RunStatus.COMPLETED
    stop_reason: str | None = None
    anchor_ns: int = 0
    started_unix_s: float = 0.0
    duration_s: float = 0.0
    client: ClientInfo = Field(default_factory=ClientInfo)
    requests: list[Request] = Field(default_factory=list)
    records: list[RequestRecord] = Field(default_factory=list)
    metrics: Metrics = Field(default_factory=Metrics)
    server: ServerSeries | None = None
    telemetry: TelemetrySeries | None = None
    cancellation: dict[str, Any] | None = None

    @property
    def workload_name(self) -> str:
        """The workload's name (its run id when it has none): what groups repeats."""
        return str(self.workload.get("name") or self.id)

    @field_serializer("records", mode="wrap")
    def _records_out(self, records: Any, handler: SerializerFunctionWrapHandler) -> Any:
        """The simulator assigns a lazy record sequence (sim.records.SimRecords); it is
        written as the plain list of records it stands for."""
        return handler(records if isinstance(records, list) else list(records))


def by_workload(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    """Runs grouped by workload name (repeats of one workload), each group in the order
    the engine served them."""
    by: dict[str, list[RunResult]] = {}
    for r in sorted(runs, key=lambda r: r.started_unix_s or 0.0):
        by.setdefault(r.workload_name, []).append(r)
    return by
