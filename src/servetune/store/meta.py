"""What a run is about, beyond its measurements: the seed 003 §16 fields that the
caller knows (model, precision, hardware, software stack, engine config, launch
command), plus the figures derived from the raw records at finish (measured request
distribution, stability), and for a simulated run stored without records its request
lengths redrawn from its workload. Pure, except `host_info`/`software_info` which read
the host.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from servetune import __version__
from servetune.build import build_id
from servetune.metrics.compute import compute_metrics, request_latencies_ms
from servetune.results.schema import Load, Metrics, RequestRecord, ServerSeries, Target
from servetune.slo import SLO
from servetune.status import RequestStatus

Verdict = Literal["keep", "drop", "next"]
VERDICTS: tuple[str, ...] = ("keep", "drop", "next")


class RunMeta(BaseModel):
    """What `bench`/`simulate`/`tune` tell the store when a run begins. Every field is
    optional; the more is given, the more of the §16 record is filled."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, description="Run id; generated when absent.")
    created_utc: str | None = None
    backend: Literal["real", "sim"] = "real"
    study: str | None = Field(None, description="Study name; created on first use.")
    study_kind: str | None = Field(None, description="sweep | tune | ab | ...")
    tags: list[str] = Field(default_factory=list)
    model: str | None = Field(None, description="Catalog id, HF id or local path.")
    precision: dict[str, Any] = Field(
        default_factory=dict, description="dtype, quantization, kv_cache_dtype (from config)."
    )
    engine_config: dict[str, Any] | None = Field(None, description="EngineConfig dump.")
    launch_command: list[str] | str | None = None
    hardware: dict[str, Any] = Field(
        default_factory=dict,
        description="gpu, gpu_count, topology, cpu, cpu_count, memory_gib (host_info()).",
    )
    software: dict[str, Any] = Field(
        default_factory=dict,
        description="engine, engine_version, servetune, driver, cuda, python, os; nccl "
        "only when the caller knows it (servetune cannot read the engine's).",
    )
    target: Target = Field(default_factory=Target)
    workload: dict[str, Any] = Field(default_factory=dict)
    load: Load = Field(default_factory=Load)
    slo: dict[str, Any] | None = None
    plan: dict[str, Any] | None = Field(None, description="plan_to_json(), for the report.")
    note: str | None = None

    def engine(self) -> str | None:
        return (self.engine_config or {}).get("engine") or self.software.get("engine")

    def filled(self) -> RunMeta:
        """Defaults that follow from other fields: precision from the engine config,
        servetune/python versions."""
        cfg = self.engine_config or {}
        precision = {
            "dtype": cfg.get("dtype"),
            "quantization": cfg.get("quantization"),
            "kv_cache_dtype": cfg.get("kv_cache_dtype"),
        }
        precision = {k: v for k, v in precision.items() if v is not None} | self.precision
        software = {
            "servetune": __version__,
            "servetune_build": build_id(),
            "python": platform.python_version(),
        }
        if self.engine():
            software["engine"] = self.engine()
        return self.model_copy(
            update={"precision": precision, "software": software | self.software}
        )


def _run(cmd: Sequence[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def host_info() -> dict[str, Any]:
    """Hardware of this host (seed 003 §16 "hardware"): GPUs via nvidia-smi when present,
    CPU model and count, memory. Best effort: unknown fields are left out."""
    info: dict[str, Any] = {"cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo", encoding="utf-8") as fh:
            kb = int(fh.readline().split()[1])
            info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        info.setdefault("cpu", platform.processor() or None)
    gpus = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    if gpus:
        names = [g.split(",")[0].strip() for g in gpus.splitlines()]
        info.update(gpu=names[0], gpu_count=len(names))
        topo = _run(["nvidia-smi", "topo", "-m"])
        if topo:
            info["topology"] = topo
    return {k: v for k, v in info.items() if v is not None}


def software_info() -> dict[str, Any]:
    """Driver and CUDA versions where nvidia-smi can tell (seed 003 §16 "software")."""
    out: dict[str, Any] = {
        "servetune": __version__,
        "servetune_build": build_id(),
        "python": platform.python_version(),
        "os": platform.platform(terse=True),
    }
    drv = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if drv:
        out["driver"] = drv.splitlines()[0]
    smi = _run(["nvidia-smi"])
    if smi and "CUDA Version:" in smi:
        out["cuda"] = smi.split("CUDA Version:", 1)[1].split()[0]
    return out


def _pcts(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=float), [50, 95, 99]).tolist()
    return {"p50": p50, "p95": p95, "p99": p99}


def records_metrics(
    records: Sequence[RequestRecord], workload: Mapping[str, Any], slo: SLO | None
) -> Metrics:
    """The metrics of a run that never finished, from the records that reached the store,
    with its workload's warm-up, cool-down and streaming and its SLO: the one place they
    are computed, so every reader shows the same figures."""
    return compute_metrics(
        records,
        warmup_s=float(workload.get("warmup_s") or 0.0),
        cooldown_s=float(workload.get("cooldown_s") or 0.0),
        slo=slo if isinstance(slo, SLO) else None,
        stream=bool(workload.get("stream", True)),
    )


def request_distribution(
    records: Sequence[RequestRecord], metrics: Metrics | None, load: Load
) -> dict[str, Any]:
    """Seed 003 §16 "request distribution": input/output length P50/P95/P99 as measured,
    concurrency and arrival rate (offered and achieved)."""
    done = [r for r in records if r.status == RequestStatus.OK]
    out: dict[str, Any] = {
        "requests": len(records) if records or not _records_dropped(metrics) else None,
        "input_tokens": _pcts([r.input_tokens for r in records if r.input_tokens]),
        "output_tokens": _pcts([r.output_tokens for r in done]),
        "arrival": load.kind,
        "concurrency": load.concurrency,
        "rate_req_s": load.rate,
    }
    if metrics is not None:
        out.update(
            offered_req_s=metrics.offered_req_s,
            sent_req_s=metrics.sent_req_s,
            achieved_req_s=metrics.req_s,
            max_in_flight=metrics.max_in_flight,
        )
    return out


def _records_dropped(metrics: Metrics | None) -> bool:
    """Metrics measured over requests, yet none stored: a simulated tune trial keeps its
    figures but not its records (the simulator regenerates them), so its request count is
    unknown here, not 0."""
    return metrics is not None and metrics.measured > 0


def simulated_request_distribution(workload: Mapping[str, Any]) -> dict[str, Any] | None:
    """Seed 003 §16 request lengths of a simulated run that stored no records, redrawn
    from its stored workload: the simulator draws them with the workload's seed
    (`workload.materialize.materialize_columns`, the same RNG streams), so they are the
    lengths it was given. None when they cannot be redrawn without files or a tokenizer
    (datasets, traces, sessions) or the workload does not parse."""
    from servetune.errors import InputError
    from servetune.workload.materialize import materialize_columns
    from servetune.workload.spec import WorkloadSpec

    try:
        spec = WorkloadSpec.model_validate(dict(workload))
    except (ValueError, InputError):
        return None
    cols = materialize_columns(spec) if spec.sessions is None else None
    if cols is None or not len(cols):
        return None
    outs = cols.output_tokens
    return {
        "requests": len(cols),
        "input_tokens": _pcts(cols.prompt_tokens.tolist()),
        "output_tokens": _pcts(outs.tolist()) if bool((outs >= 0).all()) else None,
        "source": "workload",
    }


def _windowed_p99_cv(records: Sequence[RequestRecord], slices: int = 5) -> float | None:
    """P99 jitter: coefficient of variation of the TTFT P99 over equal time slices of
    the run (each needs >= 20 requests). Stable servers give ~0; bursts of stalls do not."""
    pts = sorted(
        (r.send_ns, t)
        for r in records
        if r.status == RequestStatus.OK and (t := request_latencies_ms(r)[0]) is not None
    )
    if len(pts) < 20 * slices:
        return None
    ttft = np.array([t for _, t in pts])
    p99s = [float(np.percentile(c, 99)) for c in np.array_split(ttft, slices)]
    mean = float(np.mean(p99s))
    return float(np.std(p99s) / mean) if mean > 0 else None


def stability(
    records: Sequence[RequestRecord],
    metrics: Metrics | None,
    cancellation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Seed 003 §16 "stability": errors by class, 5xx, OOMs, timeouts, cancellations and
    whether they freed the server, tail ratios (P99/P50) and windowed P99 jitter."""
    errs: dict[str, int] = {}
    ooms = 0
    for r in records:
        if r.status == RequestStatus.ERROR:
            errs[r.error or "unknown"] = errs.get(r.error or "unknown", 0) + 1
            detail = f"{r.error_detail or ''}".lower()
            if "out of memory" in detail or "oom" in detail.split():
                ooms += 1
    out: dict[str, Any] = {
        "errors": sum(errs.values()),
        "errors_by_class": dict(sorted(errs.items())),
        "http_5xx": errs.get("http_5xx", 0),
        "timeouts": sum(v for k, v in errs.items() if k.endswith("timeout")),
        "ooms": ooms,
        "cancelled": sum(r.status == RequestStatus.CANCELLED for r in records),
        "cancellation_freed": (cancellation or {}).get("freed"),
        "p99_jitter_cv": _windowed_p99_cv(records),
    }
    if metrics is not None:
        out["error_rate"] = metrics.error_rate
        for name in ("ttft_ms", "tpot_ms"):
            d = getattr(metrics, name)
            if d.p50 and d.p99 is not None:
                out[f"{name[:-3]}_p99_over_p50"] = d.p99 / d.p50
    return out


def server_summary(
    series: ServerSeries | None, telemetry: ServerSeries | None = None
) -> dict[str, Any]:
    """Peaks and means of the engine's own metrics (§16 memory / GPU util, preemptions);
    GPU memory (bytes) and utilisation (0..1) from the run's telemetry when it sampled a
    GPU (NVML or a DCGM exporter), else from the engine's series if it exports them."""
    out: dict[str, Any] = {}
    for name in (
        "kv_cache_usage",
        "requests_running",
        "requests_waiting",
        "gpu_memory_used",
        "gpu_util",
    ):
        vals = telemetry.series(name) if telemetry is not None else []
        vals = vals or (series.series(name) if series is not None else [])
        if vals:
            out[f"{name}_max"] = max(vals)
            out[f"{name}_mean"] = float(np.mean(vals))
    if series is None or not series.values:
        return out
    pre = series.deltas.get("preemptions_total")
    if pre is None:
        seen = series.series("preemptions_total")
        pre = seen[-1] - seen[0] if len(seen) > 1 else None
    if pre is not None:
        out["preemptions"] = pre
    return out
