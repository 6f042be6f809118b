"""Simulator speed and memory (issue 5 targets: >= 20,000 simulated requests per wall-second
end to end, start-up included; <= 200 MB resident at 100,000 requests).

Workload: input 512 / output 256 tokens, vLLM config max_num_seqs 128 (Llama-3.1-8B on one
H100, roofline tier), all requests at t=0 and Poisson at ~95% of the capacity measured by the
t=0 run. Each case runs in a fresh process so start-up (imports, planner, materialisation)
and peak RSS are its own. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/sim_speed.py [--n 10000] [--big 100000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def case(n: int, rate: float | None, full: bool) -> dict:
    t0 = time.perf_counter()
    import resource

    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.metrics.compute import compute_metrics
    from servetune.model import get_model
    from servetune.sim.engine import materialize_for_sim, records_from, run_sim, setup
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
    su = setup(
        get_model("llama-3.1-8b"),
        get_hardware("h100-sxm"),
        EngineConfig(max_num_seqs=128, max_model_len=4096),
    )
    t1 = time.perf_counter()
    reqs = materialize_for_sim(spec)
    t2 = time.perf_counter()
    sched, _ = run_sim(su, reqs, spec)
    t3 = time.perf_counter()
    out = {"n": n, "rate": rate, "startup_s": t1 - t0, "materialize_s": t2 - t1}
    out["loop_s"] = t3 - t2
    sim_req_s = len(sched.done) / max(sched.step_end_s[-1], 1e-9)
    if full:
        recs = records_from(sched)
        t4 = time.perf_counter()
        compute_metrics(recs)
        t5 = time.perf_counter()
        out.update(records_s=t4 - t3, metrics_s=t5 - t4)
    out["total_s"] = time.perf_counter() - t0
    out["simulated_req_s"] = sim_req_s
    out["steps"], out["jumps"] = sched.stats.steps, sched.stats.jumps
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def spawn(n: int, rate: float | None, full: bool) -> dict:
    args = [sys.executable, __file__, "--child", str(n), str(rate or 0), str(int(full))]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def show(label: str, r: dict) -> None:
    parts = [f"start-up {r['startup_s']:.2f}", f"materialise {r['materialize_s']:.2f}"]
    parts.append(f"loop {r['loop_s']:.2f}")
    if "records_s" in r:
        parts += [f"records {r['records_s']:.2f}", f"metrics {r['metrics_s']:.2f}"]
    print(
        f"{label:34s} {r['n'] / r['total_s']:9,.0f} req/s end to end "
        f"({r['n'] / r['loop_s']:9,.0f} in the loop) | {r['total_s']:.2f} s = "
        + " + ".join(parts)
        + f" | peak RSS {r['peak_rss_mb']:.0f} MB | {r['steps']:,} steps, {r['jumps']:,} jumps"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        n, rate, full = int(sys.argv[2]), float(sys.argv[3]) or None, sys.argv[4] == "1"
        print(json.dumps(case(n, rate, full)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=100_000)
    a = ap.parse_args()
    burst = spawn(a.n, None, True)
    show(f"{a.n:,} at t=0 (RunResult+metrics)", burst)
    rate = 0.95 * burst["simulated_req_s"]
    show(f"{a.n:,} Poisson {rate:.1f}/s", spawn(a.n, rate, True))
    show(f"{a.n:,} Poisson, loop only", spawn(a.n, rate, False))
    if a.big:
        show(f"{a.big:,} Poisson, loop only", spawn(a.big, rate, False))
        show(f"{a.big:,} Poisson (RunResult+metrics)", spawn(a.big, rate, True))


if __name__ == "__main__":
    main()
