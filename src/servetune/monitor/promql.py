"""PromQL over an engine's own metric names (the canonical map in servetune.engines: vLLM,
SGLang, TGI, llama.cpp), one expression per signal the rules, dashboard and autoscalers
share. Pure functions: names in, query strings out."""

from __future__ import annotations

from servetune.engines.registry import adapter


def _sel(name: str, job: str) -> str:
    return f'{name}{{job="{job}"}}'


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


def tpot_family(engine: str) -> str | None:
    """The per-request TPOT histogram (vLLM v0.11+, SGLang, TGI), which is what an SLO's
    TPOT percentile is over; else the inter-token latency, a percentile over every token
    gap, which a request's one stall among many fast gaps pushes above the TPOT's (a
    simulated vLLM point at its tuned capacity: TPOT P95 22 ms, ITL P95 39 ms)."""
    for canon in ("tpot_seconds", "itl_seconds"):
        if _hist(engine, canon):
            return canon
    return None


def signals(engine: str, job: str, window: str) -> dict[str, str]:
    """Every signal this engine can give: name -> PromQL (absent when it exports nothing)."""
    out: dict[str, str] = {}
    for canon in ("requests_waiting", "requests_running"):
        if src := _gauge(engine, canon):
            out[canon] = f"sum({_sel(src, job)})"
    if src := _gauge(engine, "kv_cache_usage"):
        out["kv_cache_usage"] = f"max({_sel(src, job)})"
    elif (used := _gauge(engine, "kv_cache_used_tokens")) and (
        cap := _gauge(engine, "kv_cache_capacity_tokens")
    ):  # TGI: tokens in the batch over the pool's total
        out["kv_cache_usage"] = f"max({_sel(used, job)} / {_sel(cap, job)})"
    for canon, label in (
        ("queue_time_seconds", "queue_wait_seconds:p95"),
        ("ttft_seconds", "ttft_seconds:p95"),
    ):
        if expr := quantile(engine, canon, 0.95, job, window):
            out[label] = expr
    if expr := quantile(engine, "ttft_seconds", 0.99, job, window):
        out["ttft_seconds:p99"] = expr
    if (fam := tpot_family(engine)) and (expr := quantile(engine, fam, 0.95, job, window)):
        out["tpot_seconds:p95"] = expr
    for canon in ("generation_tokens_total", "requests_finished_total"):
        if src := _gauge(engine, canon):
            out[canon.removesuffix("_total") + ":rate"] = f"sum(rate({_sel(src, job)}[{window}]))"
    out["replicas"] = f'count(up{{job="{job}"}} == 1)'
    return out


def record_name(signal: str) -> str:
    """Recording-rule name, Prometheus' level:metric:operations convention."""
    metric, _, op = signal.partition(":")
    return f"servetune:{metric}:{op or 'value'}"
