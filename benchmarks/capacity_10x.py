"""Does the tuner's capacity hold for ten times as long? Runs the tuner's own capacity
search (`tune.trial.run_trial`: the rate lattice, the steady-state rule of
`measure.steady`) on one config, then one run at the capacity it found with 10x the
requests of the tuner's point, and prints both: offered vs achieved rate, goodput as a
share of the rate, P95 TTFT and TPOT, and the steady-state verdict.

Default: the real llama.cpp + Gemma 3 270M Q4_K_M (the main job's engine and prompts, as
Poisson arrivals; 2 slots), the SLO derived from this host as the main job derives it
(`tune.hostslo`: P95 TTFT <= 4x and P95 TPOT <= 3x an idle probe's P95s; `--fixed-slo`:
P95 TTFT 2 s, P95 TPOT 150 ms, which a busy 2-core host misses at any rate). Takes ~15-20
minutes on a 2-core host (the search ~5 points of 70 s, the long run ~12 minutes): run it under the
engine lock on a shared machine. `--backend sim` runs the same on the simulator (seconds).

    flock /tmp/servetune-engine.lock .venv/bin/python benchmarks/capacity_10x.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

from servetune.engines.config import EngineConfig
from servetune.engines.testmodel import gemma_gguf
from servetune.measure import BackendSpec, make_backend
from servetune.measure.result import PointResult
from servetune.measure.steady import default_rule, evidence_text
from servetune.slo import HostRule, parse_slo
from servetune.tune.capacity import rate_lattice
from servetune.tune.hostslo import probe_host
from servetune.tune.objective import Objective
from servetune.tune.study import Recorder
from servetune.tune.trial import SearchSettings, run_trial
from servetune.workload.spec import parse_workload

WORKLOAD = {  # the main job's prompts (data/tune/llamacpp-cpu.yaml), open loop
    "name": "capacity-10x",
    "api": "completions",
    "seed": 0,
    "count": 6,
    "input_tokens": {"dist": "uniform", "low": 32, "high": 96},
    "output_tokens": {"dist": "fixed", "value": 16},
    "arrival": {"kind": "poisson", "rate": 1},
}
SLO = {"ttft_ms": {"p95": 2000}, "tpot_ms": {"p95": 150}, "error_rate": 0.05}
LONGER = 10  # the long run's requests, in multiples of the tuner's point


def spec_for(backend: str, model_path: str | None, profile: str | None) -> BackendSpec:
    return BackendSpec(
        kind=backend,
        engine="llamacpp",
        model="gemma-3-270m",
        hardware="local",
        workload=parse_workload(WORKLOAD).model_dump(mode="json"),
        slo=SLO,
        model_path=model_path,
        profile=profile,
        device="cpu",
        per_user=1,
        request_timeout_s=60,
        launch_timeout_s=300,
    )


def show(what: str, p: PointResult, requests: int, capacity: float, seconds: float) -> None:
    s = p.signals
    good = (p.goodput_req_s or 0.0) / capacity
    print(
        f"{what}: {requests} requests at {p.load:g} req/s in {seconds:.0f} s: "
        f"achieved {s.get('achieved_req_s', 0):.3g} req/s ({s.get('achieved_ratio', 0):.0%} of "
        f"offered), goodput {p.goodput_req_s or 0:.3g} req/s ({good:.0%} of the capacity), "
        f"P95 TTFT {p.ttft_p95_ms or 0:,.0f} ms, P95 TPOT {p.tpot_p95_ms or 0:,.0f} ms, "
        f"SLO {'met' if p.passed else 'MISSED'}"
    )
    print(f"  {evidence_text(s)}")
    missed = [c for c in p.checks if not c.get("ok")]
    if missed:
        print("  missed: " + "; ".join(f"{c['metric']} {c['stat']} {c['value']}" for c in missed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("real", "sim"), default="real")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--start-rate", type=float, default=2.0, help="where the search starts")
    ap.add_argument("--min-rate", type=float, default=0.25, help="the lattice's lowest rate")
    ap.add_argument("--max-probes", type=int, default=5)
    ap.add_argument("--profile", help="sim: a calibrated profile (servetune calibrate)")
    ap.add_argument("--fixed-slo", action="store_true", help="the fixed SLO, not the host's")
    ap.add_argument("--max-long-s", type=float, help="skip a long run whose arrivals take longer")
    args = ap.parse_args()
    model = str(gemma_gguf()) if args.backend == "real" else None
    spec = spec_for(args.backend, model, args.profile if args.backend == "sim" else None)
    cfg = EngineConfig(engine="llamacpp", parallel_slots=args.slots, threads=args.threads)
    lattice = rate_lattice(args.min_rate, 16)
    db = tempfile.mkdtemp(prefix="capacity10x-") + "/s.db"
    recorder = Recorder(db, "capacity-10x", args.backend)
    if not args.fixed_slo:
        got = probe_host(make_backend(spec), cfg, base=parse_slo(SLO), rule=HostRule(),
                         recorder=recorder, label=f"slots={args.slots}")  # fmt: skip
        if isinstance(got, str):
            print(f"SLO not derived ({got}): the fixed SLO applies")
        else:
            print(got.text())
            spec = replace(spec, slo=got.slo.model_dump(mode="json", exclude_none=True))
    t0 = time.monotonic()
    trial = run_trial(
        make_backend(spec),
        cfg,
        objective=Objective("goodput"),
        search=SearchSettings("rate", lattice, max_probes=args.max_probes),
        recorder=recorder,
        label=f"slots={args.slots}",
        start_index=lattice.index_of(args.start_rate),
        say=print,
    )
    search_s = time.monotonic() - t0
    if trial.capacity is None or trial.best is None:
        print(f"no capacity found ({trial.status}: {trial.reason or trial.capacity_note})")
        return
    cap = trial.capacity
    print(f"capacity {cap:.3g} req/s ({trial.capacity_note})")
    rule = default_rule(args.backend)
    n = rule.count(cap, int(WORKLOAD["count"]))  # the tuner's point's requests
    show("tuner's point", trial.best, n, cap, search_s)
    # The long run: the same rule, its arrivals stretched to LONGER x n requests at the
    # capacity (warm-up included), its request cap raised to match.
    total_s = LONGER * n / cap
    if args.max_long_s is not None and total_s > args.max_long_s:
        print(f"{LONGER}x run skipped: {LONGER * n} requests at {cap:.3g} req/s take "
              f"{total_s:.0f} s of arrivals > --max-long-s {args.max_long_s:g}")  # fmt: skip
        return
    long_rule = replace(
        rule, window_s=total_s - rule.warmup_s, max_requests=max(rule.max_requests, LONGER * n)
    )
    long_backend = make_backend(replace(spec, steady=long_rule))
    t1 = time.monotonic()
    with long_backend.session(cfg) as sess:
        point, _ = long_backend.probe(sess, "rate", cap)
    show(f"{LONGER}x run", point, long_rule.count(cap, n), cap, time.monotonic() - t1)
    offered = point.signals.get("offered_req_s") or cap  # the Poisson draw's own rate
    achieved = point.signals.get("achieved_req_s", 0)
    good = point.goodput_req_s or 0
    print(
        f"reproduced: achieved {achieved / offered:.0%} of offered ({offered:.3g} req/s) and "
        f"{achieved / cap:.0%} of the capacity {cap:.3g} req/s; goodput {good / cap:.0%} of "
        f"the capacity, {good / offered:.0%} of offered (target: within 10%)"
    )


if __name__ == "__main__":
    main()
