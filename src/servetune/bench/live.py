"""The live terminal view of a running point (rich Live): offered vs achieved rate,
running TTFT/TPOT percentiles, the engine's running/waiting requests and KV usage, host
CPU. The client's figures come from the runner's progress ticks (at most 4 a second); the
engine and host figures from a poller once a second. Both are drawn by a low-priority
process of the view's own (LiveView), so the client only queues each tick (cost:
benchmarks/live_view_cost.py, benchmarks/client_ceiling.py --live). Off when stderr is
not a terminal."""

from __future__ import annotations

import re
import threading
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from servetune.bench.progress import _ms

_GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")
# Ticks sent and not yet taken by the view: beyond this many a new tick is dropped (a
# view starved of CPU draws the latest ones when it runs; the ones between are redraws).
TICKS_AHEAD = 8
# How long the end of the run waits for the view's process to take "quit" and exit: it
# runs at low priority, and on a busy host (CI at nice 19 beside engines) it can be kept
# off the CPU for seconds.
QUIT_WAIT_S = 30.0
# Sweep and probe labels (measure.loads): rate4, conc8, rate=2.5, concurrency=8.
_LABEL = re.compile(r"^(rate|conc|concurrency)=?([0-9.]+)$")


def offered(label: str) -> str:
    """The load a point offers, read from its label: '4 req/s', '8 users', or '-'."""
    m = _LABEL.match(label)
    if not m:
        return "-"
    return f"{float(m[2]):g} req/s" if m[1] == "rate" else f"{int(float(m[2]))} users"


class EngineWatch:
    """Polls the engine's /metrics (canonical names) and the host CPU once a second."""

    def __init__(self, url: str | None, engine: str | None, interval_s: float = 1.0) -> None:
        self.url, self.engine, self.interval_s = url, engine, interval_s
        self.latest: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servetune-live", daemon=True)

    def start(self) -> EngineWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 5)

    def _run(self) -> None:
        import httpx
        import psutil

        psutil.cpu_percent(percpu=True)  # the first call only sets the baseline
        # One client for the run: a fresh one per poll builds its TLS context each time,
        # ~20 ms of CPU, most of the view's cost.
        with httpx.Client(timeout=self.interval_s) as client:
            while not self._stop.wait(self.interval_s):
                cores = psutil.cpu_percent(percpu=True)
                got = {"cpu_pct": sum(cores) / len(cores), "cpu_max_core_pct": max(cores)}
                if self.url and self.engine:
                    got |= self._engine(client)
                self.latest = got

    def _engine(self, client: Any) -> dict[str, float]:
        """The engine's running/waiting requests and KV usage (canonical names)."""
        import httpx

        from servetune.engines.metrics import canonical
        from servetune.engines.registry import adapter

        try:
            resp = client.get(f"{(self.url or '').rstrip('/')}/metrics")
            resp.raise_for_status()
        except httpx.HTTPError:
            return {}  # an engine busy or restarting: the view says "-" meanwhile
        # Parse only the three gauges' lines: a real engine's page is mostly histograms.
        names = tuple(n for k in _GAUGES if (n := adapter(self.engine or "").METRICS.get(k)))
        text = "\n".join(ln for ln in resp.text.splitlines() if ln.startswith(names))
        m = canonical(self.engine or "", text + "\n")
        return {k: v for k in _GAUGES if (v := m.get(k)) is not None}


def render(s: dict[str, Any], e: dict[str, float]) -> Text:
    """One point's view: the client's line, then the engine's and the host's. Plain text
    lines, not a table: a redraw then costs ~0.1 ms of the client's CPU instead of ~2."""
    total = f"/{s['total']}" if s.get("total") else ""

    def num(key: str, fmt: str) -> str:
        return "-" if key not in e else format(e[key], fmt)

    kv = "-" if "kv_cache_usage" not in e else f"{e['kv_cache_usage']:.0%}"
    pad = " " * len(s["label"])
    return Text.from_markup(
        f"[bold]{s['label']}[/]  offered {offered(s['label'])}  achieved "
        f"{s['rate_req_s']:.1f} req/s  {s['done']}{total} done  errors {s['errors']}  "
        f"{s['elapsed_s']:.0f}s\n"
        f"{pad}  TTFT p50/p99 {_ms(s['ttft_p50_ms'])}/{_ms(s['ttft_p99_ms'])} ms  "
        f"TPOT p50/p99 {_ms(s['tpot_p50_ms'])}/{_ms(s['tpot_p99_ms'])} ms\n"
        f"{pad}  engine running {num('requests_running', '.0f')} waiting "
        f"{num('requests_waiting', '.0f')}  KV {kv}  host CPU {num('cpu_pct', '.0f')}% "
        f"(busiest core {num('cpu_max_core_pct', '.0f')}%)"
    )


def _draw(ticks: Any, taken: Any, out: str | None) -> None:
    """The view's own process, at low priority: polls the engine and the host, draws each
    tick it is sent. Messages: a tick (dict), counted in `taken` (shared with the bench);
    ("target", url, engine) to watch an engine; None at the end of a point (the view
    clears); "quit", or the bench that started it gone, ends it."""
    import os
    import queue
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the bench's to handle
    os.nice(10)  # the client's sends come first
    parent = os.getppid()
    sink = open(out, "w") if out else sys.stderr  # noqa: SIM115 (open for the process's life)
    console = Console(file=sink, force_terminal=True)
    watch: EngineWatch | None = None
    live: Live | None = None
    while os.getppid() == parent:
        try:
            msg = ticks.get(timeout=1.0)
        except queue.Empty:
            continue
        if isinstance(msg, tuple):  # a new engine to watch
            if watch is not None:
                watch.stop()
            watch = EngineWatch(msg[1], msg[2]).start()
        elif msg is None or msg == "quit":  # the point ended, or the run
            if live is not None:
                live.stop()
                live = None
            if msg == "quit":
                break
        else:
            taken.value += 1  # room for the bench's next tick
            if live is None:
                live = Live(console=console, auto_refresh=False, transient=True)
                live.start()
            live.update(render(msg, watch.latest if watch else {}), refresh=True)
    if watch is not None:
        watch.stop()


class LiveView:
    """The `Hooks.live` of bench and tune: called with each progress tick, closed at the
    end of each point. `url`/`engine`: where the engine's /metrics are (None: host only);
    `out`: a file to draw to instead of stderr.

    The drawing and the polling run in a process of their own, started once, at low
    priority: the runner calls this on the client's event loop, and a view in the
    client's process (a rich redraw, a /metrics parse holding the GIL) cut the one-core
    client ceiling from 7,000 to 5,000 req/s in benchmarks/client_ceiling.py. Here a tick
    costs the client one non-blocking put of a small dict on a queue; while TICKS_AHEAD
    ticks wait untaken (a view starved of CPU), a new one is dropped, never waited for.

    The control messages (a new engine to watch, the end of a point, the end of the run)
    are never dropped, and never wait either: the queue itself is unbounded, only ticks
    are counted. A queue bounded at 8 for all messages once dropped them with the ticks
    when a starved view fell behind: the view never cleared, and its process outlived its
    stop and was terminated."""

    def __init__(self, url: str | None = None, engine: str | None = None, out: str | None = None):
        self.out = out
        self.proc: Any = None
        self.ticks: Any = None
        self.taken: Any = None  # ticks the view has taken (its process counts them)
        self.sent = 0  # ticks put on the queue
        self._target: tuple[str, str | None, str | None] = ("target", url, engine)

    def target(self, url: str | None, engine: str | None) -> None:
        """Point the view at another engine (a tuner trial's fresh launch)."""
        self._target = ("target", url, engine)
        if self.ticks is not None:
            self.ticks.put_nowait(self._target)

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no fork of a threaded client
        # Unbounded, so a control message always goes in at once; ticks are bounded by
        # the count the view keeps of those it took (`taken`, written by it alone).
        self.ticks = ctx.Queue()
        self.taken, self.sent = ctx.Value("Q", 0, lock=False), 0
        self.proc = ctx.Process(
            target=_draw,
            args=(self.ticks, self.taken, self.out),
            name="servetune-live",
            daemon=True,
        )
        self.proc.start()
        self.ticks.put_nowait(self._target)

    def __call__(self, s: dict[str, Any]) -> None:
        if self.proc is None:
            self._start()
        if self.sent - self.taken.value < TICKS_AHEAD:
            self.sent += 1
            self.ticks.put_nowait(s)

    def close(self) -> None:
        """End of a point: the view clears (its process stays for the next point)."""
        if self.ticks is not None:
            self.ticks.put_nowait(None)

    def shutdown(self) -> None:
        """End of the run: the view's process exits (it also does when the bench does).
        Waits up to QUIT_WAIT_S for a starved view to take "quit"; terminates it after."""
        if self.proc is None:
            return
        self.ticks.put_nowait("quit")
        self.proc.join(timeout=QUIT_WAIT_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5.0)
        self.ticks.close()
        self.proc = self.ticks = self.taken = None


def live_view(console: Console, url: str | None = None, engine: str | None = None):
    """A LiveView when `console` is a terminal; None when piped or redirected."""
    return LiveView(url, engine) if console.is_terminal else None
