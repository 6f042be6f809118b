"""How fast `servetune plan` answers: whole-process wall time (median of N) and the
in-process planning time, next to `servetune --help` as the start-up baseline.

Run: .venv/bin/python benchmarks/plan_speed.py [runs]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def wall(cmd: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    cli = [sys.executable, "-m", "servetune.cli.app"]
    help_s = wall([*cli, "--help"], runs)
    plan_s = wall([*cli, "plan", "--json"], runs)
    big_s = wall(
        [*cli, "plan", "--model", "deepseek-v3", "--gpu", "h200", "--gpus", "16", "--json"], runs
    )

    from servetune.plan.service import PlanArgs, run_plan

    run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm"))  # warm caches
    samples = []
    for _ in range(runs * 3):
        t0 = time.perf_counter()
        run_plan(PlanArgs(model="llama-3.1-70b", gpu="h100-sxm", gpus=8))
        samples.append(time.perf_counter() - t0)
    inproc = statistics.median(samples)
    print(f"servetune --help             median {help_s * 1e3:7.1f} ms (process start baseline)")
    print(
        f"servetune plan --json        median {plan_s * 1e3:7.1f} ms "
        f"({plan_s / help_s:.2f}x --help)"
    )
    print(f"plan deepseek-v3 16xH200     median {big_s * 1e3:7.1f} ms")
    print(f"run_plan in process (70B/8)  median {inproc * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
