"""What bench's live view costs the client process: CPU seconds per second of run.

The view runs in the client's process: the runner calls it with each progress tick (at
most 4 a second), rich's Live thread redraws 4 times a second, and one poller thread
scrapes the engine's /metrics and reads the host CPU once a second. This feeds it ticks at
the runner's pace for --seconds, drawing to a terminal console on /dev/null, its poller
scraping a local /metrics page in vLLM's format (the same parse as a real engine's), and
prints the process CPU time it used against the same feed with no view. Quiet cores are
not needed: it measures CPU time, not latency. The client ceiling with and without the
view (benchmarks/client_ceiling.py --live) is the end-to-end check.

    .venv/bin/python benchmarks/live_view_cost.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import http.server
import os
import threading
import time
from typing import Any

# vLLM's gauge names as it exports them (servetune.engines.vllm.METRICS), plus histogram
# families the size of a real scrape (~90 buckets), so the parse costs what a real one does.
_BUCKETS = [0.001 * 2**i for i in range(15)] + [float("inf")]


def _metrics_page() -> bytes:
    lines = [
        "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 4",
        "# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 7",
        "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc 0.62",
    ]  # fmt: skip
    for fam in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                "request_queue_time_seconds", "e2e_request_latency_seconds",
                "request_prefill_time_seconds", "request_decode_time_seconds"):  # fmt: skip
        lines.append(f"# TYPE vllm:{fam} histogram")
        for i, le in enumerate(_BUCKETS):
            lines.append(f'vllm:{fam}_bucket{{le="{le}"}} {i * 10}')
        lines += [f"vllm:{fam}_count 150", f"vllm:{fam}_sum 12.5"]
    return ("\n".join(lines) + "\n").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    page = _metrics_page()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *_: Any) -> None:
        pass


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds (/proc/PID/stat, clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def feed(callback: Any, seconds: float) -> float:
    """Ticks at the runner's pace (every 250 ms); returns this process's CPU seconds."""
    c0, t0 = time.process_time(), time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        n += 1
        callback({
            "label": "rate4", "done": n, "total": 1000, "errors": 0, "elapsed_s": n / 4,
            "rate_req_s": 4.0, "ttft_p50_ms": 40.0 + n % 7, "ttft_p99_ms": 210.0,
            "tpot_p50_ms": 9.0, "tpot_p99_ms": 15.0,
        })  # fmt: skip
        time.sleep(0.25)
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    from servetune.bench.live import LiveView

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}"

    base = feed(lambda s: None, args.seconds)
    view = LiveView(url, "vllm", out=os.devnull)
    # a first point starts the view's process (it stays for the next point): measure the second
    feed(view, 2.0)
    view.close()
    t0 = _cpu_s(view.proc.pid)
    try:
        with_view = feed(view, args.seconds)
        child = _cpu_s(view.proc.pid) - t0
    finally:
        view.shutdown()
    srv.shutdown()
    cost = (with_view - base) / args.seconds
    print(
        f"client process: {base / args.seconds * 100:.2f}% of a core without the view, "
        f"{with_view / args.seconds * 100:.2f}% with it (+{cost * 1000:.1f} ms CPU per s); "
        f"the view's own process: {child / args.seconds * 100:.2f}% of a core (the /metrics "
        "page it scrapes is served from the client process)"
    )


if __name__ == "__main__":
    main()
