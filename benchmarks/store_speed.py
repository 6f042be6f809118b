"""Experiment store speed: how fast raw records go into SQLite, and what
streaming them costs a bench run.

1. Write throughput: 10,000 synthetic records (~110 streamed chunks each) appended in
   batches of 100, as bench streams them (`Store.append_records`), then `finish_run`
   (compaction and the derived §16 fields) and `load_result`, on a fresh SQLite file.
2. Bench overhead: the same closed-loop point against `servetune mock-server` (its own
   process), in this process, with the store (the `ResultStore` bench uses, streaming
   records through its writer thread) and with `--no-store`, alternated, median of
   `--reps` runs each. Reported: wall time (finish_run included), achieved req/s and
   TTFT P99 ratios (store / no store: is the measurement disturbed?), and the extra CPU
   per record (this process: event loop, collector and store thread).

Prints figures; asserts nothing.

    .venv/bin/python benchmarks/store_speed.py [--requests 2000] [--concurrency 32] [--reps 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def write_throughput(folder: Path, n: int = 10_000, batch: int = 100) -> None:
    from servetune.store import Store

    sys.path.insert(0, str(TESTS))  # the toy runs the store tests use
    from synthetic_runs import synthetic_run

    result, meta = synthetic_run(64, n_requests=n, seed=5)
    chunks = sum(len(r.chunk_ns) for r in result.records)
    with Store.open(str(folder / "speed.db")) as store:
        run_id = store.begin_run(meta.model_copy(update={"id": None}))
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            store.append_records(run_id, result.records[i : i + batch])
        t1 = time.perf_counter()
        store.finish_run(run_id, result)
        t2 = time.perf_counter()
        store.load_result(run_id)
        t3 = time.perf_counter()
    size = sum(p.stat().st_size for p in folder.glob("speed.db*"))
    print(f"write: {n:,} synthetic records ({chunks / n:.0f} chunks each) on SQLite")
    print(f"  append_records, batches of {batch}: {t1 - t0:.2f} s = {n / (t1 - t0):,.0f} records/s")
    print(f"  finish_run (compact + derive): {t2 - t1:.2f} s; load_result: {t3 - t2:.2f} s")
    print(f"  database files: {size / 1e6:.1f} MB")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the mock server did not start")


def bench_overhead(folder: Path, requests: int, concurrency: int, reps: int) -> None:
    from servetune.bench.runner import BenchOptions, run_point
    from servetune.store.writer import ResultStore
    from servetune.workload.materialize import materialize
    from servetune.workload.spec import parse_workload
    from servetune.workload.tokenizer import WordTokenizer

    spec = parse_workload(
        {
            "count": requests,
            "arrival": {"kind": "closed", "concurrency": concurrency},
            "input_tokens": {"dist": "fixed", "value": 64},
            "output_tokens": {"dist": "fixed", "value": 32},
        }
    )
    tok = WordTokenizer()
    reqs = materialize(spec, tok)
    port = _free_port()
    mock = subprocess.Popen(
        [sys.executable, "-m", "servetune.cli.app", "mock-server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
    try:
        _wait_up(port, mock)
        url = f"http://127.0.0.1:{port}"
        store = ResultStore.open(str(folder / "bench.db"), kind="bench", say=print)
        assert store is not None
        run_point(spec, reqs, BenchOptions(url=url, workers=1, tokenizer=tok))  # warm-up
        for _ in range(reps):
            for stored in (False, True):
                opts = BenchOptions(
                    url=url, workers=1, tokenizer=tok, store=store if stored else None
                )
                cpu0, t0 = time.process_time(), time.perf_counter()
                res = run_point(spec, reqs, opts)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                ttft_p99 = res.metrics.ttft_ms.p99 or 0.0
                samples[stored].append((wall, cpu, res.metrics.req_s, ttft_p99))
        store.close()
    finally:
        mock.terminate()
        mock.wait(10)

    def med(stored: bool, k: int) -> float:
        return statistics.median(s[k] for s in samples[stored])

    print(
        f"bench overhead: closed loop, {concurrency} users, {requests:,} requests "
        f"(in 64 / out 32 tokens), mock server, median of {reps} runs each"
    )
    for name, stored in (("--no-store", False), ("store", True)):
        print(
            f"  {name:10s} wall {med(stored, 0):.2f} s, {med(stored, 2):,.0f} req/s, "
            f"TTFT P99 {med(stored, 3):.2f} ms, CPU {med(stored, 1) / requests * 1e6:.0f} us/record"
        )
    extra_us = (med(True, 1) - med(False, 1)) / requests * 1e6
    print(
        f"  store / no-store: wall x{med(True, 0) / med(False, 0):.3f}, "
        f"req/s x{med(True, 2) / med(False, 2):.3f}, TTFT P99 x{med(True, 3) / med(False, 3):.3f}, "
        f"+{extra_us:.0f} us CPU per record"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="per bench run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="store-speed-") as tmp:
        write_throughput(Path(tmp))
        bench_overhead(Path(tmp), args.requests, args.concurrency, args.reps)


if __name__ == "__main__":
    main()
