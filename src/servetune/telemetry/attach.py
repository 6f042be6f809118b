"""Telemetry around one measured point: `sampling(...)` starts the sampler and wraps the
run's store recorder so the series is attached to the result before the store writes it
(the runner finishes the stored run itself); `attach` covers a run without a store."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from servetune.errors import InputError
from servetune.results.schema import RunResult
from servetune.telemetry.sampler import Sampler, start_sampler


@dataclass(frozen=True)
class TelemetryOptions:
    """What to sample besides the host: a Prometheus URL (a DCGM exporter), and how often.
    `enabled=False` is `--no-telemetry`."""

    enabled: bool = True
    url: str | None = None
    interval_s: float = 1.0


DEFAULT_TELEMETRY = TelemetryOptions()


def telemetry_options(enabled: bool, url: str | None) -> TelemetryOptions:
    """The CLI's `--telemetry/--no-telemetry` and `--telemetry-url`, checked."""
    if url is not None and not url.startswith(("http://", "https://")):
        raise InputError(
            "--telemetry-url", f"{url!r} is not an http(s) URL", "e.g. http://gpu-node:9400/metrics"
        )
    return TelemetryOptions(enabled, url)


class PointTelemetry:
    """A running sampler for one point; `attach` stops it once and sets `result.telemetry`."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.series: Any = None

    def attach(self, result: RunResult | None) -> None:
        if result is None:
            return
        if self.series is None:
            self.series = self.sampler.stop(result.anchor_ns)
        if result.telemetry is None:
            result.telemetry = self.series

    def close(self) -> None:
        """Stop sampling without a result (the point failed before it had one)."""
        if self.series is None:
            self.series = self.sampler.stop(0)

    def recorder(self, store: Any) -> Any:
        """`store` (a bench RunRecorder or None), with each run's finish attaching first."""
        return None if store is None else _Recorder(store, self)


class _Stream:
    def __init__(self, inner: Any, tel: PointTelemetry) -> None:
        self.inner = inner
        self.tel = tel

    def write(self, batch: list[dict[str, Any]]) -> None:
        self.inner.write(batch)

    def finish(self, result: RunResult | None) -> None:
        self.tel.attach(result)
        self.inner.finish(result)


class _Recorder:
    def __init__(self, inner: Any, tel: PointTelemetry) -> None:
        self.inner = inner
        self.tel = tel

    def begin(self, run_id: str, **kw: Any) -> Any:
        stream = self.inner.begin(run_id, **kw)
        return None if stream is None else _Stream(stream, self.tel)


def sampling(
    opts: TelemetryOptions | None,
    engine_pids: Callable[[], Iterable[int]] | None,
) -> PointTelemetry | None:
    """Start sampling for one point, or None when telemetry is off."""
    if opts is None or not opts.enabled:
        return None
    return PointTelemetry(start_sampler(engine_pids, opts.url, opts.interval_s))
