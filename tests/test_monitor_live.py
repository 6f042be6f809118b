"""The live view of bench and tune: what it shows, that it is off when piped, and that its
engine poller reads the engine's canonical gauges (on a real engine in
test_monitor_prometheus.py)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

from servetune.bench.live import EngineWatch, LiveView, live_view, offered, render
from servetune.engines.process import free_port

ROOT = Path(__file__).resolve().parents[1]
TICK = {
    "label": "rate4", "done": 40, "total": 120, "errors": 1, "elapsed_s": 10.2,
    "rate_req_s": 3.9, "ttft_p50_ms": 41.0, "ttft_p99_ms": 212.5, "tpot_p50_ms": 9.0,
    "tpot_p99_ms": 15.25,
}  # fmt: skip


def text(renderable) -> str:
    c = Console(file=io.StringIO(), width=200)
    c.print(renderable)
    return c.file.getvalue()


def test_offered_load_is_read_from_the_point_labels() -> None:
    assert offered("rate4") == "4 req/s"
    assert offered("rate=2.5") == "2.5 req/s"
    assert offered("conc8") == "8 users"
    assert offered("concurrency=16") == "16 users"
    assert offered("point") == "-"


def test_view_shows_client_engine_and_host_figures() -> None:
    out = text(render(TICK, {"requests_running": 4, "requests_waiting": 7,
                             "kv_cache_usage": 0.62, "cpu_pct": 55.0,
                             "cpu_max_core_pct": 99.0}))  # fmt: skip
    for part in ("offered 4 req/s", "achieved 3.9 req/s", "40/120 done", "errors 1",
                 "TTFT p50/p99 41.0/212.5 ms", "TPOT p50/p99 9.0/15.2 ms",
                 "running 4 waiting 7", "KV 62%", "host CPU 55%", "busiest core 99%"):  # fmt: skip
        assert part in out, (part, out)
    # no engine figures yet (or no --engine): dashes, never stale or made-up numbers
    assert "running - waiting -" in text(render(TICK, {}))


def test_off_when_piped_on_in_a_terminal(tmp_path: Path) -> None:
    assert live_view(Console(file=io.StringIO())) is None
    assert isinstance(live_view(Console(file=io.StringIO(), force_terminal=True)), LiveView)
    # on: drawn by a process of its own, which ends with the point
    out = tmp_path / "view.txt"
    view = LiveView(out=str(out))
    view(TICK)
    proc = view.proc
    assert proc is not None and proc.pid != os.getpid()
    deadline = time.monotonic() + 60  # a spawned interpreter starts slowly on a busy host
    while "achieved 3.9 req/s" not in out.read_text() if out.exists() else True:
        assert time.monotonic() < deadline, "the view never drew"
        view(TICK)
        time.sleep(0.25)
    view.close()  # the point ends: the process stays for the next one
    assert view.proc is proc and proc.is_alive()
    view.shutdown()
    assert view.proc is None and not proc.is_alive() and proc.exitcode == 0


def _drew(out: Path) -> bool:
    return out.exists() and "achieved 3.9 req/s" in out.read_text()


def _cleared(out: Path) -> bool:
    """The view cleared after its last redraw: rich's transient Live, once stopped, shows
    the cursor again and erases its lines (a redraw never shows the cursor)."""
    t = out.read_text()
    return t.rfind("\x1b[?25h") > t.rfind("achieved")


def test_the_end_of_a_point_and_of_the_run_get_through_a_full_queue(tmp_path: Path) -> None:
    """A view process starved of CPU (CI at nice 19 beside engines; here stopped) takes no
    ticks, so the bench's next ones are dropped; the end of the point (the view clears) and
    the end of the run (the process exits 0) must still get through, and must not wait
    for the view. They were dropped with the ticks once: the process outlived its stop
    and was terminated (exitcode -15)."""
    out = tmp_path / "view.txt"
    view = LiveView(out=str(out))
    view(TICK)
    proc = view.proc
    try:
        deadline = time.monotonic() + 60  # a spawned interpreter starts slowly on a busy host
        while not _drew(out):
            assert time.monotonic() < deadline, "the view never drew"
            view(TICK)
            time.sleep(0.25)
        os.kill(proc.pid, signal.SIGSTOP)  # starved: it takes nothing from the queue
        for _ in range(40):  # far more ticks than are kept for it
            view(TICK)
        view.close()  # the point ends while the view is stopped
        os.kill(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not _cleared(out):
            assert time.monotonic() < deadline, "the view never cleared: the point's end was lost"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGSTOP)  # again, for the end of the run
        for _ in range(40):
            view(TICK)
        threading.Timer(2.0, os.kill, (proc.pid, signal.SIGCONT)).start()
        view.shutdown()  # waits for the process (resumed in 2 s) to take "quit" and exit
        assert view.proc is None and not proc.is_alive() and proc.exitcode == 0, proc.exitcode
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.join(10)


def test_bench_piped_prints_no_live_view(tmp_path: Path) -> None:
    port = free_port()
    mock = subprocess.Popen([sys.executable, "-m", "servetune.cli.app", "mock-server",
                             "--port", str(port)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert mock.stdout is not None and "listening" in mock.stdout.readline()
        res = subprocess.run(
            [str(ROOT / ".venv/bin/servetune"), "bench", "--url", f"http://127.0.0.1:{port}",
             "--model", "m", "--rate", "20", "--count", "40", "--no-store"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
    finally:
        mock.kill()
        mock.wait()
    assert res.returncode == 0, res.stderr
    # the view's own lines, not words a note may share (a starved run's client note says
    # "of offered 17.3 req/s": stop 46's CI)
    assert "TTFT p50/p99" not in res.stderr and "engine running" not in res.stderr
    assert "servetune bench" in res.stdout  # the summary table still prints


def test_engine_watch_samples_the_host_without_an_engine() -> None:
    w = EngineWatch(None, None, interval_s=0.2).start()
    try:
        deadline = time.monotonic() + 60  # it imports httpx and psutil first: not a speed test
        while "cpu_pct" not in w.latest and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        w.stop()
    assert 0 <= w.latest["cpu_pct"] <= 100 and "requests_running" not in w.latest
