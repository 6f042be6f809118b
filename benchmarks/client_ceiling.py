"""How much load can this client offer honestly? (issue 4; field notes: client self-calibration)

Procedure: the mock server (TTFT 5 ms, ITL 1 ms, 16 streamed chunks per request) pinned to
one core, the client pinned to another with taskset/sched_setaffinity. For rising Poisson
rates, a rate is *held* when: sent >= 98% of offered, send-lag P99 <= 10 ms, and reported
P50 TTFT <= 2x the mock's true 5 ms. Then the closed loop at 256 users gives the streamed
chunks/s the client parses. With --vllm-bench, vLLM's `bench serve` runs the same ladder on
the same core for a side-by-side ratio.

    python benchmarks/client_ceiling.py [--seconds 3] [--workers 1]
        [--vllm-bench PATH --tokenizer DIR]

Prints figures; asserts nothing (DESIGN.md: speed targets are scripts, not tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRUE_TTFT_MS = 5.0
CHUNKS = 16
LADDER = [250, 500, 750, 1000, 1250, 1500, 2000, 2500, 3000, 4000, 5000]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mock(core: int | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "servetune.cli.app",
        "mock-server",
        "--port",
        str(port),
        "--ttft-ms",
        str(TRUE_TTFT_MS),
        "--itl-ms",
        "1",
        "--output-tokens",
        str(CHUNKS),
    ]
    if core is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "listening on ..."
    return proc, f"http://127.0.0.1:{port}"


def spec_for(kind: str, value: float, seconds: float):
    from servetune.workload.spec import parse_workload

    arrival = (
        {"kind": "poisson", "rate": value}
        if kind == "rate"
        else {"kind": "closed", "concurrency": int(value)}
    )
    count = int(value * seconds) if kind == "rate" else int(value * 40)
    return parse_workload(
        {
            "count": count,
            "arrival": arrival,
            "input_tokens": {"dist": "fixed", "value": 16},
            "output_tokens": {"dist": "fixed", "value": CHUNKS},
            "sampling": {"ignore_eos": False},
        }
    )


def run(url: str, kind: str, value: float, seconds: float, workers: int):
    from servetune.bench.runner import BenchOptions, run_point
    from servetune.workload.materialize import materialize
    from servetune.workload.tokenizer import WordTokenizer

    spec = spec_for(kind, value, seconds)
    opts = BenchOptions(url=url, workers=workers, keep_text=False, breaker_error_rate=None)
    t0 = time.monotonic()
    res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    return res, time.monotonic() - t0


def held(res) -> tuple[bool, str]:
    m = res.metrics
    ok = (
        m.offered_req_s is not None
        and m.sent_req_s >= 0.98 * m.offered_req_s
        and (m.send_lag_ms.p99 or 0) <= 10.0
        and (m.ttft_ms.p50 or 1e9) <= 2 * TRUE_TTFT_MS
        and m.failed == 0
    )
    why = (
        f"offered {m.offered_req_s or 0:7.1f} sent {m.sent_req_s:7.1f} done {m.req_s:7.1f} req/s  "
        f"lag p99 {m.send_lag_ms.p99 or 0:6.2f} ms  TTFT p50 {m.ttft_ms.p50 or 0:6.2f} ms  "
        f"cpu {res.client.cpu_util:4.0%}  err {m.failed}"
    )
    return ok, why


def vllm_ladder(vllm: str, tokenizer: str, url: str, core: int | None, seconds: float) -> float:
    """vLLM's `bench serve` on the same ladder; returns its highest held rate."""
    best = 0.0
    for rate in LADDER:
        with tempfile.TemporaryDirectory() as d:
            cmd = [
                vllm,
                "bench",
                "serve",
                "--backend",
                "openai-chat",
                "--endpoint",
                "/v1/chat/completions",
                "--base-url",
                url,
                "--model",
                "mock",
                "--tokenizer",
                tokenizer,
                "--dataset-name",
                "random",
                "--random-input-len",
                "16",
                "--random-output-len",
                str(CHUNKS),
                "--num-prompts",
                str(int(rate * seconds)),
                "--request-rate",
                str(rate),
                "--ignore-eos",
                "--save-result",
                "--result-dir",
                d,
                "--percentile-metrics",
                "ttft",
            ]
            if core is not None and shutil.which("taskset"):
                cmd = ["taskset", "-c", str(core), *cmd]
            t0 = time.monotonic()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            wall = time.monotonic() - t0
            files = list(Path(d).glob("*.json"))
            if out.returncode != 0 or not files:
                print(f"  vllm bench failed at {rate}: {out.stderr[-300:]}")
                return best
            r = json.loads(files[0].read_text())
        achieved = r.get("request_throughput", 0.0)
        p50 = r.get("median_ttft_ms", 1e9)
        ok = achieved >= 0.98 * rate and p50 <= 2 * TRUE_TTFT_MS
        print(
            f"  vllm bench rate {rate:5}: throughput {achieved:7.1f} req/s  "
            f"TTFT p50 {p50:6.2f} ms  "
            f"wall {wall:5.1f}s  {'held' if ok else 'NOT held'}"
        )
        if not ok:
            break
        best = rate
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--vllm-bench", default=None, help="path to the `vllm` executable")
    ap.add_argument("--tokenizer", default=None, help="HF tokenizer dir for vLLM's bench")
    args = ap.parse_args()

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    mock_core = cores[0] if len(cores) >= 2 else None
    client_cores = set(cores[1:]) if len(cores) >= 2 else None
    mock, url = start_mock(mock_core)
    try:
        if client_cores:
            os.sched_setaffinity(0, client_cores)
        print(
            f"mock on core {mock_core}, client on {sorted(client_cores or [])}, "
            f"workers={args.workers}"
        )
        best = 0.0
        for rate in LADDER:
            res, _ = run(url, "rate", rate, args.seconds, args.workers)
            ok, why = held(res)
            print(f"  rate {rate:5}: {why}  {'held' if ok else 'NOT held'}")
            if not ok:
                break
            best = rate
        res, wall = run(url, "users", 256, args.seconds, args.workers)
        chunks = sum(len(r.chunk_ns) for r in res.records)
        span_s = (max(r.end_ns for r in res.records) - min(r.send_ns for r in res.records)) / 1e9
        print(
            f"closed loop 256 users: {res.metrics.req_s:.0f} req/s, "
            f"{chunks / span_s:,.0f} chunks/s "
            f"parsed, TTFT p50 {res.metrics.ttft_ms.p50:.2f} ms"
        )
        print(f"servetune ceiling (Poisson, criteria met): {best:.0f} req/s")
        if args.vllm_bench and args.tokenizer:
            vb = vllm_ladder(
                args.vllm_bench,
                args.tokenizer,
                url,
                min(client_cores) if client_cores else None,
                args.seconds,
            )
            print(
                f"vLLM bench ceiling: {vb:.0f} req/s; "
                f"ratio servetune/vLLM = {best / vb if vb else float('nan'):.2f}"
            )
    finally:
        mock.terminate()
        mock.wait(5)


if __name__ == "__main__":
    main()
