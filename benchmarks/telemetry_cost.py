"""What sampling telemetry costs: the sampler thread's CPU time per second of wall time,
median of `--reps` runs, against the < 1% of a core budget (docs/telemetry.md).

Each run samples this host (per-core CPU, memory), a stand-in engine process tree (a
child process running `--threads` threads, so the per-thread schedstat reads cost what
they cost on an engine; vLLM-CPU runs ~40) and NVML when a GPU exists, every
`--interval` seconds for `--seconds`. Cost = the sampler's own thread CPU time
(time.thread_time around every sample) / wall time. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/telemetry_cost.py [--reps 5] [--seconds 10] [--threads 40]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ENGINE = """
import threading, time
for _ in range({n}):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
time.sleep(3600)
"""


def one_run(pid: int, seconds: float, interval_s: float) -> tuple[float, int, list[str]]:
    from servetune.telemetry import start_sampler

    t0 = time.monotonic()
    import psutil

    def tree() -> set[int]:  # the process tree under the engine, as an engine's pids() lists it
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}

    s = start_sampler(tree, interval_s=interval_s)
    time.sleep(seconds)
    series = s.stop(time.monotonic_ns())
    wall = time.monotonic() - t0
    return series.sampler_cpu_s / wall, len(series.values), series.sources


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=40)
    a = ap.parse_args()
    child = subprocess.Popen([sys.executable, "-c", ENGINE.format(n=a.threads)])
    try:
        time.sleep(1.0)
        costs = []
        for i in range(a.reps):
            cost, n, sources = one_run(child.pid, a.seconds, a.interval)
            costs.append(cost)
            print(f"run {i + 1}: {cost * 100:.3f}% of a core ({n} samples, sources {sources})")
    finally:
        child.kill()
        child.wait()
    med = statistics.median(costs)
    print(
        f"sampler CPU per wall second: median {med * 100:.3f}% of a core"
        f" (min {min(costs) * 100:.3f}%, max {max(costs) * 100:.3f}%),"
        f" interval {a.interval:g} s, engine tree of {a.threads + 1} threads;"
        f" budget 1% -> {'within' if med < 0.01 else 'OVER'}"
    )


if __name__ == "__main__":
    main()
