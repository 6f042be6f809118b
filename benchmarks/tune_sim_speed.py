"""How fast the tuner runs a study on the simulator: wall seconds per trial (each a
capacity search of several simulated points) for a Bayesian study of 20 trials over
vLLM's max_num_seqs x max_num_batched_tokens for Llama-3.1-8B on one H100 (a chat
workload at a P95 TTFT 800 ms / TPOT 40 ms SLO). A GPU what-if is this loop, so its speed
is the user's wait. Each repeat runs in a fresh process (imports included, bytecode cache
on); the median is shown with the range, because this host's speed drifts. Compare two
versions by running both in one sitting (PYTHONPATH=<other checkout>/src). Prints
figures; asserts nothing.

    .venv/bin/python benchmarks/tune_sim_speed.py [--trials 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, tempfile, time
t0 = time.perf_counter()
from pathlib import Path
from servetune.measure import BackendSpec
from servetune.measure.steady import SteadyRule
from servetune.slo import parse_slo
from servetune.tune.capacity import rate_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import parse_space
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import Tuner, TuneSettings
from servetune.workload.spec import parse_workload

wl = parse_workload({"api": "chat", "seed": 0, "count": 150,
    "input_tokens": {"dist": "lognormal", "mean": 512, "sigma": 0.6, "min": 16, "max": 4096},
    "output_tokens": {"dist": "lognormal", "mean": 160, "sigma": 0.5, "min": 8, "max": 1024},
    "arrival": {"kind": "poisson", "rate": 1}})
slo = parse_slo({"ttft_ms": {"p95": 800}, "tpot_ms": {"p95": 40}, "error_rate": 0.001})
space = parse_space({"engine": "vllm", "fixed": {"max_model_len": 8192},
    "knobs": {"max_num_seqs": [4, 8, 12, 16, 24, 32, 48, 64, 96, 128],
              "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192, 16384]},
    "constraints": ["max_num_batched_tokens >= max_num_seqs"]})
spec = BackendSpec(kind="sim", engine="vllm", model="llama-3.1-8b", hardware="h100-sxm",
    workload=wl.model_dump(mode="json"),
    slo=slo.model_dump(mode="json", exclude_none=True),
    steady=SteadyRule(warmup_s=5, window_s=20))
lattice = rate_lattice(0.25, 1024)
out = Tuner(TuneSettings(space=space, mode="sim", objective=Objective("goodput"),
    search=SearchSettings("rate", lattice, max_probes=10), sim=spec, strategy="bayes",
    budget=int(sys.argv[1]), seed=7, start_index=lattice.index_of(1.0),
    db=str(Path(tempfile.mkdtemp()) / "t.db"), study="speed", verbose=False)).run()
print(json.dumps({"wall_s": time.perf_counter() - t0, "trials": len(out.ranked)}))
"""


def run_once(trials: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(trials)],
            capture_output=True, text=True, env=env, cwd=cwd, check=True,
        )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    run_once(2)  # writes the bytecode cache
    t0 = time.perf_counter()
    runs = [run_once(a.trials) for _ in range(a.repeat)]
    walls = [r["wall_s"] for r in runs]
    per = [r["wall_s"] / r["trials"] for r in runs]
    print(f"sim study, {runs[0]['trials']} trials (bayes), {a.repeat} fresh processes:")
    lo, hi = min(walls), max(walls)
    print(f"  wall      median {statistics.median(walls):.2f} s  (range {lo:.2f}-{hi:.2f})")
    print(f"  per trial median {statistics.median(per):.3f} s")
    print(f"  (benchmark took {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
