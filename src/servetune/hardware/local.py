"""`local`: this machine's CPU as a HardwareSpec, measured rather than assumed.

Why: the catalog's `cpu-host` describes a generic 16-core server; on a 2-core VM the
roofline tier then predicts llama.cpp 3-13x faster than it runs, and the tuner's
simulated ranking is meaningless. `local` reads the core count (the CPUs this process may
run on), memory and instruction-set flags from Linux, and measures two numbers once
(cached under the servetune cache, keyed by CPU model and core count):

- memory bandwidth: one copy thread per core over arrays far larger than the caches,
  bytes read + written / time (the STREAM "copy" kernel, McCalpin 1995), best of 3;
- fp32 FLOP/s: numpy's BLAS sgemm on 2048^2 matrices, 2 n^3 / time, best of 3.

Other dtypes are scaled from fp32 by vector width per cycle: AVX512-BF16 (VDPBF16PS) does
2 bf16 multiply-adds per fp32 lane, VNNI (VPDPBUSD) 4 int8 ones (Intel Intrinsics Guide);
without those, bf16 and int8 run at the fp32 rate. The figures are achievable, not
datasheet, peaks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from servetune.hardware.spec import HardwareSpec

LOCAL_NAMES = ("local", "this-host")
_COPY_BYTES = 128 * 2**20  # per thread: far beyond any L3 slice


def cpu_facts() -> dict[str, object]:
    """Cores this process may use, CPU model, flags and memory (Linux /proc)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover - not Linux
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) * 1024 / 2**30
    except OSError:  # pragma: no cover
        mem_gib = 8.0
    return {"cores": cores, "model": model, "flags": sorted(flags), "memory_gib": mem_gib}


def measure_bandwidth_gbs(threads: int, repeats: int = 3) -> float:
    """STREAM-copy bandwidth with one thread per core (numpy releases the GIL in copies)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = _COPY_BYTES // 8
    pairs = [(np.ones(n), np.empty(n)) for _ in range(threads)]
    for a, b in pairs:  # touch every page before timing
        np.copyto(b, a)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(lambda ab: np.copyto(ab[1], ab[0]), pairs))
            best = min(best, time.perf_counter() - t0)
    return 2 * _COPY_BYTES * threads / best / 1e9


def measure_fp32_tflops(n: int = 2048, repeats: int = 3) -> float:
    """sgemm FLOP/s through numpy's BLAS (all cores)."""
    import numpy as np

    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    a @ a  # warm-up: BLAS threads and page faults
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def local_hardware(cache_dir: Path | None = None) -> HardwareSpec:
    """This machine as a HardwareSpec (measured once, then read from the cache)."""
    facts = cpu_facts()
    key = f"{facts['model']}|{facts['cores']}"
    path = _cache_file(cache_dir)
    cached = _read(path)
    if cached.get("key") == key:
        bw, fp32 = float(cached["bandwidth_gbs"]), float(cached["fp32_tflops"])
    else:
        bw = measure_bandwidth_gbs(int(facts["cores"]))  # type: ignore[arg-type]
        fp32 = measure_fp32_tflops()
        _write(path, {"key": key, "bandwidth_gbs": bw, "fp32_tflops": fp32, "facts": facts})
    flags = set(facts["flags"])  # type: ignore[arg-type]
    vnni = bool(flags & {"avx512_vnni", "avx_vnni"})
    tflops = {
        "fp32": fp32,
        "bf16": fp32 * (2 if "avx512_bf16" in flags else 1),
        "int8": fp32 * (4 if vnni else 1),
    }
    return HardwareSpec(
        name="local",
        display_name=f"This host: {facts['model']} ({facts['cores']} cores)",
        vendor="local",
        kind="cpu",
        memory_gib=max(float(facts["memory_gib"]), 0.5),  # type: ignore[arg-type]
        memory_bandwidth_gbs=bw,
        tflops=tflops,  # type: ignore[arg-type]
        devices_per_node=1,
        cores=int(facts["cores"]),  # type: ignore[arg-type]
        interconnect="none",
        interconnect_gbs=0,
        node_interconnect_gbs=0,
        source=(
            f"measured on this host ({path}): STREAM-copy {bw:.1f} GB/s with "
            f"{facts['cores']} threads, numpy sgemm {fp32 * 1000:.0f} GFLOP/s"
        ),
    )


def _cache_file(cache_dir: Path | None) -> Path:
    from servetune.paths import cache_root

    return (cache_dir or cache_root()) / "hardware-local.json"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
