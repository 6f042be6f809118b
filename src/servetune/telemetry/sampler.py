"""The sampler: every `interval_s`, read each source (host, GPU, a Prometheus URL) in one
thread and stamp the sample with the monotonic clock the client's records use, so the
series lines up with every request (times relative to the run's anchor).

A source that fails is counted in `errors` and never breaks the run; a source that cannot
start (no GPU, no NVML) is left out with a note.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from servetune.bench.server_metrics import series_deltas
from servetune.results.schema import TelemetrySeries


class Source(Protocol):
    name: str

    def read(self) -> dict[str, float]: ...

    def close(self) -> None: ...


def open_sources(
    engine_pids: Callable[[], Iterable[int]] | None = None,
    url: str | None = None,
    gpu: bool = True,
) -> tuple[list[Source], list[str]]:
    """The sources this host offers, and a note for each one skipped."""
    from servetune.telemetry.host import HostSource

    sources: list[Source] = [HostSource(engine_pids)]
    notes: list[str] = []
    if engine_pids is None:
        notes.append("engine process: not local (no process tree sampled)")
    if gpu:
        from servetune.telemetry.gpu import open_gpu

        src, why = open_gpu()
        if src is not None:
            sources.append(src)
        if why:  # the whole source, or the GPUs NVML could not open
            notes.append(why)
    if url:
        from servetune.telemetry.prom import PromSource

        sources.append(PromSource(url))
    return sources, notes


class Sampler:
    """Reads `sources` every `interval_s` in a daemon thread from `start()` to `stop()`."""

    def __init__(
        self, sources: list[Source], notes: list[str] | None = None, interval_s: float = 1.0
    ) -> None:
        self.sources = sources
        self.interval_s = interval_s
        self.t_ns: list[int] = []
        self.values: list[dict[str, float]] = []
        self.notes = list(notes or [])
        self.errors = 0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        c0 = time.thread_time()
        t = time.monotonic_ns()
        row: dict[str, float] = {}
        for src in self.sources:
            try:
                row.update(src.read())
            except Exception:  # telemetry must never break a run: counted, not raised
                self.errors += 1
        self.t_ns.append(t)
        self.values.append(row)
        self.cpu_s += time.thread_time() - c0

    def start(self) -> Sampler:
        def loop() -> None:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, daemon=True, name="telemetry")
        self._thread.start()
        return self

    def stop(self, anchor_ns: int) -> TelemetrySeries:
        """Stop, take a last sample, and return the series on the run's time axis."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()
        for src in self.sources:
            with contextlib.suppress(Exception):  # closing is best effort
                src.close()
        return TelemetrySeries(
            interval_s=self.interval_s,
            t_ns=[t - anchor_ns for t in self.t_ns],
            values=self.values,
            deltas=series_deltas(self.values),
            errors=self.errors,
            sources=[s.name for s in self.sources],
            notes=self.notes,
            sampler_cpu_s=self.cpu_s,
        )


def start_sampler(
    engine_pids: Callable[[], Iterable[int]] | None = None,
    url: str | None = None,
    interval_s: float = 1.0,
) -> Sampler:
    """Open this host's sources and start sampling."""
    sources, notes = open_sources(engine_pids, url)
    return Sampler(sources, notes, interval_s).start()


def summarize(series: TelemetrySeries | None) -> dict[str, Any]:
    """Peaks and means of the headline telemetry (report, diagnose, `runs show`)."""
    if series is None:
        return {}
    out: dict[str, Any] = {}
    for name in (
        "host_cpu_busy",
        "host_cpu_steal",
        "engine_cpu_cores",
        "engine_runq_wait_share",
        "engine_runq_wait_cores",
        "host_cpu_cores",
        "client_cpu_cores",
        "other_cpu_cores",
        "engine_rss_bytes",
        "host_mem_used_bytes",
        "gpu_memory_used",
        "gpu_util",
        "gpu_temp_c",
        "gpu_power_w",
        "gpu_sm_clock_mhz",
        "gpu_sm_clock_max_mhz",
        "gpu_throttled",
    ):
        vals = series.series(name)
        if vals:
            out[f"{name}_max"] = max(vals)
            out[f"{name}_mean"] = sum(vals) / len(vals)
            out[f"{name}_min"] = min(vals)
    for name in ("gpu_xid_total", "gpu_ecc_uncorrected"):
        if name in series.deltas:
            out[f"{name[:-6] if name.endswith('_total') else name}_added"] = series.deltas[name]
    return out
