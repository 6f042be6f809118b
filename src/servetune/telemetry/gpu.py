"""GPU samples from NVML (nvidia-ml-py, the `gpu` extra, imported only here): memory,
utilisation, temperature, power, SM clock against its maximum, clock-throttle reasons,
uncorrected ECC errors and XID events. Several GPUs are combined: memory and power
summed, utilisation averaged, temperature the hottest, the SM clock the slowest.

Field meanings: NVIDIA's NVML API reference (nvmlDeviceGetUtilizationRates: percent of
the sample period a kernel ran; nvmlDeviceGetTotalEccErrors volatile = since the driver
loaded; XID events from nvmlEventSetWait with nvmlEventTypeXidCriticalError).
"""

from __future__ import annotations

import contextlib
from typing import Any

# Throttle reasons that mean "slowed by heat or power", not "idle" or "app clocks set"
# (NVML nvmlClocksThrottleReasons*: SwPowerCap 0x4, HwSlowdown 0x8, SwThermal 0x20,
# HwThermal 0x40, HwPowerBrake 0x80).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def open_gpu() -> tuple[GpuSource | None, str | None]:
    """An NVML source, or None, and a one-line note of what is left out (the whole source
    or the GPUs whose handle NVML cannot open): the run goes on either way."""
    try:
        import pynvml
    except ImportError:
        return None, "GPU: nvidia-ml-py not installed (pip install 'servetune[gpu]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"GPU: no NVML on this host ({exc})"
    try:
        n = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        _shutdown(pynvml)
        return None, f"GPU: no NVML on this host ({exc})"
    if n == 0:
        _shutdown(pynvml)
        return None, "GPU: NVML sees no GPU"
    src = GpuSource(pynvml, n)
    if not src.handles:
        src.close()
        return None, f"GPU: no GPU handle could be opened ({'; '.join(src.skipped)})"
    if src.skipped:
        return src, f"GPU: left out {'; '.join(src.skipped)}"
    return src, None


def _shutdown(nvml: Any) -> None:
    """nvmlShutdown after nvmlInit succeeded, best effort (NVML counts its inits)."""
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


class GpuSource:
    name = "nvml"

    def __init__(self, nvml: Any, count: int) -> None:
        self.nvml = nvml
        self.handles: list[Any] = []
        self.skipped: list[str] = []  # "GPU i (NVML's reason)" for each handle NVML refused
        for i in range(count):
            try:
                self.handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
            except nvml.NVMLError as exc:  # e.g. GPU lost, or the container lost the device
                self.skipped.append(f"GPU {i} ({exc})")
        self.xid = 0
        self.events: Any = None
        if not self.handles:
            return
        try:
            self.events = nvml.nvmlEventSetCreate()
            for h in self.handles:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self.events)
        except nvml.NVMLError:
            self.events = None  # XIDs need root on some drivers: the rest still samples

    def _each(self, fn: Any, *args: Any) -> list[float]:
        out = []
        for h in self.handles:
            try:
                out.append(float(fn(h, *args)))
            except self.nvml.NVMLError:
                continue
        return out

    def read(self) -> dict[str, float]:
        nv = self.nvml
        out: dict[str, float] = {"gpu_count": float(len(self.handles))}
        used, total, util, mem_util = [], [], [], []
        for h in self.handles:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h)
                used.append(m.used)
                total.append(m.total)
            except nv.NVMLError:
                pass
            try:  # its own try: NOT_SUPPORTED on MIG-enabled GPUs, where memory still reads
                u = nv.nvmlDeviceGetUtilizationRates(h)
                util.append(u.gpu / 100.0)
                mem_util.append(u.memory / 100.0)
            except nv.NVMLError:
                pass
        if used:
            out["gpu_memory_used"] = float(sum(used))
            out["gpu_memory_total"] = float(sum(total))
        if util:
            out["gpu_util"] = sum(util) / len(util)
            out["gpu_mem_bw_util"] = sum(mem_util) / len(mem_util)
        temp = self._each(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        if temp:
            out["gpu_temp_c"] = max(temp)
        power = self._each(nv.nvmlDeviceGetPowerUsage)  # milliwatts
        if power:
            out["gpu_power_w"] = sum(power) / 1000.0
        sm = self._each(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        sm_max = self._each(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM)
        if sm and sm_max:
            out["gpu_sm_clock_mhz"] = min(sm)
            out["gpu_sm_clock_max_mhz"] = min(sm_max)
        reasons = self._each(nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        if reasons:
            out["gpu_throttled"] = float(any(int(r) & THROTTLE_MASK for r in reasons))
        ecc = self._each(
            nv.nvmlDeviceGetTotalEccErrors,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        if ecc:
            out["gpu_ecc_uncorrected"] = sum(ecc)
        if self.events is not None:
            while True:
                try:
                    nv.nvmlEventSetWait(self.events, 0)
                except nv.NVMLError:
                    break  # timeout: no event pending
                self.xid += 1
            out["gpu_xid_total"] = float(self.xid)
        return out

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
