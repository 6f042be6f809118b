"""Server-side series: scrape the engine's Prometheus `/metrics` about once a second.

The mapping from an engine's own names to canonical ones (running, waiting, kv_usage,
preemptions, prefix_hit_rate, queue_time ...) belongs to the engine layer; it plugs in
here as `adapter`: a callable from the exposition text to {canonical name: value}.
Without one, every sample is kept under its raw name (labels summed), which is enough
for deltas and for the cancellation check on the mock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from servetune.bench.http import server_root
from servetune.engines.metrics import canonical
from servetune.results.schema import RequestRecord, ServerSeries
from servetune.status import RequestStatus

Fetch = Callable[[], dict[str, float]]
Adapter = Callable[[str], dict[str, float]]

# Gauges that say how many requests the engine is running (canonical first, then raw names
# of vLLM, llama.cpp and the mock), used to check that cancelled streams free their slot.
RUNNING_KEYS = (
    "requests_running",
    "vllm:num_requests_running",
    "llamacpp:requests_processing",
    "mock:num_requests_running",
)


def flatten_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value summed over label sets}; histogram buckets
    are dropped (their _sum and _count stay), and so are NaN and ±Inf samples (valid
    exposition, e.g. a summary's quantiles before any observation, but a stored series
    must hold numbers: a NaN is written as null and the result no longer loads)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")) or not math.isfinite(s.value):
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def engine_adapter(engine: str) -> Adapter:
    """The engine layer's canonical mapping (servetune.engines.metrics): canonical gauges and
    counters, plus `<histogram>_count` / `_sum` so deltas give the run's mean queue time etc."""

    def adapt(text: str) -> dict[str, float]:
        m = canonical(engine, text)
        out = dict(m.values)
        for name, h in m.histograms.items():
            out[f"{name}_count"] = h.count
            out[f"{name}_sum"] = h.sum
        return out

    return adapt


def http_fetcher(base_url: str, adapter: Adapter | None = None, timeout_s: float = 2.0) -> Fetch:
    """A fetch function for `<base_url>/metrics`, mapped through `adapter` if given."""
    import httpx

    client = httpx.Client(timeout=timeout_s)
    url = server_root(base_url) + "/metrics"
    mapper = adapter or flatten_prometheus

    def fetch() -> dict[str, float]:
        r = client.get(url)
        r.raise_for_status()
        return mapper(r.text)

    return fetch


class Scraper:
    """Calls `fetch` every `interval_s` in a thread; times are ns relative to `anchor_ns`."""

    def __init__(self, fetch: Fetch, interval_s: float = 1.0) -> None:
        self.fetch = fetch
        self.series = ServerSeries(interval_s=interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.anchor_ns = 0

    def sample(self) -> dict[str, float] | None:
        try:
            values = self.fetch()
        except Exception:  # a scrape must never break the run: counted, not raised
            self.series.errors += 1
            return None
        self.series.t_ns.append(time.monotonic_ns() - self.anchor_ns)
        self.series.values.append(values)
        return values

    def start(self, anchor_ns: int) -> None:
        self.anchor_ns = anchor_ns
        self.series = ServerSeries(interval_s=self.series.interval_s)

        def loop() -> None:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.series.interval_s)

        self._stop.clear()
        self._thread = threading.Thread(target=loop, daemon=True, name="metrics-scraper")
        self._thread.start()

    def stop(self) -> ServerSeries:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()
        self.series.deltas = series_deltas(self.series.values)
        return self.series


# Prometheus naming: a counter's samples end in `_total`, and a histogram's or summary's
# `_count`, `_sum` and `_bucket` series are counters too (prometheus.io, "Metric and label
# naming" and the exposition format). Telemetry's own names that break the rule:
COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
NOT_COUNTERS = {"gpu_count", "gpu_memory_total"}  # gauges: GPUs sampled, memory size
ALSO_COUNTERS = {"gpu_ecc_uncorrected"}  # NVML volatile count: resets with the driver


def is_counter(name: str) -> bool:
    """Whether a series key is a counter by its name (see COUNTER_SUFFIXES)."""
    if name in NOT_COUNTERS:
        return False
    return name in ALSO_COUNTERS or name.endswith(COUNTER_SUFFIXES)


def counter_increase(xs: list[float]) -> float:
    """What a counter added over the samples, as Prometheus' increase() counts it (without
    its extrapolation to the window's edges): each rise counts, and a drop is a reset (an
    engine restart, another replica behind the /metrics URL), so the value after it is
    what was counted since the reset."""
    return sum(b - a if b >= a else b for a, b in zip(xs, xs[1:], strict=False))


def series_deltas(values: list[dict[str, float]]) -> dict[str, float]:
    """What the run changed, for every key in the first and the last sample: a counter's
    increase (through resets), a gauge's last minus first."""
    if len(values) < 2:
        return {}
    first, last = values[0], values[-1]
    out: dict[str, float] = {}
    for k in sorted(last):
        if k not in first:
            continue
        if is_counter(k):
            out[k] = counter_increase([v[k] for v in values if k in v])
        else:
            out[k] = last[k] - first[k]
    return out


def running_now(values: dict[str, float]) -> float | None:
    for k in RUNNING_KEYS:
        if k in values:
            return values[k]
    return None


def ttft_breakdown(
    records: Sequence[RequestRecord], deltas: dict[str, float] | None
) -> dict[str, float | None]:
    """Mean TTFT of the run's completed requests split where the engine says where it went.

    connect: the client's new-connection setup (counted inside TTFT). queue and prefill:
    the engine's own figures, as run deltas of vLLM's request_queue_time_seconds /
    request_prefill_time_seconds histograms (canonical `queue_time_seconds_sum/_count`,
    `prefill_time_seconds_sum/_count`), or llama.cpp's per-request `timings.prompt_ms`
    (it reports no queue time). rest: what neither explains (HTTP, tokenizing, scheduling
    gaps, detokenizing, the network). Milliseconds; None where the engine is silent.
    """
    ok = [r for r in records if r.status == RequestStatus.OK and r.chunk_ns]
    if not ok:
        return {}
    n = len(ok)
    out: dict[str, float | None] = {
        "ttft_ms": sum(r.chunk_ns[0] - r.send_ns for r in ok) / n / 1e6,
        "connect_ms": sum(r.connect_ns for r in ok) / n / 1e6,
    }
    d = deltas or {}
    for part in ("queue", "prefill"):
        count = d.get(f"{part}_time_seconds_count", 0.0)
        out[f"{part}_ms"] = d[f"{part}_time_seconds_sum"] / count * 1e3 if count > 0 else None
    if out["prefill_ms"] is None:
        prompt_ms = [
            r.server_timings["prompt_ms"]
            for r in ok
            if r.server_timings and "prompt_ms" in r.server_timings
        ]
        if len(prompt_ms) == n:
            out["prefill_ms"] = sum(prompt_ms) / n
    known = [out[k] for k in ("connect_ms", "queue_ms", "prefill_ms")]
    out["rest_ms"] = out["ttft_ms"] - sum(x for x in known if x is not None)  # type: ignore[operator]
    return out
