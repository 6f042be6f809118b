"""The numbers a diagnosis reads, pulled once out of a run: the client's metrics, the
engine's /metrics series, the telemetry, and the config it ran with. Pure: a RunResult
(or a live window's series) in, an `Evidence` out; every rule reads only this."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from servetune.engines.config import EngineConfig
from servetune.errors import InputError, from_validation_error
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
    ttft: dict[str, float] = field(default_factory=dict)  # mean, p50, p90, p95, p99, max
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
    # the run's SLO targets by metric and stat ({"ttft_ms": {"p95": 800}}); empty: none
    slo: dict[str, dict[str, float]] = field(default_factory=dict)
    # telemetry (summarize(): <name>_max/_mean/_min; gpu_sm_clock_mhz_busy_min: busy_clock)
    tel: dict[str, float] = field(default_factory=dict)

    def effective(self, knob: str, default: Any = None) -> Any:
        """A knob as the engine runs it: what the engine reported at start first (vLLM logs
        the KV cache dtype it resolved `auto` to: FP8 for a ModelOpt FP8 checkpoint), then
        the config it was given."""
        return self.settings.get(knob) or self.config.get(knob) or default

    @property
    def batched_tokens(self) -> int | None:
        """The per-step token budget in force: the config's (llama.cpp's batch_size first:
        its adapter gives -b batch_size over max_num_batched_tokens), else the one the run
        recorded (vLLM's default is 8192 on a large GPU, not 2048); None when neither says."""
        c = self.config
        v = c.get("batch_size") or c.get("max_num_batched_tokens") or self.recorded_batched_tokens
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
    out = {k: getattr(d, k) for k in ("mean", "p50", "p90", "p95", "p99", "max")}
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


def _first_non_finite(model: BaseModel, prefix: str) -> tuple[str, float] | None:
    """The dotted path and value of the first NaN or infinite number in `model` (None: all
    finite). Every stored figure is computed by servetune and finite; a NaN is a damaged or
    edited file, and it would print as `nan%`, or as invalid JSON (`NaN`) under `--json`."""

    def walk(v: Any, path: str) -> tuple[str, float] | None:
        if isinstance(v, float) and not math.isfinite(v):
            return path, v
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        return next((bad for k, x in items if (bad := walk(x, f"{path}.{k}"))), None)

    return walk(model.model_dump(), prefix)


def checked_config(res: RunResult, source: str) -> dict[str, Any]:
    """The run's engine config with its knobs validated as EngineConfig validates them
    (one line naming the field for a value no engine takes: `max_num_seqs: lots` was an
    int() traceback), as EngineConfig holds them (`"8"` -> 8). Keys EngineConfig does not
    know are kept as they are: an older or newer servetune may have written them."""
    cfg = dict(res.target.config or {})
    known = {k: v for k, v in cfg.items() if k in EngineConfig.model_fields}
    try:
        valid = EngineConfig.model_validate(known)
    except ValidationError as exc:
        e = from_validation_error(exc, "target.config")
        fix = "give the knob as --set takes it"
        raise InputError(e.field, f"{e.problem} in {source}", fix) from None
    return {**cfg, **valid.model_dump(include=set(known))}


def check_finite(res: RunResult, source: str) -> None:
    """Refuse a run whose metrics hold a NaN or an infinity, naming the field
    (docs/diagnose.md: refused, not printed as null: a damaged figure is not a missing one)."""
    if (bad := _first_non_finite(res.metrics, "metrics")) is not None:
        path, value = bad
        raise InputError(
            path,
            f"{value} in {source} is not a finite number",
            "re-measure the run or restore the file",
        )


BUSY_UTIL = 0.5  # a sample with the GPU busy at least half the time


def busy_clock(series: TelemetrySeries | None) -> dict[str, float]:
    """`gpu_sm_clock_mhz_busy_min`: the lowest SM clock among the samples where the GPU was
    busy at least half the time. An idle GPU drops its clocks by design (its P-states), so
    the minimum over every sample read the idle start and end of a run as a downclock."""
    if series is None:
        return {}
    busy = [
        v["gpu_sm_clock_mhz"]
        for v in series.values
        if "gpu_sm_clock_mhz" in v and v.get("gpu_util", 0.0) >= BUSY_UTIL
    ]
    return {"gpu_sm_clock_mhz_busy_min": min(busy)} if busy else {}


def from_result(res: RunResult, source: str | None = None) -> Evidence:
    """The evidence of a stored run; a config value no engine takes or a non-finite
    metric is refused in one line naming its field (`checked_config`, `check_finite`)."""
    m = res.metrics
    source = source or res.id
    check_finite(res, source)
    ok = [r for r in res.records if r.status == RequestStatus.OK]
    ev = Evidence(
        source=source,
        engine=res.target.engine,
        config=checked_config(res, source),
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
        tel=summarize(res.telemetry) | busy_clock(res.telemetry),
        recorded_batched_tokens=res.target.max_num_batched_tokens,
        slo=_slo_targets(res),
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


def _slo_targets(res: RunResult) -> dict[str, dict[str, float]]:
    """The run's latency targets by metric and stat (rules compare TTFT/TPOT with them)."""
    slo = res.slo
    if slo is None:
        return {}
    out = {}
    for metric in ("ttft_ms", "tpot_ms"):
        if (t := getattr(slo, metric)) is not None:
            out[metric] = dict(t.items())
    return out


def sim_figures(ev: Evidence, res: RunResult) -> None:
    """A simulated run has no /metrics: its scheduler counters stand in (preemptions, peak
    KV blocks of the pool, the batch cap, the pool in tokens). Waiting is what the load
    holds past the cap (the simulator admits up to max_num_seqs): a closed loop's users
    past it, an open loop's peak in flight past it (its arrivals do not wait for answers,
    so what is in flight beyond the cap is queued in the engine)."""
    tg = res.target
    sim = tg.sim
    ev.preemptions = float(sim.preemptions)
    if tg.kv_blocks:
        ev.kv_usage_max = sim.max_kv_blocks_used / tg.kv_blocks
    if tg.max_num_seqs:
        ev.config.setdefault("max_num_seqs", tg.max_num_seqs)
        users = ev.concurrency or ev.max_in_flight
        if users:
            ev.waiting_max = float(max(0, users - tg.max_num_seqs))
    if tg.kv_capacity_tokens:
        ev.settings.setdefault("kv_cache_tokens", tg.kv_capacity_tokens)


def from_window(
    url: str, series: ServerSeries, telemetry: TelemetrySeries | None, engine: str | None
) -> Evidence:
    """A live deployment watched for a window (`diagnose --url`): engine and telemetry
    only; no latencies, since servetune sent nothing."""
    tel = summarize(telemetry) | busy_clock(telemetry)
    ev = Evidence(source=url, engine=engine, live=True, tel=tel)
    engine_figures(ev, series)
    return ev
