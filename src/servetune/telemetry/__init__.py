"""Telemetry sampled with every real run (docs/telemetry.md): host CPU per core with
steal, memory, the engine's process tree (CPU, RSS, run-queue wait), GPUs through NVML,
and any Prometheus endpoint (a DCGM exporter) by URL, on the client's clock.

    sampler = start_sampler(engine_pids=srv.pids)
    ...  # run the load
    result.telemetry = sampler.stop(result.anchor_ns)
"""

from servetune.telemetry.attach import (
    DEFAULT_TELEMETRY,
    PointTelemetry,
    TelemetryOptions,
    sampling,
    telemetry_options,
)
from servetune.telemetry.sampler import Sampler, open_sources, start_sampler, summarize

__all__ = [
    "DEFAULT_TELEMETRY",
    "PointTelemetry",
    "Sampler",
    "TelemetryOptions",
    "open_sources",
    "sampling",
    "start_sampler",
    "summarize",
    "telemetry_options",
]
