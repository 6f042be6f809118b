"""The numbers a diagnosis reads, pulled once out of a run: the client's metrics, the
engine's /metrics series, the telemetry, and the config it ran with. Pure: a RunResult
(or a live window's series) in, an `Evidence` out; every rule reads only this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servetune.results.schema import RunResult, ServerSeries, TelemetrySeries
from servetune.status import RequestStatus
from servetune.telemetry import summarize


@dataclass
class Evidence:
    source: str  # run id, file or URL
    engine: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    live: bool = False  # a --url window: no client of our own, no latencies
    # client side (ms, req/s)
    completed: int = 0
    ttft: dict[str, float] = field(default_factory=dict)  # mean, p50, p99
    tpot: dict[str, float] = field(default_factory=dict)
    e2e: dict[str, float] = field(default_factory=dict)
    input_tokens: dict[str, float] = field(default_factory=dict)  # p50, p90, p99, max
    output_tokens: dict[str, float] = field(default_factory=dict)
    offered_req_s: float | None = None
    achieved_req_s: float = 0.0
    sent_req_s: float = 0.0
    send_lag_p99_ms: float | None = None
    client_queue_p99_ms: float | None = None  # waits for the client's own in-flight cap
    client_cap: int | None = None  # an open loop's --max-concurrency
    client_cpu_util: float = 0.0
    concurrency: int | None = None
    max_in_flight: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    oom_errors: int = 0
    failure: dict[str, Any] | None = None  # tune's TuneFailure (kind oom, crash, ...)
    cancellation: dict[str, Any] | None = None
    # engine side
    running_max: float | None = None
    running_mean: float | None = None
    running_busy_mean: float | None = None  # over samples with something running: the batch
    waiting_max: float | None = None
    waiting_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    queue_ms: float | None = None  # engine's mean queue time over the run
    prefill_ms: float | None = None
    # the per-step token budget the run recorded (target.max_num_batched_tokens): the
    # engine's own default when the config left it unset
    recorded_batched_tokens: int | None = None
    # telemetry (summarize(): <name>_max/_mean/_min)
    tel: dict[str, float] = field(default_factory=dict)

    def effective(self, knob: str, default: Any = None) -> Any:
        """A knob as the engine runs it: what the engine reported at start first (vLLM logs
        the KV cache dtype it resolved `auto` to: FP8 for a ModelOpt FP8 checkpoint), then
        the config it was given."""
        return self.settings.get(knob) or self.config.get(knob) or default

    @property
    def batched_tokens(self) -> int | None:
        """The per-step token budget in force: the config's, else the one the run recorded
        (vLLM's default is 8192 on a GPU, not 2048); None when neither says."""
        v = self.config.get("max_num_batched_tokens") or self.recorded_batched_tokens
        return int(v) if v else None

    @property
    def kv_pool_tokens(self) -> int | None:
        """The KV pool in tokens: the config's kv_cache_tokens first (the pool the engine was
        told to keep: llama.cpp -c, vLLM's block override), else what the engine reported
        at start (vLLM's "KV cache size: N tokens"); what memory could hold is not the pool."""
        v = self.config.get("kv_cache_tokens") or self.settings.get("kv_cache_tokens")
        return int(v) if v else None

    @property
    def batch_cap(self) -> int | None:
        """The engine's cap on requests running together: vLLM max_num_seqs, llama.cpp
        slots (explicit config first, then what the engine reported)."""
        for key in ("max_num_seqs", "parallel_slots"):
            v = self.config.get(key) or self.settings.get(key)
            if v:
                return int(v)
        return None


def _dist(d: Any) -> dict[str, float]:
    out = {k: getattr(d, k) for k in ("mean", "p50", "p90", "p99", "max")}
    return {k: float(v) for k, v in out.items() if v is not None}


def _pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs, dtype=float)
    q = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": q[0], "p90": q[1], "p99": q[2], "max": a.max()}


def engine_figures(ev: Evidence, series: ServerSeries | None) -> None:
    """Peaks and means of the engine's canonical series; queue and prefill means from the
    run's histogram deltas (bench.server_metrics.ttft_breakdown's sources)."""
    if series is None or not series.values:
        return
    for name, attr in (("requests_running", "running"), ("requests_waiting", "waiting")):
        vals = series.series(name)
        if vals:
            setattr(ev, f"{attr}_max", max(vals))
            setattr(ev, f"{attr}_mean", float(np.mean(vals)))
    busy = [v for v in series.series("requests_running") if v > 0]
    if busy:
        ev.running_busy_mean = float(np.mean(busy))
    ev.kv_usage_max = series.peak("kv_cache_usage")
    if pool := series.peak("kv_cache_capacity_tokens"):  # the pool the engine says it keeps
        ev.settings.setdefault("kv_cache_tokens", int(pool))
    d = series.deltas
    if "preemptions_total" in d:
        ev.preemptions = d["preemptions_total"]
    for part in ("queue", "prefill"):
        n = d.get(f"{part}_time_seconds_count", 0.0)
        if n > 0:
            setattr(ev, f"{part}_ms", d[f"{part}_time_seconds_sum"] / n * 1e3)


def from_result(res: RunResult, source: str | None = None) -> Evidence:
    m = res.metrics
    ok = [r for r in res.records if r.status == RequestStatus.OK]
    ev = Evidence(
        source=source or res.id,
        engine=res.target.engine,
        config=dict(res.target.config or {}),
        settings=dict(res.target.settings or {}),
        completed=m.completed,
        ttft=_dist(m.ttft_ms),
        tpot=_dist(m.tpot_ms),
        e2e=_dist(m.e2e_ms),
        input_tokens=_pcts([r.input_tokens for r in ok]),
        output_tokens=_pcts([r.output_tokens for r in ok]),
        offered_req_s=m.offered_req_s,
        achieved_req_s=m.req_s,
        sent_req_s=m.sent_req_s,
        send_lag_p99_ms=m.send_lag_ms.p99,
        client_queue_p99_ms=m.queue_ms.p99,
        client_cap=res.load.concurrency if res.load.kind != "closed" else None,
        client_cpu_util=res.client.cpu_util,
        concurrency=res.load.concurrency if res.load.kind == "closed" else None,
        max_in_flight=m.max_in_flight,
        errors=dict(m.errors_by_class),
        cancellation=res.cancellation,
        tel=summarize(res.telemetry),
        recorded_batched_tokens=res.target.max_num_batched_tokens,
    )
    ev.oom_errors = sum(
        1
        for r in res.records
        if r.status == RequestStatus.ERROR and "out of memory" in (r.error_detail or "").lower()
    )
    tag = res.target.tune
    if tag is not None and tag.failure is not None:
        ev.failure = tag.failure.model_dump(mode="json")
    engine_figures(ev, res.server)
    if res.backend == "sim":
        sim_figures(ev, res)
    return ev


def sim_figures(ev: Evidence, res: RunResult) -> None:
    """A simulated run has no /metrics: its scheduler counters stand in (preemptions, peak
    KV blocks of the pool, the batch cap, the pool in tokens). Waiting is what a closed
    loop holds past the cap (the simulator admits up to max_num_seqs)."""
    tg = res.target
    sim = tg.sim
    ev.preemptions = float(sim.preemptions)
    if tg.kv_blocks:
        ev.kv_usage_max = sim.max_kv_blocks_used / tg.kv_blocks
    if tg.max_num_seqs:
        ev.config.setdefault("max_num_seqs", tg.max_num_seqs)
        if ev.concurrency:
            ev.waiting_max = float(max(0, ev.concurrency - tg.max_num_seqs))
    if tg.kv_capacity_tokens:
        ev.settings.setdefault("kv_cache_tokens", tg.kv_capacity_tokens)


def from_window(
    url: str, series: ServerSeries, telemetry: TelemetrySeries | None, engine: str | None
) -> Evidence:
    """A live deployment watched for a window (`diagnose --url`): engine and telemetry
    only; no latencies, since servetune sent nothing."""
    ev = Evidence(source=url, engine=engine, live=True, tel=summarize(telemetry))
    engine_figures(ev, series)
    return ev
