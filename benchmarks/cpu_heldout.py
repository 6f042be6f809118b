"""The CPU calibration's held-out check: a mixed, bursty, prefix-sharing workload that the
calibration sweep never runs, on the real vLLM CPU engine and in the simulator.

What a user does, measured: `servetune calibrate --url` with its default sweep
(`validate.calibration_cases`, one block; least squares then the replay fit), then
`simulate --replay` of each real run of benchmarks/cpu_heldout.yaml (gamma arrivals, CV 3,
at 60% of capacity; 70% 64/48-token requests, 30% 600-900/96-token ones behind 2 shared
256-token prefixes). Steps, on one engine (VLLM_TEST_CONFIG on the generated test Llama):

1. the default sweep (two blocks, the least disturbed run of each workload fitted, as
   `calibrate --url` does), timed: its wall time is what calibrating costs a user;
2. the capacity: the held-out requests as a closed loop of max_num_seqs users (every slot
   busy), its achieved req/s; the held-out rate is `--load` (0.6) of it;
3. `--repeats` (3) runs of the held-out workload, the same requests each time with the
   prefix cache reset before each (POST /reset_prefix_cache: the engine runs with
   VLLM_SERVER_DEV_MODE=1), so the repeats differ only by the host's noise;
4. the fit on the sweep's runs only, the replay of every real run, and per figure: the
   simulated against the real median over repeats (signed %), each repeat's own error, the
   noise floor (real vs real: odd repeats against even ones), the target and the verdict
   (met / MISSED / not judgeable: the floor already exceeds the target).

A benchmark, not a test: the host is shared and its load moves the real figures.
`--from DIR` re-evaluates runs kept by an earlier `--runs-dir DIR` without an engine.

    flock /tmp/servetune-engine.lock timeout 1500 .venv/bin/python benchmarks/cpu_heldout.py \
        [--seed 1] [--repeats 3] [--runs-dir DIR] [--json out.json]
    .venv/bin/python benchmarks/cpu_heldout.py --from DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from servetune import validate
from servetune.engines import testmodel
from servetune.engines.process import launch
from servetune.results.files import load_result
from servetune.results.schema import RunResult
from servetune.sim.profile import Profile
from servetune.workload.spec import WorkloadSpec, load_workload

WORKLOAD = Path(__file__).with_name("cpu_heldout.yaml")
SWEEP_REPEATS = 2  # `calibrate --url`'s default
CAPACITY = "capacity-mixed"  # the closed loop that sizes the held-out rate; not judged
CFG = testmodel.VLLM_TEST_CONFIG
# The CPU targets, % (validate.TARGETS without throughput: the open loop's offered
# rate sets its throughput, so it is no test of the model).
FIGS = ("ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_live(args: argparse.Namespace, spec: WorkloadSpec, keep_dir: Path) -> list[RunResult]:
    """Steps 1-3 on one engine; every run saved to `keep_dir` as it finishes."""
    runs: list[RunResult] = []

    def keep(res: RunResult) -> None:
        runs.append(res)
        validate.save_run(res, keep_dir)

    model_dir = str(testmodel.make_llama_dir())
    dev = {"VLLM_SERVER_DEV_MODE": "1"}  # for POST /reset_prefix_cache between repeats
    with launch("vllm", CFG, model_dir, device="cpu", extra_env=dev) as srv:
        url, served = srv.url, srv.served_model
        t0 = time.monotonic()
        validate.run_blocks(url, served, repeats=0, cal_repeats=SWEEP_REPEATS, say=say, keep=keep)
        sweep_s = time.monotonic() - t0
        say(f"default sweep: {sweep_s:.0f} s")
        closed = spec.with_load(concurrency=CFG.max_num_seqs, count=24)
        cap = validate.bench_real(url, served, closed.model_copy(update={"name": CAPACITY}))
        keep(cap)
        rate = round(args.load * cap.metrics.req_s, 3)
        say(f"capacity {cap.metrics.req_s:.2f} req/s -> held-out rate {rate} req/s")
        held = spec.with_load(rate=rate)
        for rep in range(args.repeats):
            # The same requests every repeat (the repeat index seeds them in bench_real;
            # --seed moves them), the prefix cache reset before each, so the repeats
            # differ only by the host: their spread is the noise floor. Without the reset
            # endpoint, fresh requests per repeat (the floor then holds their spread too).
            reset = reset_prefix_cache(url)
            seed_rep = 1000 * args.seed + (0 if reset else rep)
            res = validate.bench_real(url, served, held, repeat=seed_rep)
            keep(res)
            say(f"held-out r{rep} (cache reset: {reset}): {res.metrics.req_s:.2f} req/s")
    (keep_dir / "sweep_s.txt").write_text(f"{sweep_s:.1f}\n")
    return runs


def reset_prefix_cache(url: str) -> bool:
    """POST /reset_prefix_cache (vLLM, with VLLM_SERVER_DEV_MODE=1): whether it worked."""
    try:
        req = urllib.request.Request(f"{url}/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def signed_pct(sim: float | None, real: float | None) -> float | None:
    return None if sim is None or not real else (sim - real) / real * 100.0


def evaluate(runs: list[RunResult], name: str) -> tuple[Profile, dict]:
    """Step 4: fit on the sweep, replay everything in the engine's order, the figures."""
    model_dir = str(testmodel.make_llama_dir())
    # As `calibrate --url` fits: the least disturbed run of each sweep workload.
    sweep = [r for r in runs if validate.is_calibration(str(r.workload.get("name")))]
    profile, _, _ = validate.compare_saved(validate.least_disturbed_per_case(sweep), model_dir, CFG)
    profile, _, rows = validate.compare_saved(runs, model_dir, CFG, profile)
    reals = validate.by_workload(runs)[name]
    row = next(r for r in rows if r.name == name)
    floor = next((r for r in validate.noise_floor(runs) if r.name == name), None)
    shapes: set[int] = set()  # one engine served them all, in this order (compare_saved)
    judged, per_rep = {id(r) for r in reals}, []
    for real in sorted(runs, key=lambda r: r.started_unix_s or 0.0):
        sim = validate.simulate_like(real, model_dir, CFG, profile, shapes=shapes)
        if id(real) in judged:
            a, b = validate.figures(sim.metrics), validate.figures(real.metrics)
            per_rep.append({k: signed_pct(a[k], b[k]) for k in FIGS})
    out = {}
    for k in FIGS:
        err = signed_pct(row.sim[k], row.real[k])
        fl = floor.err[k] if floor else None
        target = validate.TARGETS[k]
        if err is not None and abs(err) <= target:
            verdict = "met"
        elif fl is not None and fl > target:
            verdict = "not judgeable (floor > target)"
        else:
            verdict = "MISSED"
        out[k] = {
            "real": row.real[k],
            "sim": row.sim[k],
            "error_pct": err,
            "per_repeat_pct": [r[k] for r in per_rep],
            "floor_pct": fl,
            "target_pct": target,
            "verdict": verdict,
        }
    return profile, out


def report(profile: Profile, figs: dict, sweep_s: float | None, repeats: int) -> None:
    fit = profile.fit
    assert fit is not None
    print(f"default sweep: {sweep_s:.0f} s" if sweep_s else "default sweep: (not timed)")
    print(
        f"profile: confidence {fit.confidence}, {fit.method}, R^2 {fit.r2:.3f}, "
        f"error {fit.rel_rmse:.1%}, api overhead {profile.api_overhead_s * 1e3:.1f} ms, "
        f"dropped {fit.dropped or 'none'}"
    )
    for why in getattr(fit, "problems", []) or []:
        print(f"  - {why}")
    print(f"held-out {WORKLOAD.name}, {repeats} repeats; sim vs real (median of repeats)")
    head = f"{'figure':9s} {'real ms':>9s} {'sim ms':>9s} {'sim vs real':>12s}"
    print(head + f" {'per repeat':>22s} {'floor':>7s} {'target':>7s}  verdict")
    for k, f in figs.items():
        reps = ",".join(f"{v:+.0f}" for v in f["per_repeat_pct"] if v is not None)
        fl = f"{f['floor_pct']:.1f}%" if f["floor_pct"] is not None else "-"
        print(
            f"{k:9s} {f['real']:9.1f} {f['sim']:9.1f} {f['error_pct']:+11.1f}% {reps:>22s} "
            f"{fl:>7s} {f['target_pct']:6.0f}%  {f['verdict']}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="moves the held-out requests")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.6, help="held-out rate / capacity")
    ap.add_argument("--runs-dir", type=Path, help="keep the real runs here")
    ap.add_argument("--from", dest="src", type=Path, help="evaluate kept runs, no engine")
    ap.add_argument("--json", type=Path, help="write the figures and the profile here")
    args = ap.parse_args()
    spec = load_workload(WORKLOAD)
    if args.src:
        runs = [load_result(p) for p in sorted(args.src.glob("*.json"))]
        timed = args.src / "sweep_s.txt"
        sweep_s = float(timed.read_text()) if timed.exists() else None
        keep_dir = args.src
    else:
        keep_dir = args.runs_dir or Path(f"cpu-heldout-runs-seed{args.seed}")
        runs = run_live(args, spec, keep_dir)
        sweep_s = float((keep_dir / "sweep_s.txt").read_text())
    repeats = len(validate.by_workload(runs).get(spec.name, []))
    profile, figs = evaluate(runs, spec.name)
    report(profile, figs, sweep_s, repeats)
    if args.json:
        data = {"profile": profile.model_dump(), "figures": figs, "sweep_s": sweep_s}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    say(f"runs in {keep_dir}")


if __name__ == "__main__":
    main()
