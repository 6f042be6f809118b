"""Simulator speed and memory (targets: >= 20,000 simulated requests per wall-second
end to end, start-up included; <= 200 MB resident at 100,000 requests).

Workload: input 512 / output 256 tokens, vLLM config max_num_seqs 128 (Llama-3.1-8B on one
H100, the gpu tier by default, --tier roofline for the other), all requests at t=0 and
Poisson at ~95% of the capacity measured by the t=0 run. Each case runs in a fresh process
so start-up (imports, catalogs, planner) and peak RSS are its own; "end to end" is
`simulate()` returning its RunResult with metrics, timed from the first servetune import.
Children run on one core (the target's condition; BLAS held to one thread) with Python's
bytecode cache on, as for an installed package: a warm-up child writes it first
(PYTHONDONTWRITEBYTECODE=1 would make every run recompile servetune's modules, ~0.07 s
here). Each case runs --repeat times; the median end-to-end run is shown, with the range,
because this host's speed drifts. Prints figures; asserts nothing.

With --instructions (needs valgrind) each 10,000-request case also runs once under
callgrind, which counts the instructions the process executed: the same count for the same
code and inputs whatever else the host is doing, so two versions compare exactly where
wall time drifts.

    .venv/bin/python benchmarks/sim_speed.py [--n 10000] [--big 100000] [--repeat 5]
        [--instructions] [--tier gpu|roofline]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time


def case(n: int, rate: float | None) -> dict:
    t0 = time.perf_counter()
    import resource

    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.workload.spec import parse_workload

    arrival = {"kind": "poisson", "rate": rate} if rate else {"kind": "constant", "rate": 1e9}
    spec = parse_workload(
        {
            "input_tokens": {"dist": "fixed", "value": 512},
            "output_tokens": {"dist": "fixed", "value": 256},
            "count": n,
            "arrival": arrival,
        }
    )
    model, hw = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    cfg = EngineConfig(max_num_seqs=128, max_model_len=4096)
    t1 = time.perf_counter()
    # --tier reaches the child through the environment (None: the default tier for the GPU)
    res, sched = simulate(model, hw, cfg, spec, tier=os.environ.get("SIM_SPEED_TIER") or None)
    t2 = time.perf_counter()
    sim = res.target.sim
    return {
        "n": n,
        "rate": rate,
        "startup_s": t1 - t0,
        "phases_s": sim.phases_s,
        "total_s": t2 - t0,
        "completed": res.metrics.completed,
        "simulated_req_s": res.metrics.completed / max(res.duration_s, 1e-9),
        "steps": sim.steps,
        "jumps": sim.jumps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def spawn(n: int, rate: float | None, repeat: int) -> list[dict]:
    args = [sys.executable, __file__, "--child", str(n), str(rate or 0)]
    runs = []
    for _ in range(repeat):
        out = subprocess.run(args, capture_output=True, text=True, check=True, env=child_env())
        runs.append(json.loads(out.stdout))
    return sorted(runs, key=lambda r: r["total_s"])


def instructions(n: int, rate: float | None) -> int:
    """Instructions the whole child process executed (valgrind callgrind's total)."""
    args = [sys.executable, __file__, "--child", str(n), str(rate or 0)]
    vg = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    out = subprocess.run(vg + args, capture_output=True, text=True, check=True, env=child_env())
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError("valgrind printed no instruction count")
    return int(found.group(1))


def show_instructions(label: str, n: int, rate: float | None) -> None:
    total, start = instructions(n, rate), instructions(1, rate)
    print(
        f"{label:26s} {total / 1e6:9,.0f} M instructions, of which {start / 1e6:,.0f} M "
        f"start-up (a 1-request run): {(total - start) / n:,.0f} per simulated request"
    )


def show(label: str, runs: list[dict]) -> None:
    r = runs[len(runs) // 2]
    ph = r["phases_s"]
    lo, hi = r["n"] / runs[-1]["total_s"], r["n"] / runs[0]["total_s"]
    parts = [f"start-up {r['startup_s']:.2f}"] + [f"{k} {v:.2f}" for k, v in ph.items()]
    print(
        f"{label:26s} {r['n'] / r['total_s']:9,.0f} req/s end to end "
        f"[{lo:,.0f}..{hi:,.0f}, n={len(runs)}] "
        f"({r['n'] / ph['loop']:9,.0f} in the loop) | {r['total_s']:.2f} s = "
        + " + ".join(parts)
        + f" | peak RSS {r['peak_rss_mb']:.0f} MB | {r['steps']:,} steps, {r['jumps']:,} jumps"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(json.dumps(case(int(sys.argv[2]), float(sys.argv[3]) or None)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--instructions", action="store_true", help="Also count instructions.")
    ap.add_argument("--tier", choices=("gpu", "roofline"), help="Step-time tier (default: gpu).")
    a = ap.parse_args()
    if a.tier:
        os.environ["SIM_SPEED_TIER"] = a.tier
    if a.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind (apt-get install valgrind)")
    spawn(100, None, 1)  # warm-up: writes the bytecode cache
    burst = spawn(a.n, None, a.repeat)
    show(f"{a.n:,} at t=0", burst)
    rate = 0.95 * burst[len(burst) // 2]["simulated_req_s"]
    show(f"{a.n:,} Poisson {rate:.1f}/s", spawn(a.n, rate, a.repeat))
    if a.instructions:
        show_instructions(f"{a.n:,} at t=0", a.n, None)
        show_instructions(f"{a.n:,} Poisson {rate:.1f}/s", a.n, rate)
    if a.big:
        show(f"{a.big:,} at t=0", spawn(a.big, None, 1))
        show(f"{a.big:,} Poisson {rate:.1f}/s", spawn(a.big, rate, 1))


if __name__ == "__main__":
    main()
