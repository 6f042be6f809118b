"""PromQL over an engine's own metric names (the canonical map in servetune.engines: vLLM,
SGLang, TGI, llama.cpp), one expression per signal the rules, dashboard and autoscalers
share. Pure functions: names in, query strings out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from servetune.engines.registry import adapter

if TYPE_CHECKING:
    from servetune.slo import SLO

# The SLO file's percentile statistics (servetune.slo.Targets) as histogram_quantile's q.
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
# SLO latency metric -> the signal name its statistics are recorded under (seconds).
LATENCY_SIGNALS = {
    "ttft_ms": "ttft_seconds",
    "tpot_ms": "tpot_seconds",
    "itl_ms": "itl_seconds",
    "e2e_ms": "e2e_seconds",
}

# Where an engine counts failed requests apart from served ones (seed 003 §1: 5xx under
# 0.1%): (counter, its label matcher). vLLM v1 labels every finished request with its
# reason on the finished counter itself; "error" is "always converted to 500 Internal
# Server Error" (vllm/v1/engine/__init__.py, FinishReason.ERROR). TGI's router counts
# failures beside its successes: tgi_request_failure{err} (router/src at v3.3.7, listed in
# servetune/data/engine_flags/tgi.json).
FAILED_REQUESTS: dict[str, tuple[str, str]] = {
    "vllm": ("vllm:request_success_total", 'finished_reason="error"'),
    "tgi": ("tgi_request_failure", ""),
}


# The first bucket edge of an engine's queue-time histogram, where it is far from 0: vLLM
# observes vllm:request_queue_time_seconds into request_latency_buckets, which start at
# 0.3 s (vllm/v1/metrics/loggers.py). SGLang's queue buckets start at 0 (sglang/srt/
# metrics/collector.py) and TGI's at 0.15 ms (0.0001 x 1.5, router/src/server.rs): their
# first bucket hides nothing a scaling rule reads.
FIRST_QUEUE_BUCKET_S = {"vllm": 0.3}
# KV usage an engine exports only as pages in use and the pool's pages (onnx_rt.derived
# combines the same two gauges for the live view; a test checks the names agree).
KV_PAGES = {"onnx": ("onnx_genai_kv_pages_in_use", "onnx_genai_kv_pages_capacity")}


def _sel(name: str, job: str, match: str = "") -> str:
    return f'{name}{{job="{job}"{"," + match if match else ""}}}'


def _gauge(engine: str, canon: str) -> str | None:
    return adapter(engine).METRICS.get(canon)


def _hist(engine: str, canon: str) -> str | None:
    return adapter(engine).HISTOGRAMS.get(canon)


def quantile(engine: str, canon: str, q: float, job: str, window: str) -> str | None:
    """histogram_quantile over all replicas' buckets (the exporters' own histogram)."""
    fam = _hist(engine, canon)
    if fam is None:
        return None
    return f"histogram_quantile({q:g}, sum by (le) (rate({_sel(fam + '_bucket', job)}[{window}])))"


def latency(engine: str, canon: str, stat: str, job: str, window: str) -> str | None:
    """One SLO statistic of a latency histogram: a quantile, or the mean as rate(_sum) /
    rate(_count) (exact; a quantile is interpolated inside a bucket). None for `max`: a
    histogram keeps bucket counts, not the largest value."""
    if stat in QUANTILES:
        return quantile(engine, canon, QUANTILES[stat], job, window)
    fam = _hist(engine, canon)
    if stat != "mean" or fam is None:
        return None
    total, count = _sel(fam + "_sum", job), _sel(fam + "_count", job)
    return f"sum(rate({total}[{window}])) / sum(rate({count}[{window}]))"


def zero_below(expr: str, floor: float = 0.0) -> str:
    """0 where a scaling quantile says nothing. Idle: histogram_quantile over all-zero rates
    is NaN (0/0), which KEDA cannot compare and an HPA cannot scale on. Inside the first
    bucket [0, floor]: histogram_quantile interpolates linearly from 0 there, so a P95 of
    requests that all waited under vLLM's first edge reads 0.95 x 0.3 = 0.285 s however
    short their wait, and an HPA Value target of 0.3 s then holds N replicas for ever
    (desired = ceil(N x 0.285 / 0.3) = N). `NaN > floor` and `q > floor` for q <= floor
    are false, so the sample drops and `or vector(0)` fills in; a quantile past the first
    bucket passes unchanged."""
    return f"({expr} > {floor:g}) or vector(0)"


def kv_usage(engine: str, job: str) -> str | None:
    """The busiest replica's KV pool use, 0..1 (None: the engine exports none): the
    engine's own gauge; TGI's tokens in the batch over the pool's total tokens; ONNX's
    pages in use over the pool's pages, capped at 1 as onnx_rt.derived caps it (a page
    demoted to the cold tier keeps its reference, so in use may pass capacity)."""
    if src := _gauge(engine, "kv_cache_usage"):
        return f"max({_sel(src, job)})"
    used, cap = _gauge(engine, "kv_cache_used_tokens"), _gauge(engine, "kv_cache_capacity_tokens")
    if used and cap:
        return f"max({_sel(used, job)} / {_sel(cap, job)})"
    if engine in KV_PAGES:
        in_use, pages = KV_PAGES[engine]
        return f"clamp_max(max({_sel(in_use, job)} / {_sel(pages, job)}), 1)"
    return None


def tpot_family(engine: str) -> str | None:
    """The per-request TPOT histogram (vLLM v0.11+, SGLang, TGI), which is what an SLO's
    TPOT percentile is over; else the inter-token latency, a percentile over every token
    gap, which a request's one stall among many fast gaps pushes above the TPOT's (a
    simulated vLLM point at its tuned capacity: TPOT P95 22 ms, ITL P95 39 ms)."""
    for canon in ("tpot_seconds", "itl_seconds"):
        if _hist(engine, canon):
            return canon
    return None


def slo_family(engine: str, metric: str) -> str | None:
    """The engine's histogram an SLO latency metric (ttft_ms, ...) is read from, or None."""
    if metric == "tpot_ms":
        return tpot_family(engine)
    canon = LATENCY_SIGNALS[metric]
    return canon if _hist(engine, canon) else None


def error_ratio(engine: str, job: str, window: str) -> str | None:
    """Failed / finished requests over the window from the engine's own counters (None:
    the engine counts no failures apart). Each side falls back to 0 when its counter has
    no series yet (TGI creates a counter at its first increment), so all-failing traffic
    reads 1, not nothing; no traffic reads NaN, which no alert fires on."""
    spec, done = FAILED_REQUESTS.get(engine), _gauge(engine, "requests_finished_total")
    if spec is None or done is None:
        return None
    counter, match = spec
    failed = f"(sum(rate({_sel(counter, job, match)}[{window}])) or vector(0))"
    served = f"(sum(rate({_sel(done, job)}[{window}])) or vector(0))"
    total = served if counter == done else f"({failed} + {served})"
    return f"{failed} / {total}"


def slo_latency_signals(engine: str, slo: SLO, job: str, window: str) -> dict[str, str]:
    """The SLO file's latency statistics the engine has a histogram for:
    `<metric>_seconds:<stat>` -> PromQL."""
    out: dict[str, str] = {}
    for metric, name in LATENCY_SIGNALS.items():
        targets, canon = getattr(slo, metric), slo_family(engine, metric)
        if targets is None or canon is None:
            continue
        for stat, _ms in targets.items():
            if expr := latency(engine, canon, stat, job, window):
                out[f"{name}:{stat}"] = expr
    return out


def signals(engine: str, job: str, window: str, slo: SLO | None = None) -> dict[str, str]:
    """Every signal this engine can give: name -> PromQL (absent when it exports nothing);
    with an SLO, also the latency statistics its targets name."""
    out: dict[str, str] = {}
    for canon in ("requests_waiting", "requests_running"):
        if src := _gauge(engine, canon):
            out[canon] = f"sum({_sel(src, job)})"
    if expr := kv_usage(engine, job):
        out["kv_cache_usage"] = expr
    if expr := quantile(engine, "queue_time_seconds", 0.95, job, window):
        # a scaling signal: 0 when idle or inside the first bucket
        out["queue_wait_seconds:p95"] = zero_below(expr, FIRST_QUEUE_BUCKET_S.get(engine, 0.0))
    for canon, stat in (("ttft_seconds", "p95"), ("ttft_seconds", "p99")):
        if expr := quantile(engine, canon, QUANTILES[stat], job, window):
            out[f"ttft_seconds:{stat}"] = expr
    if (fam := tpot_family(engine)) and (expr := quantile(engine, fam, 0.95, job, window)):
        out["tpot_seconds:p95"] = expr
    for canon in ("generation_tokens_total", "requests_finished_total"):
        if src := _gauge(engine, canon):
            out[canon.removesuffix("_total") + ":rate"] = f"sum(rate({_sel(src, job)}[{window}]))"
    if expr := error_ratio(engine, job, window):
        out["request_errors:ratio"] = expr
    out["replicas"] = f'count(up{{job="{job}"}} == 1)'
    if slo is not None:
        out.update(slo_latency_signals(engine, slo, job, window))
    return out


def record_name(signal: str) -> str:
    """Recording-rule name, Prometheus' level:metric:operations convention."""
    metric, _, op = signal.partition(":")
    return f"servetune:{metric}:{op or 'value'}"


def recorded(signal: str, labels: Mapping[str, str]) -> str:
    """One Deployment's recorded series of `signal`, as a selector on the labels its
    recording rules add (Deployment.labels)."""
    match = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{record_name(signal)}{{{match}}}"


def external_name(signal: str) -> str:
    """The External metric name prometheus-adapter serves a recorded signal as (the HPA's
    and the adapter config's shared name): the recording rule's, with `_` for `:`."""
    return record_name(signal).replace(":", "_")
