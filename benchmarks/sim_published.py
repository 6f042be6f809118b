"""The simulator's GPU tiers against published GPU serving runs (the visible fidelity set,
src/servetune/data/published/gpu_runs.csv and sglang_runs.csv): median |error| of TTFT and
TPOT per tier, per role (rows used to set a figure vs rows only checked), per engine (vLLM,
NIM, NIM on TensorRT-LLM, SGLang) and per model x GPU, with the share of runs within 25%.
The same figures as `servetune validate --published`; prints, asserts nothing. No engine,
no GPU: ~15 s on one core. The figures of the day are in docs/fidelity-gpu.md.

    .venv/bin/python benchmarks/sim_published.py [--per-run] [--csv FILE]
"""

from __future__ import annotations

import argparse
import time

from servetune.validate import published


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-run", action="store_true", help="Also print every run.")
    ap.add_argument("--csv", help="Runs to compare instead of the packaged set.")
    a = ap.parse_args()
    t0 = time.perf_counter()
    results = published.evaluate(published.load_runs(a.csv))
    if a.per_run:
        print(published.format_runs(results))
        print()
    print(published.format_report(results))
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
