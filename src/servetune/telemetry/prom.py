"""Any Prometheus endpoint given by URL (`--telemetry-url`): a DCGM exporter, a node
exporter, another engine. DCGM's GPU fields are mapped to the same names NVML fills
(docs/telemetry.md), combined over GPUs the same way; every other sample is kept under
`url:<name>` (summed over label sets), at most MAX_RAW of them.

DCGM field units: NVIDIA DCGM exporter's default counters (dcp-metrics-included.csv):
FB_USED MiB, GPU_UTIL percent, GPU_TEMP C, POWER_USAGE W, SM_CLOCK MHz, XID_ERRORS the
last XID value (not a count: it is kept as-is under gpu_xid_last).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from servetune.engines.metrics import parse

MAX_RAW = 300

# DCGM name -> (canonical name, how GPUs combine, scale to the canonical unit)
DCGM = {
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used", "sum", 1024.0 * 1024.0),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", "mean", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_mem_bw_util", "mean", 0.01),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temp_c", "max", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_w", "sum", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_mhz", "min", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("gpu_xid_last", "max", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("gpu_ecc_uncorrected", "sum", 1.0),
}
_COMBINE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "mean": lambda xs: sum(xs) / len(xs),
    "max": max,
    "min": min,
}


def map_exposition(text: str) -> dict[str, float]:
    """Prometheus text -> canonical GPU names (from DCGM fields) plus `url:<name>` raw sums.

    NaN and ±Inf samples are dropped: the exposition format allows them (a Go summary's
    quantiles before any observation are NaN), but a stored series must hold numbers.
    """
    out: dict[str, float] = {}
    raw = 0
    for name, samples in parse(text).items():
        vals = [v for _, v in samples if math.isfinite(v)]
        if not vals:
            continue
        field = _dcgm_field(name)
        if field is not None:
            canon, how, scale = DCGM[field]
            out[canon] = _COMBINE[how](vals) * scale
            if canon == "gpu_util":
                out["gpu_count"] = float(len(vals))
        elif raw < MAX_RAW and not name.endswith(("_bucket", "_created")):
            out[f"url:{name}"] = sum(vals)
            raw += 1
    return out


def _dcgm_field(name: str) -> str | None:
    """The DCGM field a sample belongs to. dcgm-exporter declares some fields counters, and
    prometheus-client's parser then names their samples `<field>_total`."""
    for candidate in (name, name.removesuffix("_total")):
        if candidate in DCGM:
            return candidate
    return None


class PromSource:
    name = "url"

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        import httpx

        self.url = url
        self.client = httpx.Client(timeout=timeout_s)

    def read(self) -> dict[str, float]:
        r = self.client.get(self.url)
        r.raise_for_status()
        return map_exposition(r.text)

    def close(self) -> None:
        self.client.close()
