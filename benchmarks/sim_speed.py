"""Simulator speed and memory (issue 5 targets: >= 20,000 simulated requests per wall-second
end to end, start-up included; <= 200 MB resident at 100,000 requests).

Workload: input 512 / output 256 tokens, vLLM config max_num_seqs 128 (Llama-3.1-8B on one
H100, roofline tier), all requests at t=0 and Poisson at ~95% of the capacity measured by the
t=0 run. Each case runs in a fresh process so start-up (imports, catalogs, planner) and peak
RSS are its own; "end to end" is `simulate()` returning its RunResult with metrics, timed
from the first servetune import. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/sim_speed.py [--n 10000] [--big 100000]
"""

from __future__ import annotations

import argparse
import json
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

    arrival = {"kind": "poisson", "rate": rate} if rate else {"kind": "constant", "rate": 1e12}
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
    res, sched = simulate(model, hw, cfg, spec)
    t2 = time.perf_counter()
    sim = res.target["sim"]
    return {
        "n": n,
        "rate": rate,
        "startup_s": t1 - t0,
        "phases_s": sim["phases_s"],
        "total_s": t2 - t0,
        "completed": res.metrics.completed,
        "simulated_req_s": res.metrics.completed / max(res.duration_s, 1e-9),
        "steps": sim["steps"],
        "jumps": sim["jumps"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def spawn(n: int, rate: float | None) -> dict:
    args = [sys.executable, __file__, "--child", str(n), str(rate or 0)]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def show(label: str, r: dict) -> None:
    ph = r["phases_s"]
    parts = [f"start-up {r['startup_s']:.2f}"] + [f"{k} {v:.2f}" for k, v in ph.items()]
    print(
        f"{label:26s} {r['n'] / r['total_s']:9,.0f} req/s end to end "
        f"({r['n'] / ph['loop']:9,.0f} in the loop) | {r['total_s']:.2f} s = "
        + " + ".join(parts)
        + f" | peak RSS {r['peak_rss_mb']:.0f} MB | {r['steps']:,} steps, {r['jumps']:,} jumps"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(case(int(sys.argv[2]), float(sys.argv[3]) or None)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=100_000)
    a = ap.parse_args()
    burst = spawn(a.n, None)
    show(f"{a.n:,} at t=0", burst)
    rate = 0.95 * burst["simulated_req_s"]
    show(f"{a.n:,} Poisson {rate:.1f}/s", spawn(a.n, rate))
    if a.big:
        show(f"{a.big:,} at t=0", spawn(a.big, None))
        show(f"{a.big:,} Poisson {rate:.1f}/s", spawn(a.big, rate))


if __name__ == "__main__":
    main()
