"""Simulator fidelity on multi-turn workloads, against the real vLLM CPU engine.

1. Starts vLLM (CPU build) on the generated small Llama with the test settings
   (VLLM_TEST_CONFIG) and runs, in interleaved blocks (so host drift hits both alike),
   the calibration sweep of `servetune validate` and the session workloads below. The
   session workloads are held out: the profile is fitted on the cal-* runs alone.
2. `validate.validate_runs` fits the profile, replays every run's exact turns (the
   server's prompt counts) through the simulator, and judges the held-out figures
   against validate.TARGETS (throughput and P50 TPOT <= 10%, P50 TTFT <= 15%, P95 <=
   25%) with the noise-floor rule (a miss on a figure the engine does not reproduce
   within its target is "too noisy", not "missed").
3. Prints follow-up-turn TTFT separately (real vs simulated, P50 and P95): the figure
   prefix caching moves.

Run it alone on the machine (it starts an engine, ~6-10 minutes with 2 repeats):

    flock /tmp/servetune-engine.lock .venv/bin/python benchmarks/session_fidelity.py \
        [--repeats 2] [--runs-dir DIR] [--json out.json]

With `--runs-dir`, every real run is saved, and `servetune validate --runs DIR` judges
them again (the same fit and comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from servetune import validate
from servetune.engines.process import launch
from servetune.metrics.turns import session_metrics
from servetune.workload.spec import WorkloadSpec, parse_workload


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def session_cases() -> list[WorkloadSpec]:
    """Held-out multi-turn workloads: a chat and an agent loop, 2 users each."""
    chat = {
        "name": "sessions-chat-c2",
        "count": 4,
        "arrival": {"kind": "closed", "concurrency": 2},
        "sessions": {
            "kind": "chat",
            "turns": {"dist": "fixed", "value": 4},
            "user_tokens": {"dist": "uniform", "low": 64, "high": 192},
            "output_tokens": {"dist": "uniform", "low": 16, "high": 32},
            "think_time_s": 0.5,
            "system_prompt": {"groups": 1, "tokens": 256},
        },
    }
    agent = {
        "name": "sessions-agent-c2",
        "count": 4,
        "arrival": {"kind": "closed", "concurrency": 2},
        "sessions": {
            "kind": "agent",
            "system_prompt": {"groups": 1, "tokens": 200},
            "task_tokens": {"dist": "fixed", "value": 60},
            "steps": {"dist": "fixed", "value": 4},
            "tool_call_tokens": {"dist": "uniform", "low": 12, "high": 24},
            "fan_out": {"dist": "uniform", "low": 1, "high": 2},
            "tool_latency_s": {"dist": "uniform", "low": 0.2, "high": 0.6},
            "tool_result_tokens": {"dist": "uniform", "low": 80, "high": 200},
            "answer_tokens": {"dist": "fixed", "value": 32},
            "context_cap_tokens": 1800,
        },
    }
    return [parse_workload({"api": "completions", **d}) for d in (chat, agent)]


def followups(res) -> dict[str, float | None]:
    m = session_metrics(res.records)
    if m is None:
        return {"p50": None, "p95": None}
    return {"p50": m.followup.ttft_ms.p50, "p95": m.followup.ttft_ms.p95}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--runs-dir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    h = validate.harness_for("vllm")
    runs = []
    t0 = time.monotonic()
    with launch("vllm", h.cfg, h.weights, device="cpu") as srv:
        version = validate.engine_version(srv)
        say(f"vllm up in {time.monotonic() - t0:.0f} s ({version})")
        for rep in range(a.repeats):
            for case in validate.calibration_cases() + session_cases():
                cal = validate.is_calibration(case.name)
                res = validate.bench_real(srv.url, srv.served_model, case, scrape=not cal,
                                          repeat=rep)  # fmt: skip
                runs.append(res)
                if a.runs_dir:
                    validate.save_run(res, a.runs_dir)
                say(f"r{rep} {case.name}: {res.metrics.output_tok_s:.1f} tok/s")
    out = validate.validate_runs(runs, h, engine_version=version)
    print(validate.format_table(out.heldout, f"multi-turn workloads (median of {a.repeats})"))
    if out.floor:
        print(validate.format_table(out.floor, validate.NOISE_FLOOR_TITLE))
    judged, figs = out.verdict()
    print(f"verdict: {judged}" + (f" ({', '.join(figs)})" if figs else ""))
    # Follow-up turns alone: replay each session run again with the fitted profile.
    follow: dict[str, list] = {}
    for r in runs:
        name = str(r.workload.get("name"))
        if validate.is_calibration(name):
            continue
        sim = validate.simulate_like(r, h.model, h.cfg, out.profile)
        follow.setdefault(name, []).append({"real": followups(r), "sim": followups(sim)})
    for name, reps in follow.items():
        for k, rep in enumerate(reps):
            real, sim = rep["real"], rep["sim"]
            print(f"{name} r{k} follow-up TTFT p50/p95 ms: real {real['p50']:.0f}/"
                  f"{real['p95']:.0f}  sim {sim['p50']:.0f}/{sim['p95']:.0f}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "profile": out.profile.model_dump(mode="json"),
                    "heldout": [asdict(r) for r in out.heldout],
                    "medians": out.medians(),
                    "noise_floor": [asdict(r) for r in out.floor],
                    "verdict": {"result": judged, "figures": figs},
                    "followup_ttft_ms": follow,
                },
                fh,
                indent=1,
                default=str,
            )


if __name__ == "__main__":
    main()
