"""The simulator's GPU tiers against published GPU serving runs (the visible fidelity set,
src/servetune/data/published/gpu_runs.csv, sglang_runs.csv and aic_vllm_runs.csv): median
|error| of TTFT and TPOT per tier, per role (rows used to set a figure vs rows only checked),
per engine (vLLM, NIM, NIM on TensorRT-LLM, SGLang), the vLLM rows per load band and per
dense or MoE model (the held-out set is dense), and per model x GPU, with the share of runs
within 25%;
then the real forward passes step by step (vLLM's on B300, servetune's own on an H200),
and public closed loops' median / mean TTFT beside the simulated loops' (validate.spread).
The same figures as `servetune validate --published`; prints, asserts nothing. No engine,
no GPU: ~40 s on one core, replayed over the cores this process may use (`--jobs`).
`--serial-baseline` also replays them in this process alone and prints the speed-up and
whether the figures are the same. The figures of the day are in docs/fidelity-gpu.md.

    .venv/bin/python benchmarks/sim_published.py [--per-run] [--csv FILE] [--jobs N]
        [--serial-baseline]
"""

from __future__ import annotations

import argparse
import time

from servetune.procfs import usable_cores
from servetune.validate import published, spread, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-run", action="store_true", help="Also print every run.")
    ap.add_argument("--csv", help="Runs to compare instead of the packaged set.")
    ap.add_argument("--jobs", type=int, default=usable_cores(), help="Processes to replay in.")
    ap.add_argument("--serial-baseline", action="store_true", help="Also time one process.")
    a = ap.parse_args()
    runs = published.load_runs(a.csv)
    t0 = time.perf_counter()
    results = published.evaluate(runs, jobs=a.jobs)
    took = time.perf_counter() - t0
    if a.per_run:
        print(published.format_runs(results))
        print()
    print(published.format_report(results))
    print(f"({took:.1f} s over {a.jobs} process(es))")
    if a.csv is None:  # the packaged set's forward passes, step by step (validate.steps)
        print()
        print(steps.format_steps(steps.evaluate_steps(steps.load_steps(), published.TIERS)))
        print()  # public loops' median / mean TTFT beside the simulated ones (validate.spread)
        print(spread.format_spread(*spread.spreads(runs, published.TIERS)))
    if a.serial_baseline:
        t0 = time.perf_counter()
        serial = published.evaluate(runs, jobs=1)
        alone = time.perf_counter() - t0
        same = "the same figures" if serial == results else "DIFFERENT figures"
        print(f"one process: {alone:.1f} s; {alone / took:.2f}x faster over {a.jobs}; {same}")


if __name__ == "__main__":
    main()
