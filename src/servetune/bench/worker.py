"""The sending side: one event loop, one connection pool, exact pacing.

A worker runs in the parent (small loads) or in its own process (one per core). It
imports nothing heavy, gets its requests pre-serialised, and streams finished records
to a sink in batches, so a crash or Ctrl-C loses at most the last 100 ms.

Open loop: every send is anchored to the precomputed schedule (anchor + offset), never
to the previous send, so a slow server cannot slow the offered load (coordinated
omission); with a concurrency cap, requests wait in a visible client queue
(`queue_ns`) and the send lag shows it. Closed loop: `users` senders, each starting its
next request from the completion callback of the previous one.
"""

from __future__ import annotations

import asyncio
import gc
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servetune.aio import install_fast_loop, raise_fd_limit
from servetune.bench.client import RequestState, Timeouts
from servetune.bench.http import Connection, Pool, Target, connect_cause
from servetune.status import RequestStatus

_now_ns = time.monotonic_ns

# (index, request bytes, scheduled offset ns or None, cancel after N chunks or None)
Item = tuple[int, bytes, int | None, int | None]


@dataclass
class WorkerConfig:
    worker_id: int
    url: str
    items: list[Item]
    closed_loop: bool
    users: int = 1
    cap: int | None = None
    max_requests: int | None = None
    duration_s: float | None = None
    drain_s: float = 60.0
    timeouts: Timeouts = field(default_factory=Timeouts)
    stream: bool = True
    keep_text: bool = False
    flush_s: float = 0.1  # 0: hand every record over at once (in-process runs)


@dataclass
class WorkerStats:
    worker_id: int
    cpu_s: float = 0.0
    wall_s: float = 0.0
    sent: int = 0
    connections_opened: int = 0
    loop_lag_p99_ms: float = 0.0
    stopped: str | None = None


class Worker:
    def __init__(self, cfg: WorkerConfig, sink: Callable[[list[dict[str, Any]]], None]) -> None:
        self.cfg = cfg
        self.sink = sink
        self.pool = Pool(Target(cfg.url), cfg.timeouts.connect_s or 3600.0)
        self.anchor_ns = 0
        self.out: list[dict[str, Any]] = []
        self.in_flight: set[RequestState] = set()
        self.waiting: deque[tuple[Item, int]] = deque()
        self.sent = 0
        self.issuing = True
        self.stop_reason: str | None = None
        self._sending_over_ns: int | None = None  # when the last request was issued
        self._next = 0
        self._retried: set[int] = set()
        self._idle: asyncio.Event | None = None
        self._items_by_index = {it[0]: it for it in cfg.items}
        self._lags_ms: list[float] = []

    # --- starting requests -------------------------------------------------------------
    def _start(
        self,
        item: Item,
        queued_since_ns: int | None = None,
        fresh: bool = False,
        first: RequestState | None = None,
    ) -> None:
        """Send `item`: on an idle connection unless `fresh`; `first`, the attempt it sends
        again, whose send and queue times it keeps (the time lost counts)."""
        index, payload, sched, cancel_after = item
        cfg = self.cfg
        st = RequestState(
            index,
            stream=cfg.stream,
            on_done=self._done,
            timeouts=cfg.timeouts,
            scheduled_ns=None if sched is None else self.anchor_ns + sched,
            cancel_after=cancel_after,
            keep_text=cfg.keep_text,
        )
        now = _now_ns()
        st.send_ns = now
        if queued_since_ns is not None:
            st.queue_ns = now - queued_since_ns
        if first is not None:
            st.send_ns, st.queue_ns = first.send_ns, first.queue_ns
        self.in_flight.add(st)
        self.sent += 1
        conn = None if fresh else self.pool.get_idle()
        if conn is not None:
            st.sent(conn, conn.send(payload, st))
        else:
            asyncio.get_running_loop().create_task(self._connect_and_send(st, payload))

    async def _connect_and_send(self, st: RequestState, payload: bytes) -> None:
        t0 = _now_ns()
        try:
            conn: Connection = await self.pool.connect()
        except (TimeoutError, asyncio.TimeoutError) as exc:
            st.fail(
                "connect_timeout", connect_cause(exc, self.pool.target, self.pool.connect_timeout_s)
            )
            return
        except OSError as exc:
            kind = "client_error" if exc.errno == 24 else "connect_error"  # EMFILE
            st.fail(kind, connect_cause(exc, self.pool.target, self.pool.connect_timeout_s))
            return
        if st.done:  # stopped while connecting
            conn.close()
            return
        st.connect_ns = _now_ns() - t0
        st.sent(conn, conn.send(payload, st))

    def _done(self, st: RequestState) -> None:
        self.in_flight.discard(st)
        conn = st.conn
        if (
            st.error == "connection_reset"
            and conn is not None
            and conn.uses > 1
            and not conn.got_bytes
            and st.index not in self._retried
        ):
            # A reused keep-alive connection the server had closed: retry once, on a new
            # connection (another idle one may be as stale: the server that dropped one
            # often dropped them all, and a retry on it was recorded as a reset). A server
            # that read the request and hung up reads the same, so the record says it was
            # sent again (`resent`) and its times count from the first send.
            self._retried.add(st.index)
            self.sent -= 1
            self._start(self._items_by_index[st.index], fresh=True, first=st)
            return
        self.out.append(self._record(st))
        if self.cfg.flush_s <= 0:  # in-process: the breaker sees every record at once
            self.flush()
        if self.issuing:
            if self.cfg.closed_loop:
                item = self._take()
                if item is not None:
                    self._start(item)
            elif self.waiting:
                item, since = self.waiting.popleft()
                self._start(item, since)
        if not self.in_flight and self._idle is not None:
            self._idle.set()

    def _record(self, st: RequestState) -> dict[str, Any]:
        a = self.anchor_ns
        return {
            "index": st.index,
            "worker": self.cfg.worker_id,
            "scheduled_ns": None if st.scheduled_ns is None else st.scheduled_ns - a,
            "queue_ns": st.queue_ns,
            "send_ns": st.send_ns - a,
            "connect_ns": st.connect_ns,
            "first_event_ns": None if st.first_event_ns is None else st.first_event_ns - a,
            "first_answer_ns": None if st.first_answer_ns is None else st.first_answer_ns - a,
            "chunk_ns": [t - a for t in st.chunk_ns],
            "chunk_tokens": st.chunk_tokens,
            "end_ns": st.end_ns - a,
            "status": st.status,
            "error": st.error,
            "error_detail": st.detail,
            "http_status": st.http_status,
            "finish_reason": st.finish_reason,
            "usage_prompt_tokens": st.usage_prompt,
            "usage_completion_tokens": st.usage_completion,
            "server_timings": st.timings,
            "output_text": "".join(st.texts) if st.texts is not None else None,
            "resent": st.index in self._retried,
        }

    def _take(self) -> Item | None:
        """Next request of a closed loop, or None when the run is over."""
        cfg = self.cfg
        if cfg.max_requests is not None and self.sent >= cfg.max_requests:
            return self._sending_over()
        if cfg.duration_s is not None and _now_ns() >= self.anchor_ns + cfg.duration_s * 1e9:
            return self._sending_over()
        if self._next >= len(cfg.items):
            if cfg.duration_s is None:
                return self._sending_over()
            self._next = 0  # duration-bound: cycle through the pool
        item = cfg.items[self._next]
        self._next += 1
        return item

    def _sending_over(self) -> None:
        """Mark the end of sending: the drain limit counts from here (`run`), and the run
        loop wakes to start counting it."""
        if self._sending_over_ns is None:
            self._sending_over_ns = _now_ns()
            if self._idle is not None:
                self._idle.set()

    # --- the run -----------------------------------------------------------------------
    async def _pace(self) -> None:
        cap = self.cfg.cap
        for item in self.cfg.items:
            if not self.issuing:
                return
            target = self.anchor_ns + (item[2] or 0)
            now = _now_ns()
            # Never early: the loop's timers round to ~1 ms, so sleep again for any rest.
            while target - now > 20_000:
                await asyncio.sleep((target - now) / 1e9)
                now = _now_ns()
            if not self.issuing:
                return
            if cap is not None and len(self.in_flight) >= cap:
                self.waiting.append((item, _now_ns()))
            else:
                self._start(item)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(max(self.cfg.flush_s, 0.1))
            self.flush()

    async def _lag_loop(self) -> None:
        """Event-loop lag: how late a 10 ms sleep wakes up (client saturation signal)."""
        while True:
            t = _now_ns()
            await asyncio.sleep(0.01)
            self._lags_ms.append(max(0.0, (_now_ns() - t) / 1e6 - 10.0))

    def flush(self) -> None:
        if self.out:
            batch, self.out = self.out, []
            self.sink(batch)

    def stop(self, reason: str) -> None:
        """Stop issuing and abort everything in flight (circuit breaker, Ctrl-C)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.issuing = False
        self.waiting.clear()
        for st in list(self.in_flight):
            st.abort(RequestStatus.ABORTED, None, f"run stopped: {reason}")
        if self._idle is not None:
            self._idle.set()

    async def run(self, anchor_ns: int) -> WorkerStats:
        self.anchor_ns = anchor_ns
        self._idle = asyncio.Event()
        # No full (oldest-generation) garbage collection while sending: it walks every
        # record kept so far and stalled the loop for 25+ ms at 1,500 req/s, which is
        # send lag and TTFT. Young collections (short) still run; the full one is only
        # deferred to the end of the run.
        gc_threshold = gc.get_threshold()
        gc.set_threshold(gc_threshold[0], gc_threshold[1], 1 << 30)
        cpu0, wall0 = time.process_time(), _now_ns()
        flusher = asyncio.create_task(self._flush_loop())
        lagger = asyncio.create_task(self._lag_loop())
        try:
            delay = (anchor_ns - _now_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            if self.cfg.closed_loop:
                for _ in range(self.cfg.users):
                    item = self._take()
                    if item is None:
                        break
                    self._start(item)
            else:
                await self._pace()
                self._sending_over()
            # Wait for the stragglers, then abort them. The drain limit counts from the end
            # of sending: a closed loop sends as answers come back, so from its start it
            # cut a 20-request loop at `--total-timeout 0.5` after 10, the other 10
            # never sent and nothing said (each request has its own timeouts meanwhile).
            drain_ns = int(self.cfg.drain_s * 1e9)
            while self.in_flight or self.waiting:
                over = self._sending_over_ns
                left = None if over is None else (over + drain_ns - _now_ns()) / 1e9
                if left is not None and left <= 0:
                    break
                self._idle.clear()
                if not self.in_flight and self.waiting:
                    item, since = self.waiting.popleft()
                    self._start(item, since)
                    continue
                try:
                    await asyncio.wait_for(self._idle.wait(), left)
                except (TimeoutError, asyncio.TimeoutError):
                    break
            if self.in_flight:
                self.stop("drain limit reached")
        except asyncio.CancelledError:
            self.stop("interrupted")
            raise
        finally:
            gc.set_threshold(*gc_threshold)
            flusher.cancel()
            lagger.cancel()
            self.flush()
            self.pool.close()
        lags = sorted(self._lags_ms)
        return WorkerStats(
            worker_id=self.cfg.worker_id,
            cpu_s=time.process_time() - cpu0,
            wall_s=(_now_ns() - wall0) / 1e9,
            sent=self.sent,
            connections_opened=self.pool.opened,
            loop_lag_p99_ms=lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
            stopped=self.stop_reason,
        )


def process_main(conn: Any, cfg: WorkerConfig) -> None:
    """Entry point of a worker process: ready -> anchor -> run -> records... -> done.

    Records go to the parent from a sender thread: a batch can be larger than the pipe's
    buffer, and a blocking send on the event loop would stall it (send lag) whenever the
    parent is slow to read; the thread waits instead, without the GIL."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    raise_fd_limit()
    install_fast_loop()
    outbox: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()

    def send_all() -> None:
        while (msg := outbox.get()) is not None:
            try:
                conn.send(msg)
            except (BrokenPipeError, OSError):
                return  # parent gone

    sender = threading.Thread(target=send_all, daemon=True, name="records-sender")

    def sink(batch: list[dict[str, Any]]) -> None:
        outbox.put(("records", batch))

    async def main() -> WorkerStats:
        worker = Worker(cfg, sink)
        loop = asyncio.get_running_loop()
        conn.send(("ready", os.getpid()))
        anchor = await loop.run_in_executor(None, conn.recv)
        sender.start()

        def on_msg() -> None:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("stop", "parent gone")
            if msg[0] == "stop":
                worker.stop(msg[1])

        loop.add_reader(conn.fileno(), on_msg)
        # libuv (uvloop) makes a polled fd non-blocking; the pipe is duplex, so the sender
        # thread's big batches would then be half-written (EAGAIN) and corrupt the stream.
        os.set_blocking(conn.fileno(), True)
        try:
            return await worker.run(anchor)
        finally:
            loop.remove_reader(conn.fileno())

    stats = asyncio.run(main())
    outbox.put(("done", stats))
    outbox.put(None)
    sender.join()
    conn.close()
