"""`local`: this machine's CPU as a HardwareSpec, measured rather than assumed.

Why: the catalog's `cpu-host` describes a generic 16-core server; on a 2-core VM the
roofline tier then predicts llama.cpp 3-13x faster than it runs, and the tuner's
simulated ranking is meaningless. `local` reads the core count (the CPUs this process may
run on), memory and instruction-set flags from Linux, and measures two rates, each as
several short samples of which the best is kept (other work on the host only ever lowers
a rate, so the best sample is the closest to what the machine can do):

- memory bandwidth: one copy thread per core over arrays far larger than the caches,
  bytes read + written / time (the STREAM "copy" kernel, McCalpin 1995);
- fp32 FLOP/s: numpy's BLAS sgemm on 2048^2 matrices, 2 n^3 / time.

The result is cached under the servetune cache, keyed by CPU model and core count, with
its spread (min/median/max, number of samples) and date. It is measured again when the
entry is older than `MAX_AGE_DAYS`, when it was noisy (samples disagreeing, best/median
above `NOISY_RATIO`, or a host already busy, load per CPU at `BUSY_LOAD_PER_CPU`: one busy
moment must not be trusted forever), when asked (`plan
--remeasure`, `SERVETUNE_REMEASURE=1` for any command), or when a caller with real runs
found the host faster than the cached figures allow (`host_disagrees`, then
`mark_for_remeasure`).

Other dtypes are scaled from fp32 by vector width per cycle: AVX512-BF16 (VDPBF16PS) does
2 bf16 multiply-adds per fp32 lane, VNNI (VPDPBUSD) 4 int8 ones (Intel Intrinsics Guide);
without those, bf16 and int8 run at the fp32 rate. The figures are achievable, not
datasheet, peaks.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.paths import cache_root
from servetune.procfs import usable_cores

LOCAL_NAMES = ("local", "this-host")
_COPY_BYTES = 128 * 2**20  # per thread: far beyond any L3 slice
MAX_AGE_DAYS = 7.0  # a host's figures drift (firmware, kernel, VM moves); re-check weekly
# best/median above this: the samples disagree so much that the host was busy while they
# were taken, and the best of them may still be well under the quiet-host figure
NOISY_RATIO = 1.5
# the 1-minute load average per CPU at or above this when measuring started: every CPU
# already had a runnable task, so the samples only got a share of the machine, however
# well they agree
BUSY_LOAD_PER_CPU = 1.0
# a real step must beat the roofline bound by more than this to count as proof: streamed
# chunk timestamps carry scheduler and network jitter of a few percent
DISAGREE_MARGIN = 0.10
REMEASURE_ENV = "SERVETUNE_REMEASURE"
_MIN_SAMPLES = 3  # a median needs three


@dataclass(frozen=True)
class Spread:
    """Repeated samples of one rate; `best` (the max) is the figure used."""

    min: float
    median: float
    max: float
    n: int

    def __post_init__(self) -> None:
        if not (0 < self.min <= self.median <= self.max and self.n >= 1):
            raise ValueError(f"not a spread of positive rates: {self}")

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no samples")
        return cls(min(values), statistics.median(values), max(values), len(values))

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Spread:
        return cls(
            float(data["min"]),  # type: ignore[arg-type]
            float(data["median"]),  # type: ignore[arg-type]
            float(data["max"]),  # type: ignore[arg-type]
            int(data["n"]),  # type: ignore[call-overload]
        )

    @property
    def best(self) -> float:
        return self.max

    @property
    def ratio(self) -> float:
        """best / median: 1.0 when every sample agrees."""
        return self.max / self.median


@dataclass(frozen=True)
class HostMeasurement:
    """One measuring of this host, as cached."""

    key: str  # "CPU model|cores": another CPU is measured afresh
    measured_at: float  # unix seconds
    bandwidth_gbs: Spread
    fp32_tflops: Spread
    load_per_cpu: float | None = None  # 1-minute load average / CPUs, before sampling
    because: str | None = None  # why it was measured (`remeasure_reason`)

    def noisy_reasons(self) -> list[str]:
        """Why the samples cannot be trusted (empty when they agree on an idle host)."""
        reasons = [
            f"{name} best/median {s.ratio:.2f} > {NOISY_RATIO}"
            for name, s in (("bandwidth", self.bandwidth_gbs), ("sgemm", self.fp32_tflops))
            if s.ratio > NOISY_RATIO
        ]
        if self.load_per_cpu is not None and self.load_per_cpu >= BUSY_LOAD_PER_CPU:
            reasons.append(f"host busy: load {self.load_per_cpu:.2f} per CPU")
        return reasons

    @property
    def noisy(self) -> bool:
        return bool(self.noisy_reasons())

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "measured_at": self.measured_at,
            "bandwidth_gbs": self.bandwidth_gbs.best,
            "fp32_tflops": self.fp32_tflops.best,
            "bandwidth_gbs_spread": asdict(self.bandwidth_gbs),
            "fp32_tflops_spread": asdict(self.fp32_tflops),
            "load_per_cpu": self.load_per_cpu,
            "noisy": self.noisy,
            "because": self.because,
        }

    @classmethod
    def from_json(cls, entry: Mapping[str, object]) -> HostMeasurement:
        """Raises KeyError/TypeError/ValueError on an entry from an older servetune."""
        load = entry.get("load_per_cpu")
        return cls(
            key=str(entry["key"]),
            measured_at=float(entry["measured_at"]),  # type: ignore[arg-type]
            bandwidth_gbs=Spread.from_json(entry["bandwidth_gbs_spread"]),  # type: ignore[arg-type]
            fp32_tflops=Spread.from_json(entry["fp32_tflops_spread"]),  # type: ignore[arg-type]
            load_per_cpu=None if load is None else float(load),  # type: ignore[arg-type]
            because=str(entry["because"]) if entry.get("because") else None,
        )


def cpu_facts() -> dict[str, object]:
    """Cores this process may use, CPU model, flags and memory (Linux /proc)."""
    cores = usable_cores()
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
    limit = cgroup_memory_limit_bytes()
    if limit is not None:  # a container's limit, below the host's MemTotal
        mem_gib = min(mem_gib, limit / 2**30) if mem_gib else limit / 2**30
    return {"cores": cores, "model": model, "flags": sorted(flags), "memory_gib": mem_gib}


# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value
# (9223372036854771712 on 4 KiB pages); anything at or above 2^62 is read as none.
_NO_LIMIT = 2**62


def cgroup_memory_limit_bytes(
    root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """The memory limit of this process's cgroup, the smallest along its path to the root
    (a parent's limit binds its children): cgroup v2 `memory.max` ("max": none), else v1
    `memory/memory.limit_in_bytes` (Linux admin-guide cgroup-v2.rst and cgroup-v1/memory.rst).
    None when no limit is set or none can be read: MemTotal (the host's RAM) stands."""
    try:
        entries = [ln.split(":", 2) for ln in self_cgroup.read_text().splitlines()]
    except OSError:
        entries = []
    # /proc/self/cgroup: "hierarchy-id:controllers:path"; v2's line is "0::<path>"
    v2 = next((e[2] for e in entries if len(e) == 3 and e[0] == "0" and not e[1]), "/")
    v1 = next((e[2] for e in entries if len(e) == 3 and "memory" in e[1].split(",")), "/")
    limits = []
    for base, rel, name in (
        (root, v2, "memory.max"),
        (root / "memory", v1, "memory.limit_in_bytes"),
    ):
        here = base.joinpath(rel.strip("/")) if rel.strip("/") else base
        while True:  # the process's cgroup, then each parent up to the mount point
            limits.append(_read_limit(here / name))
            if here == base or base not in here.parents:
                break
            here = here.parent
    found = [v for v in limits if v is not None]
    return min(found) if found else None


def _read_limit(path: Path) -> int | None:
    """One cgroup memory limit file: bytes, or None for "max", an unlimited v1 value, an
    absent or unreadable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max" (v2: no limit)
    value = int(text)
    return value if 0 < value < _NO_LIMIT else None


# --------------------------------------------------------------------------- sampling


def sample_best(
    sample: Callable[[], float],
    *,
    max_n: int,
    budget_s: float,
    min_n: int = _MIN_SAMPLES,
    clock: Callable[[], float] = time.perf_counter,
) -> Spread:
    """Call `sample` (one rate per call) at least `min_n` times, then until `max_n` samples
    or `budget_s` seconds: several short samples, so one busy moment does not set the
    figure, within a fixed cost."""
    values: list[float] = []
    start = clock()
    while len(values) < max_n and (len(values) < min_n or clock() - start < budget_s):
        values.append(sample())
    return Spread.of(values)


@contextmanager
def copy_bandwidth_sampler(threads: int) -> Iterator[Callable[[], float]]:
    """One STREAM-copy pass over all threads per call, in GB/s (numpy releases the GIL in
    copies). The arrays are allocated and every page touched once, before any timing."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = _COPY_BYTES // 8
    pairs = [(np.ones(n), np.empty(n)) for _ in range(threads)]
    for a, b in pairs:
        np.copyto(b, a)
    with ThreadPoolExecutor(threads) as pool:

        def one_pass() -> float:
            t0 = time.perf_counter()
            list(pool.map(lambda ab: np.copyto(ab[1], ab[0]), pairs))
            # STREAM copy: each byte is read once and written once
            return 2 * _COPY_BYTES * threads / (time.perf_counter() - t0) / 1e9

        yield one_pass


def sgemm_sampler(n: int = 2048) -> Callable[[], float]:
    """One n x n sgemm through numpy's BLAS (all cores) per call, in TFLOP/s."""
    import numpy as np

    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)  # warm-up: BLAS threads and page faults

    def one_product() -> float:
        t0 = time.perf_counter()
        np.matmul(a, a, out=out)
        return 2 * n**3 / (time.perf_counter() - t0) / 1e12  # n^3 multiply-adds

    return one_product


def measure_host(cores: int) -> tuple[Spread, Spread, float | None]:
    """Bandwidth (GB/s) and sgemm rate (TFLOP/s), sampled now, and the load per CPU they
    were sampled under. The budgets keep it to ~1-1.5 s on an idle 2-core host (at 29.6
    GB/s and 0.27 TFLOP/s a copy pass takes 18 ms, an sgemm 64 ms); a busy host takes
    longer."""
    load = _load_per_cpu()
    with copy_bandwidth_sampler(cores) as copy_pass:
        bandwidth = sample_best(copy_pass, max_n=10, budget_s=0.5)
    fp32 = sample_best(sgemm_sampler(), max_n=8, budget_s=1.0)
    return bandwidth, fp32, load


# --------------------------------------------------------------------------- trust


def remeasure_reason(
    entry: Mapping[str, object], key: str, now: float, max_age_days: float = MAX_AGE_DAYS
) -> str | None:
    """Why a cache entry must be measured again, or None when it can be used."""
    if not entry:
        return "not measured yet"
    if entry.get("key") != key:
        return f"the cache is for another CPU ({entry.get('key')})"
    if entry.get("stale"):
        return str(entry["stale"])
    try:
        cached = HostMeasurement.from_json(entry)
    except (KeyError, TypeError, ValueError):
        return "the cache holds a single-sample measurement from an older servetune"
    age_days = (now - cached.measured_at) / 86400
    if age_days > max_age_days:
        return f"measured {age_days:.1f} days ago (limit {max_age_days:g})"
    if age_days < 0:
        return "measured in the future (the clock changed)"
    if cached.noisy:
        return "the last measurement was noisy (" + "; ".join(cached.noisy_reasons()) + ")"
    return None


def host_disagrees(
    predicted_ms: float, measured_ms: float, margin: float = DISAGREE_MARGIN
) -> bool:
    """True when a real run beat the roofline bound computed from the cached figures by
    more than `margin`: the bound is a floor (seed 000 §4.2: a step cannot move its bytes
    faster than the bandwidth allows), so a faster real step proves the cache is low.
    Typical use: a decode step's P50 against `tpot_lower_bound_ms`, then
    `mark_for_remeasure` when this returns True."""
    for name, value in (("predicted_ms", predicted_ms), ("measured_ms", measured_ms)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise InputError(name, f"must be a positive time in ms, got {value!r}")
    if not 0 <= margin < 1:
        raise InputError("margin", f"must be in [0, 1), got {margin!r}", "e.g. 0.1 for 10%")
    return measured_ms < predicted_ms * (1 - margin)


def mark_for_remeasure(reason: str, cache_dir: Path | None = None) -> None:
    """Keep the cached figures for now but make the next run measure again, saying why."""
    path = _cache_file(cache_dir)
    entry = _read(path)
    if entry:
        _write(path, {**entry, "stale": reason})


def request_remeasure(gpu: str, cache_dir: Path | None = None) -> None:
    """`--remeasure`: the next lookup of `local` measures again; only `local` is measured
    (`gpu` as the catalog normalizes names)."""
    if gpu not in LOCAL_NAMES:
        raise InputError(
            "remeasure",
            f"only --gpu local is measured, not --gpu {gpu}",
            "drop --remeasure, or use --gpu local",
        )
    mark_for_remeasure("asked with --remeasure", cache_dir)


# --------------------------------------------------------------------------- the spec


def local_hardware(
    cache_dir: Path | None = None,
    *,
    remeasure: bool = False,
    measure: Callable[[int], tuple[Spread, Spread, float | None]] | None = None,
    now: Callable[[], float] = time.time,
) -> HardwareSpec:
    """This machine as a HardwareSpec: from the cache while it can be trusted
    (`remeasure_reason`), else measured now (`measure`, by default `measure_host`) and
    cached."""
    facts = cpu_facts()
    key = f"{facts['model']}|{facts['cores']}"
    path = _cache_file(cache_dir)
    entry = _read(path)
    if remeasure or os.environ.get(REMEASURE_ENV, "") not in ("", "0"):
        because: str | None = "asked to re-measure"
    else:
        because = remeasure_reason(entry, key, now())
    if because is not None:
        measured_at = now()
        sampled = (measure or measure_host)(int(facts["cores"]))  # type: ignore[call-overload]
        host = HostMeasurement(key, measured_at, *sampled, because=because)
        _write(path, {**host.to_json(), "facts": facts})
    else:
        host = HostMeasurement.from_json(entry)
    return _spec(host, facts, path)


def measurement_behind(spec: HardwareSpec, cache_dir: Path | None = None) -> HostMeasurement | None:
    """The cached measurement a `local` spec was built from (None for any other spec)."""
    if spec.vendor != "local":
        return None
    try:
        return HostMeasurement.from_json(_read(_cache_file(cache_dir)))
    except (KeyError, TypeError, ValueError):
        return None


def report_json(host: HostMeasurement, now: float) -> dict[str, object]:
    """The measurement for `plan --json`: figures with their spread, age and doubts."""
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(host.measured_at)),
        "age_days": round(max(now - host.measured_at, 0.0) / 86400, 3),
        "max_age_days": MAX_AGE_DAYS,
        "bandwidth_gbs": asdict(host.bandwidth_gbs),
        "fp32_tflops": asdict(host.fp32_tflops),
        "load_per_cpu": host.load_per_cpu,
        "noisy": host.noisy,
        "noisy_reasons": host.noisy_reasons(),
        "because": host.because,
    }


def describe(host: HostMeasurement, now: float) -> list[str]:
    """Lines for a human: the figures with their spread, and any reason to doubt them."""
    bw, fp = host.bandwidth_gbs, host.fp32_tflops
    age_s = max(now - host.measured_at, 0.0)
    age = "just now" if age_s < 60 else f"{_age(age_s)} ago"
    because = f" because {host.because}" if host.because else ""
    lines = [
        f"Host measured {age}{because}; again after {MAX_AGE_DAYS:g} days or with --remeasure:",
        f"  STREAM-copy {bw.best:.1f} GB/s, best of {bw.n} "
        f"(min {bw.min:.1f}, median {bw.median:.1f})",
        f"  sgemm fp32 {fp.best * 1000:.0f} GFLOP/s, best of {fp.n} "
        f"(min {fp.min * 1000:.0f}, median {fp.median * 1000:.0f})",
    ]
    if host.noisy:
        lines.append(
            "  NOISY: " + "; ".join(host.noisy_reasons()) + ": other work ran while "
            "measuring, so these figures may be low; the next run measures again"
        )
    return lines


def _load_per_cpu() -> float | None:
    """The 1-minute load average per online CPU (None where the OS keeps none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def _age(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _spec(host: HostMeasurement, facts: Mapping[str, object], path: Path) -> HardwareSpec:
    bw, fp32 = host.bandwidth_gbs, host.fp32_tflops
    flags = set(facts["flags"])  # type: ignore[call-overload]
    vnni = bool(flags & {"avx512_vnni", "avx_vnni"})
    tflops = {
        "fp32": fp32.best,
        "bf16": fp32.best * (2 if "avx512_bf16" in flags else 1),
        "int8": fp32.best * (4 if vnni else 1),
    }
    return HardwareSpec(
        name="local",
        display_name=f"This host: {facts['model']} ({facts['cores']} cores)",
        vendor="local",
        kind="cpu",
        memory_gib=max(float(facts["memory_gib"]), 0.5),  # type: ignore[arg-type]
        memory_bandwidth_gbs=bw.best,
        tflops=tflops,  # type: ignore[arg-type]
        devices_per_node=1,
        cores=int(facts["cores"]),  # type: ignore[call-overload]
        interconnect="none",
        interconnect_gbs=0,
        node_interconnect_gbs=0,
        source=(
            f"measured on this host ({path}): STREAM-copy {bw.best:.1f} GB/s with "
            f"{facts['cores']} threads (best of {bw.n}, median {bw.median:.1f}), numpy sgemm "
            f"{fp32.best * 1000:.0f} GFLOP/s (best of {fp32.n}, median "
            f"{fp32.median * 1000:.0f})"
        ),
    )


def _cache_file(cache_dir: Path | None) -> Path:
    return (cache_dir or cache_root()) / "hardware-local.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
