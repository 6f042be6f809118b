"""Telemetry sampled with every real run (docs/telemetry.md): host CPU per core with
steal, memory, the engine's process tree (CPU, RSS, run-queue wait), GPUs through NVML,
and any Prometheus endpoint (a DCGM exporter) by URL, on the client's clock.

    sampler = start_sampler(engine_pids=srv.pids)
    ...  # run the load
    result.telemetry = sampler.stop(result.anchor_ns)
"""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "DEFAULT_TELEMETRY": "attach",
    "PointTelemetry": "attach",
    "TelemetryOptions": "attach",
    "sampling": "attach",
    "telemetry_options": "attach",
    "Sampler": "sampler",
    "open_sources": "sampler",
    "start_sampler": "sampler",
    "summarize": "sampler",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
