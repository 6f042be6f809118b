"""RunResult: raw per-request records plus the metrics computed from them.

All times are integer nanoseconds on the monotonic clock, relative to the run's anchor
(`RunResult.anchor_ns`), so records from several worker processes share one time axis.
`bench` and `simulate` both write this schema; a sim-vs-real comparison is a diff.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_serializer

from servetune.slo import SLO
from servetune.workload.materialize import Request

SCHEMA_VERSION = 1

Status = Literal["ok", "error", "cancelled", "aborted"]

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
    status: Status = "ok"
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
    sent_req_s: float = 0.0
    goodput_req_s: float | None = None
    slo_attainment: float | None = None
    slo_pass: bool | None = None
    slo_checks: list[SLOCheck] = Field(default_factory=list)
    token_count_compared: int = 0
    token_count_mismatched: int = 0
    token_count_max_abs_diff: int = 0
    max_in_flight: int = 0


class ClientInfo(BaseModel):
    workers: int = 1
    cpu_s: float = 0.0
    cpu_util: float = 0.0
    event_loop: str = "asyncio"
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


class RunResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    id: str
    created_utc: str
    backend: Literal["real", "sim"] = "real"
    target: dict[str, Any] = Field(default_factory=dict)
    workload: dict[str, Any] = Field(default_factory=dict)
    load: dict[str, Any] = Field(default_factory=dict)
    slo: SLO | None = None
    status: Literal["completed", "interrupted", "circuit_breaker", "failed"] = "completed"
    stop_reason: str | None = None
    anchor_ns: int = 0
    started_unix_s: float = 0.0
    duration_s: float = 0.0
    client: ClientInfo = Field(default_factory=ClientInfo)
    requests: list[Request] = Field(default_factory=list)
    records: list[RequestRecord] = Field(default_factory=list)
    metrics: Metrics = Field(default_factory=Metrics)
    server: ServerSeries | None = None
    cancellation: dict[str, Any] | None = None

    @field_serializer("records", mode="wrap")
    def _records_out(self, records: Any, handler: SerializerFunctionWrapHandler) -> Any:
        """The simulator assigns a lazy record sequence (sim.records.SimRecords); it is
        written as the plain list of records it stands for."""
        return handler(records if isinstance(records, list) else list(records))
