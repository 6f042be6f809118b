"""Do a real engine's closed-loop users stay in lock-step? Round by round, real vLLM-CPU
against the calibrated simulator.

Why: every tier starts a closed loop's users at once (the first round is a burst), and
then they differ (`sim.phases`). In the gpu tier each user waits a phase of its own after
its first request, because vLLM on GPUs is measured far below lock-step (issue 15's
Qwen3-32B TP2 c=8 row: 154 ms, lock-step 497 ms). The calibrated and roofline tiers let
the engine's dynamics decide the rounds after the first. This
script measures what the real CPU engine does: fixed-length closed loops of 10 rounds,
each round's TTFTs side by side, real and simulated (profile fitted on the default
calibration sweep, run first on the same engine).

A round's users form clusters: requests whose TTFTs are within 5% of each other got their
first token in the same engine step (they prefilled together). Printed per run: the
clusters of each round, real and simulated, the share of rounds after the first whose
cluster sizes match, and the mean and median TTFT both ways.

    flock /tmp/servetune-engine.lock timeout 900 .venv/bin/python benchmarks/closed_loop_rounds.py \
        [--runs-dir DIR]
    .venv/bin/python benchmarks/closed_loop_rounds.py --from DIR
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from servetune import validate
from servetune.engines import testmodel
from servetune.engines.process import launch
from servetune.results.files import load_result
from servetune.results.schema import RunResult
from servetune.validate.cases import closed_workload, fixed_tokens

CFG = testmodel.VLLM_TEST_CONFIG
# (users, prompt, output): a prompt's prefill worth ~2-8 decode steps on this engine, as
# on a GPU; 10 rounds each. c=8 is twice the engine's max_num_seqs (4): half wait.
CASES = ((4, 256, 48), (8, 128, 32), (4, 64, 64))
ROUNDS = 10
SAME_STEP = 0.05  # TTFTs within 5% of each other: first token in the same engine step


def loops() -> list:
    return [
        closed_workload(f"rounds-c{c}-{p}-{o}", c, ROUNDS * c, fixed_tokens(p), fixed_tokens(o))
        for c, p, o in CASES
    ]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_live(keep_dir: Path) -> None:
    """The calibration sweep (one block) and the closed loops, on one engine."""
    model_dir = str(testmodel.make_llama_dir())
    with launch("vllm", CFG, model_dir, device="cpu") as srv:
        url, served = srv.url, srv.served_model
        validate.run_blocks(
            url,
            served,
            repeats=0,
            cal_repeats=1,
            say=say,
            keep=lambda r: validate.save_run(r, keep_dir),
        )
        for case in loops():
            validate.save_run(validate.bench_real(url, served, case), keep_dir)
            say(f"{case.name} done")


def rounds_ms(res: RunResult, users: int) -> list[list[float]]:
    """TTFTs in send order, one list per round of `users` sends."""
    recs = sorted((r for r in res.records if r.chunk_ns), key=lambda r: r.send_ns)
    ttft = [(r.chunk_ns[0] - r.send_ns) / 1e6 for r in recs]
    return [ttft[k : k + users] for k in range(0, len(ttft), users)]


def clusters(ttfts: list[float]) -> list[int]:
    """Sizes of the groups of TTFTs within SAME_STEP of their neighbour, largest first."""
    xs = sorted(ttfts)
    sizes, run = [], 1
    for a, b in zip(xs, xs[1:], strict=False):
        if b - a <= SAME_STEP * b:
            run += 1
        else:
            sizes.append(run)
            run = 1
    sizes.append(run)
    return sorted(sizes, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", help="keep the real runs here (default: a temp dir)")
    ap.add_argument("--from", dest="src", help="evaluate runs kept by an earlier --runs-dir")
    args = ap.parse_args()
    if args.src:
        keep = Path(args.src)
    else:
        keep = Path(args.runs_dir or tempfile.mkdtemp(prefix="servetune-rounds-"))
        keep.mkdir(parents=True, exist_ok=True)
        run_live(keep)
    runs = [load_result(p) for p in sorted(keep.glob("*.json"))]
    model_dir = str(testmodel.make_llama_dir())
    sweep = [r for r in runs if validate.is_calibration(str(r.workload.get("name")))]
    profile, _, _ = validate.compare_saved(
        validate.least_disturbed_per_case(sweep), model_dir, CFG, measured=sweep
    )
    print(f"runs in {keep}; profile fitted on {len(sweep)} sweep runs")
    for real in runs:
        name = str(real.workload.get("name"))
        if not name.startswith("rounds-"):
            continue
        users = int(real.workload["arrival"]["concurrency"])
        sim = validate.simulate_like(real, model_dir, CFG, profile)
        rr, sr = rounds_ms(real, users), rounds_ms(sim, users)
        same = [clusters(a) == clusters(b) for a, b in zip(rr[1:], sr[1:], strict=False)]
        rm, sm = real.metrics.ttft_ms, sim.metrics.ttft_ms
        print(
            f"\n{name}: mean TTFT real {rm.mean:.0f} / sim {sm.mean:.0f} ms "
            f"({(sm.mean - rm.mean) / rm.mean:+.0%}), median {rm.p50:.0f} / {sm.p50:.0f} ms "
            f"({(sm.p50 - rm.p50) / rm.p50:+.0%}); rounds 1-{len(same)} with the same "
            f"clusters: {np.mean(same):.0%}"
        )
        for k, (a, b) in enumerate(zip(rr, sr, strict=False)):
            ra = " ".join(f"{x:5.0f}" for x in a)
            sb = " ".join(f"{x:5.0f}" for x in b)
            print(f"  round {k}: real {ra}  {clusters(a)!s:12s} sim {sb}  {clusters(b)}")


if __name__ == "__main__":
    main()
