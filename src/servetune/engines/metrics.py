"""Scrape an engine's Prometheus `/metrics` and map its names to servetune's canonical ones.

Canonical names (same meaning on every engine; absent when an engine does not export it):
  requests_running, requests_waiting          gauges, requests
  kv_cache_usage                              gauge, fraction 0..1 of the KV pool in use
  kv_cache_capacity_tokens                    gauge, KV pool size in tokens (SGLang, TGI,
                                              vLLM: blocks x block tokens of its cache_config_info)
  kv_block_tokens, kv_cache_blocks            the paged pool's block size (tokens) and blocks
                                              (vLLM's cache_config_info labels)
  prefix_cache_queries_total, prefix_cache_hits_total   counters, tokens
  prefix_cache_hit_rate                       gauge (SGLang reports a rate, not counters)
  preemptions_total                           counter (SGLang: retracted requests)
  prompt_tokens_total, generation_tokens_total          counters, tokens
  requests_finished_total                     counter
  ttft_seconds, itl_seconds, queue_time_seconds, e2e_seconds, ...   histograms
Per-engine source names live in each adapter module (METRICS, HISTOGRAMS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servetune.engines.registry import ADAPTERS, adapter
from servetune.errors import InputError

# Gauges that are ratios: several label sets (e.g. DP ranks) are averaged, not summed.
_MEAN = {"kv_cache_usage", "prefix_cache_hit_rate", "busy_slots_per_decode"}


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over label sets: cumulative (le, count) buckets."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as Prometheus' histogram_quantile does."""
        if not self.count or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if math.isinf(le):
                    return prev_le
                width = n - prev_n
                return prev_le + (le - prev_le) * ((rank - prev_n) / width if width else 1.0)
            prev_le, prev_n = le, n
        return prev_le


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape: canonical values and histograms, plus every raw sample (summed)."""

    engine: str
    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)

    def get(self, name: str, default: float | None = None) -> float | None:
        return self.values.get(name, default)


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    """Prometheus text -> {sample name: [(labels, value), ...]} (prometheus-client's parser).
    NaN and ±Inf samples are left out, as `bench.server_metrics.flatten_prometheus` leaves
    them: valid exposition (a summary's quantiles before any observation), but no figure.
    Kept, a NaN gauge reached `diagnose --url --json` as `NaN`, which is not JSON."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if math.isfinite(s.value):
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _lookup(samples: Samples, name: str) -> list[tuple[dict[str, str], float]] | None:
    """Find a sample tolerant of the `_total` suffix (exporters differ on counters)."""
    for candidate in (name, name + "_total", name.removesuffix("_total")):
        if candidate in samples:
            return samples[candidate]
    return None


def _histogram(samples: Samples, family: str) -> Histogram | None:
    buckets = samples.get(family + "_bucket")
    if not buckets:
        return None
    by_le: dict[float, float] = {}
    for labels, value in buckets:
        le = float(labels.get("le", "inf"))
        by_le[le] = by_le.get(le, 0.0) + value
    count = sum(v for _, v in samples.get(family + "_count", []))
    total = sum(v for _, v in samples.get(family + "_sum", []))
    return Histogram(tuple(sorted(by_le.items())), count, total)


def _label_values(samples: Samples, labels: dict[str, tuple[str, str]]) -> dict[str, float]:
    """Figures an engine exports as a label of an info gauge (vLLM's
    `vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",...} 1`): canonical name
    -> (gauge, label), read from its first series whose label is a number."""
    out: dict[str, float] = {}
    for canon, (gauge, label) in labels.items():
        for lbls, _ in samples.get(gauge, []):
            try:
                out[canon] = float(lbls[label])
            except (KeyError, ValueError):
                continue
            break
    return out


def canonical(engine: str, text: str) -> EngineMetrics:
    """Map one engine's /metrics text to canonical names."""
    mod = adapter(engine)
    samples = parse(text)
    values: dict[str, float] = {}
    for canon, source in mod.METRICS.items():
        found = _lookup(samples, source)
        if not found:
            continue
        vals = [v for _, v in found]
        values[canon] = sum(vals) / len(vals) if canon in _MEAN else sum(vals)
    values |= _label_values(samples, getattr(mod, "METRIC_LABELS", {}))
    if "kv_cache_capacity_tokens" not in values and {"kv_block_tokens", "kv_cache_blocks"} <= set(
        values
    ):  # a paged pool holds its blocks x the tokens of one block
        values["kv_cache_capacity_tokens"] = values["kv_block_tokens"] * values["kv_cache_blocks"]
    hists = {c: h for c, fam in mod.HISTOGRAMS.items() if (h := _histogram(samples, fam))}
    raw = {name: sum(v for _, v in rows) for name, rows in samples.items()}
    if derive := getattr(mod, "derived", None):  # figures an engine exports only as parts
        values |= derive(raw)
    return EngineMetrics(engine, values, hists, raw)


def engine_of(text: str) -> str | None:
    """The engine whose own metric names a /metrics page carries (the adapters' `METRICS`
    sources: `llamacpp:requests_processing`, `vllm:num_requests_running`, ...), the one
    with the most of them; None when no engine's names are there. Why: `bench --url`
    without `--engine` read the page under raw names, so a run had no canonical series
    (KV use, queue, preemptions) and `diagnose` named vLLM's knobs for a llama.cpp server."""
    try:
        samples = parse(text)
    except ValueError:  # not Prometheus text (an HTML error page)
        return None
    hits = {
        name: sum(_lookup(samples, src) is not None for src in mod.METRICS.values())
        for name, mod in ADAPTERS.items()
    }
    best = max(hits, key=lambda name: hits[name])
    return best if hits[best] else None


def scrape(url: str, engine: str, timeout_s: float = 5.0) -> EngineMetrics:
    """GET <url>/metrics and map it (fresh connection: llama.cpp closes after each reply)."""
    import httpx

    try:
        resp = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise InputError("metrics", f"cannot reach {url}/metrics: {exc}") from exc
    if resp.status_code != 200:
        raise InputError(
            "metrics",
            f"{url}/metrics answered HTTP {resp.status_code}",
            "llama.cpp needs --metrics, SGLang --enable-metrics",
        )
    try:
        return canonical(engine, resp.text)
    except ValueError as exc:  # prometheus-client's parser on a body that is not its text
        raise InputError(
            "metrics",
            f"{url}/metrics is not Prometheus text ({str(exc)[:80]})",
            "point it at the engine's Prometheus endpoint",
        ) from None
