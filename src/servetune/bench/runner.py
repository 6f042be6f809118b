"""Run one load point (or a sweep) against a real server and build its RunResult.

The parent materialises and serialises the requests, splits them over workers (in
process for small loads, one process per core above that), collects records as they
arrive (written to a JSONL log at once and streamed into the experiment store), runs the
circuit breaker and the progress display, scrapes the server's /metrics, and computes
every metric at the end from the raw records only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from servetune.aio import install_fast_loop, raise_fd_limit
from servetune.bench.client import Timeouts, spec_body
from servetune.bench.http import Target
from servetune.bench.server_metrics import Fetch, Scraper, running_now
from servetune.bench.sessions import SessionConfig, SessionWorker, session_config, session_payload
from servetune.bench.worker import Item, Worker, WorkerConfig, WorkerStats, process_main
from servetune.metrics.compute import (
    apply_memory_slo,
    client_warnings,
    compute_metrics,
    request_latencies_ms,
)
from servetune.metrics.decided import decided_miss
from servetune.metrics.turns import apply_turn_slo
from servetune.procfs import usable_cores
from servetune.results.files import RecordLog
from servetune.results.schema import ClientInfo, Load, RequestRecord, RunResult
from servetune.results.schema import Target as RunTarget
from servetune.slo import SLO
from servetune.status import RequestStatus, RunStatus
from servetune.workload.materialize import Request
from servetune.workload.session_plan import plan_sessions
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import Tokenizer

# Rough per-core capacity of one worker, used only to pick the worker count.
AUTO_RATE_PER_WORKER = 1000.0
AUTO_USERS_PER_WORKER = 256


class RecordStream(Protocol):
    """Where one run's records go as they are measured, then its final result."""

    def write(self, batch: list[dict[str, Any]]) -> None: ...

    def finish(self, result: RunResult | None) -> None: ...


class RunRecorder(Protocol):
    """The experiment store as the runner sees it (`store.writer.ResultStore`): a run
    begins with what is known up front; None when the store is off."""

    def begin(
        self, run_id: str, *, keep_text: bool = False, **fields: Any
    ) -> RecordStream | None: ...


@dataclass
class BenchOptions:
    url: str
    api_key: str | None = field(default=None, repr=False)  # never stored in results
    model: str | None = None
    engine: str | None = None  # recorded in the result, so its file says who served it
    config: dict[str, Any] | None = None  # the knobs given with --set (never guessed)
    timeouts: Timeouts = field(default_factory=Timeouts)
    workers: int | None = None  # None: auto
    keep_text: bool = True
    save_text: bool = False
    continuous_usage: bool = False
    cancel_fraction: float = 0.0
    cancel_after_chunks: int = 4
    breaker_error_rate: float | None = 0.5
    breaker_window: int = 50
    breaker_min_requests: int = 20
    # stop a point once its SLO miss is decided (`metrics.decided`): a tuner's probe asks
    # pass or fail, and a point that already failed only spends the study's time
    stop_when_missed: bool = False
    drain_s: float | None = None
    records_path: Path | None = None
    metrics_fetch: Fetch | None = None
    scrape_interval_s: float = 1.0
    tokenizer: Tokenizer | None = None
    headers: dict[str, str] = field(default_factory=dict)
    progress: Callable[[dict[str, Any]], None] | None = None
    store: RunRecorder | None = None  # None: --no-store


class BenchInterrupted(Exception):
    """Ctrl-C during a point; carries the partial result (already measured data kept)."""

    def __init__(self, result: RunResult) -> None:
        super().__init__("interrupted")
        self.result = result


def auto_workers(spec: WorkloadSpec) -> int:
    cores = usable_cores()
    arr = spec.arrival
    if arr.open_loop:
        need = (arr.rate or 1.0) / AUTO_RATE_PER_WORKER
    else:
        need = (arr.concurrency or 1) / AUTO_USERS_PER_WORKER
    return max(1, min(cores, math.ceil(need)))


def api_path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def build_items(spec: WorkloadSpec, requests: list[Request], opts: BenchOptions) -> list[Item]:
    """Serialise every request once, before the clock starts."""
    target = Target(opts.url)
    headers = dict(opts.headers)
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    path = api_path(spec.api)
    rng = np.random.default_rng([spec.seed, 7])
    cancel = rng.random(len(requests)) < opts.cancel_fraction if opts.cancel_fraction > 0 else None
    items: list[Item] = []
    for k, r in enumerate(requests):
        body = spec_body(
            spec,
            model=opts.model or spec.model,
            prompt=r.prompt,
            messages=r.messages,
            max_tokens=r.output_tokens,
            priority=r.priority,
            continuous_usage=opts.continuous_usage,
        )
        sched = None if r.arrival_s is None else int(r.arrival_s * 1e9)
        cancel_after = opts.cancel_after_chunks if cancel is not None and cancel[k] else None
        items.append((r.index, target.request_bytes(path, body, headers), sched, cancel_after))
    # Workers send their items in list order, each when its offset comes: a trace whose
    # lines are out of timestamp order would be sent late (and read as client send lag).
    # Stable, so equal offsets and closed loops (no offsets) keep their order.
    items.sort(key=lambda it: it[2] or 0)
    return items


def split_configs(
    spec: WorkloadSpec, items: list[Item], opts: BenchOptions, n_workers: int
) -> list[WorkerConfig]:
    """Deal the requests over workers in proportion to their share of the load.

    The load is a number of slots: a closed loop's users, a capped open loop's cap (an
    uncapped one: one slot per worker). No worker gets fewer than one slot, so there are
    never more workers than slots: a worker with none took its share of the count with it
    (`--concurrency 1 --workers 2 --count 8` sent 4), and two workers capped at 1 each
    had 2 in flight under `--max-concurrency 1`. Item k goes to the owner of slot
    k % slots, so each worker's items (and its share of the count) follow its slots: 3
    users on 2 workers send 2/3 and 1/3 of the count, so every worker's users run about
    as many rounds (split evenly, the lone user ran on alone, below the concurrency)."""
    arr = spec.arrival
    closed = not arr.open_loop
    drain = opts.drain_s if opts.drain_s is not None else (opts.timeouts.total_s or 600.0)
    # a closed loop's users; an open loop's cap (uncapped: one slot per worker)
    slots = (arr.concurrency or 1) if closed else (arr.concurrency or n_workers)
    n_workers = max(1, min(n_workers, slots))

    def share(total: int, w: int) -> int:
        """How many of `total` slots, dealt round-robin, worker `w` owns."""
        return total // n_workers + (1 if w < total % n_workers else 0)

    mine: list[list[Item]] = [[] for _ in range(n_workers)]
    for k, item in enumerate(items):
        mine[k % slots % n_workers].append(item)
    cfgs = []
    for w in range(n_workers):
        slot_share = share(slots, w)  # its users, or its part of the cap
        count = None
        if closed and spec.count:  # its share of the count, in step with its items
            count = spec.count // slots * slot_share + share(spec.count % slots, w)
        cfgs.append(
            WorkerConfig(
                worker_id=w,
                url=opts.url,
                items=mine[w],
                closed_loop=closed,
                users=slot_share if closed else 1,
                cap=slot_share if (not closed and arr.concurrency) else None,
                max_requests=count,
                duration_s=spec.duration_s if closed else None,
                drain_s=drain,
                timeouts=opts.timeouts,
                stream=spec.stream,
                keep_text=opts.keep_text,
            )
        )
    return [c for c in cfgs if c.items]


def session_worker(
    spec: WorkloadSpec, requests: list[Request], opts: BenchOptions
) -> SessionConfig:
    """Sessions run in one in-process worker that chains every session's turns
    (`bench.sessions`); `requests` carry each turn's new messages. The plan is counted
    with the tokenizer `requests` were made with, so max_tokens and the context cap are in
    its tokens, not in words."""
    headers = dict(opts.headers)
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    (base,) = split_configs(spec, [(0, b"", None, None)], opts, 1)
    payload = session_payload(spec, opts.model or spec.model, api_path(spec.api), headers, opts.url)
    plan = plan_sessions(spec, opts.tokenizer, with_text=False)
    return session_config(base, plan, requests, payload)


class Collector:
    """Receives record batches from workers: logs and stores them, feeds the breaker
    and progress."""

    def __init__(
        self,
        requests: list[Request],
        opts: BenchOptions,
        total: int,
        label: str,
        early: tuple[SLO, int] | None = None,
    ) -> None:
        self.by_index = {r.index: r for r in requests}
        self.pool = len(requests)
        self.opts = opts
        self.log = RecordLog(opts.records_path, opts.save_text)
        self.stored: RecordStream | None = None
        self.records: list[RequestRecord] = []
        self.recent: deque[bool] = deque(maxlen=opts.breaker_window)
        self.recent_ttft_ms: deque[float] = deque(maxlen=2000)
        self.recent_tpot_ms: deque[float] = deque(maxlen=2000)
        self.errors = 0
        self.tripped: str | None = None
        # `early`: the SLO and the most requests the run sends, to stop once its miss is
        # decided (`metrics.decided`); what that needs is kept whole, not windowed
        self.early = early
        self.missed = False  # the run stopped because its SLO miss was decided
        self.ended = 0
        self.latencies: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []}
        self.total = total
        self.label = label
        self.t0_ns = time.monotonic_ns()
        self._last_progress = 0

    def add(self, batch: list[dict[str, Any]]) -> None:
        self.log.write(batch)
        for d in batch:
            req = self.by_index.get(d["index"] % self.pool if self.pool else d["index"])
            if req is not None:
                d.update(
                    sub=req.sub,
                    priority=req.priority,
                    prefix_group=req.prefix_group,
                    prompt_tokens=req.prompt_tokens,
                    max_tokens=req.output_tokens,
                )
            rec = RequestRecord.model_construct(**d)
            self.records.append(rec)
            if rec.status in (RequestStatus.OK, RequestStatus.ERROR):
                self.recent.append(rec.status == RequestStatus.ERROR)
            if rec.status != RequestStatus.ABORTED:
                self.ended += 1
            if rec.status == RequestStatus.ERROR:
                self.errors += 1
            elif rec.status == RequestStatus.OK and rec.chunk_ns:
                ttft, tpot, e2e = request_latencies_ms(rec)  # the metric contract's own
                self.recent_ttft_ms.append(ttft)
                if tpot is not None:
                    self.recent_tpot_ms.append(tpot)
                if self.early is not None:
                    for k, v in (("ttft_ms", ttft), ("tpot_ms", tpot), ("e2e_ms", e2e)):
                        if v is not None:
                            self.latencies[k].append(v)
        if self.stored is not None:
            self.stored.write(batch)
        lim = self.opts.breaker_error_rate
        if (
            lim is not None
            and self.tripped is None
            and len(self.recent) >= min(self.opts.breaker_min_requests, self.recent.maxlen or 1)
            and sum(self.recent) / len(self.recent) > lim
        ):
            self.tripped = (
                f"circuit breaker: {sum(self.recent)}/{len(self.recent)} of the latest requests "
                f"failed (> {lim:.0%})"
            )
        if self.early is not None and self.tripped is None:
            slo, planned = self.early
            why = decided_miss(slo, planned, self.ended, self.latencies, self.errors)
            if why is not None:
                self.tripped, self.missed = f"the SLO is already missed: {why}", True
        self.tick()

    def tick(self, force: bool = False) -> None:
        if self.opts.progress is None:
            return
        now = time.monotonic_ns()
        if not force and now - self._last_progress < 250_000_000:
            return
        self._last_progress = now
        elapsed = max((now - self.t0_ns) / 1e9, 1e-9)
        ttft = sorted(self.recent_ttft_ms)
        tpot = sorted(self.recent_tpot_ms)

        def pct(xs: list[float], q: float) -> float | None:
            return xs[int(q * (len(xs) - 1))] if xs else None

        self.opts.progress(
            {
                "label": self.label,
                "done": len(self.records),
                "total": self.total,
                "errors": self.errors,
                "elapsed_s": elapsed,
                "rate_req_s": len(self.records) / elapsed,
                "ttft_p50_ms": pct(ttft, 0.5),
                "ttft_p99_ms": pct(ttft, 0.99),
                "tpot_p50_ms": pct(tpot, 0.5),
                "tpot_p99_ms": pct(tpot, 0.99),
            }
        )


def _run_in_process(
    cfg: WorkerConfig, col: Collector, on_anchor: Callable[[int], None]
) -> tuple[list[WorkerStats], int, str, bool]:
    raise_fd_limit()
    loop_name = install_fast_loop()
    cfg.flush_s = 0.0
    holder: dict[str, Worker] = {}
    anchor = time.monotonic_ns() + 50_000_000
    on_anchor(anchor)

    def sink(batch: list[dict[str, Any]]) -> None:
        col.add(batch)
        if col.tripped and "worker" in holder:
            holder["worker"].stop(col.tripped)

    async def main() -> WorkerStats:
        worker = SessionWorker(cfg, sink) if isinstance(cfg, SessionConfig) else Worker(cfg, sink)
        holder["worker"] = worker
        return await worker.run(anchor)

    interrupted = False
    stats: list[WorkerStats] = []
    try:
        stats = [asyncio.run(main())]
    except KeyboardInterrupt:
        interrupted = True
    return stats, anchor, loop_name, interrupted


def _run_processes(
    cfgs: list[WorkerConfig], col: Collector, on_anchor: Callable[[int], None]
) -> tuple[list[WorkerStats], int, bool]:

    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for cfg in cfgs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=process_main, args=(child, cfg), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    stats: list[WorkerStats] = []
    interrupted = False
    stopped = False
    anchor = time.monotonic_ns()
    try:
        for c in conns:  # every worker imported and serialised: start together
            if not c.poll(120):
                raise RuntimeError("a bench worker did not start")
            c.recv()
        anchor = time.monotonic_ns() + 100_000_000
        on_anchor(anchor)
        for c in conns:
            c.send(anchor)
        live = list(conns)
        while live:
            try:
                ready = wait(live, timeout=0.25)
                for c in ready:
                    try:
                        kind, payload = c.recv()  # type: ignore[misc]
                    except EOFError:
                        live.remove(c)  # type: ignore[arg-type]
                        continue
                    if kind == "records":
                        col.add(payload)
                    elif kind == "done":
                        stats.append(payload)
                        live.remove(c)  # type: ignore[arg-type]
                col.tick()
                if col.tripped and not stopped:
                    stopped = True
                    _broadcast(conns, ("stop", col.tripped))
            except KeyboardInterrupt:
                interrupted = True
                if not stopped:
                    stopped = True
                    _broadcast(conns, ("stop", "interrupted"))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    return stats, anchor, interrupted


def _broadcast(conns: list[Any], msg: tuple[str, str]) -> None:
    for c in conns:
        with contextlib.suppress(BrokenPipeError, OSError):
            c.send(msg)


# Errors that mean no connection was made at all (results.schema.ERROR_CLASSES); a reset
# after the request was sent is the server's answer, measured like any other error.
UNREACHABLE_ERRORS = frozenset({"connect_error", "connect_timeout"})


# HTTP answers that say what was asked is not served at all (not found, method not
# allowed, not implemented): a web server that is not an OpenAI one, a model name the
# server does not serve (vLLM answers 404). Other 4xx/5xx are the
# server's answers to the load, measured (and `--breaker` stops a run of them).
NOT_SERVED = frozenset({404, 405, 501})


def unreachable_cause(records: list[RequestRecord]) -> str | None:
    """The run measured nothing: no request got an answer, and every one that failed
    could not connect, or was told the route is not served (`NOT_SERVED`; the readiness
    check passes a plain web server, whose /v1/models is a 404). One line with the most
    common cause; None otherwise."""
    errors = [r for r in records if r.status == RequestStatus.ERROR]
    answered = [r for r in records if r.status in (RequestStatus.OK, RequestStatus.CANCELLED)]
    if not errors or answered:
        return None
    detail, _ = Counter(r.error_detail or r.error for r in errors).most_common(1)[0]
    detail = " ".join(str(detail).split())  # one line: an HTML error page spans many
    detail = detail if len(detail) <= 160 else detail[:157] + "..."
    if all(r.error in UNREACHABLE_ERRORS for r in errors):
        return f"no request reached the server ({len(errors)} failed): {detail}"
    if all(r.http_status in NOT_SERVED for r in errors):
        return f"the server served none of the {len(errors)} requests (not served): {detail}"
    return None


def _early(spec: WorkloadSpec, opts: BenchOptions, slo: SLO | None) -> tuple[SLO, int] | None:
    """What stopping once the SLO miss is decided needs: the SLO and the most requests the
    point sends. Only where the records alone bound the outcome: a streamed run of a set
    count (a run sized by its duration has no bound) that measures every request it sends
    (a warm-up or cool-down leaves some out) and no multi-turn sessions."""
    if not opts.stop_when_missed or slo is None or not spec.stream or spec.sessions is not None:
        return None
    if spec.count is None or spec.warmup_s or spec.cooldown_s:
        return None
    return slo, spec.count


def run_point(
    spec: WorkloadSpec,
    requests: list[Request],
    opts: BenchOptions,
    slo: SLO | None = None,
    label: str = "",
) -> RunResult:
    """Measure one load point. Ctrl-C raises BenchInterrupted carrying the partial result."""
    if spec.sessions is not None:
        cfgs: list[WorkerConfig] = [session_worker(spec, requests, opts)]
        total = len(requests)
    else:
        items = build_items(spec, requests, opts)
        n_workers = opts.workers or auto_workers(spec)
        cfgs = split_configs(spec, items, opts, n_workers)
        total = spec.count or len(items) if (spec.count or spec.arrival.open_loop) else 0
    col = Collector(requests, opts, total, label, _early(spec, opts, slo))
    started_unix = time.time()
    created = datetime.now(timezone.utc)
    run_id = f"bench-{created:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    load = Load.of(spec.arrival)
    target = RunTarget(
        url=opts.url,
        api=spec.api,
        model=opts.model or spec.model,
        engine=opts.engine,
        config=opts.config,
    )
    # the workload and SLO ride in the header, so a killed run's log imports with its
    # warm-up, cool-down and goodput (store.transfer._header_plan)
    col.log.header(
        {
            "id": run_id,
            "load": load.model_dump(mode="json"),
            "url": opts.url,
            "workload": spec.model_dump(mode="json"),
            "slo": None if slo is None else slo.model_dump(mode="json"),
        }
    )
    if opts.store is not None:
        col.stored = opts.store.begin(
            run_id,
            keep_text=opts.save_text,
            created_utc=created.isoformat(timespec="seconds"),
            target=target,
            workload=spec.model_dump(mode="json"),
            load=load,
        )
    scraper = Scraper(opts.metrics_fetch, opts.scrape_interval_s) if opts.metrics_fetch else None
    cpu0 = time.process_time()
    wall0 = time.monotonic_ns()

    def on_anchor(anchor_ns: int) -> None:
        if scraper is not None:
            scraper.start(anchor_ns)

    loop_name = "uvloop"
    if len(cfgs) <= 1:
        if not cfgs:
            raise ValueError("the workload has no requests to send")
        stats, anchor, loop_name, interrupted = _run_in_process(cfgs[0], col, on_anchor)
    else:
        stats, anchor, interrupted = _run_processes(cfgs, col, on_anchor)
    wall_s = (time.monotonic_ns() - wall0) / 1e9
    parent_cpu = time.process_time() - cpu0
    col.tick(force=True)
    col.log.close()

    server = None
    cancellation = None
    if scraper is not None:
        server = scraper.stop()
        n_cancel = sum(r.status == RequestStatus.CANCELLED for r in col.records)
        if n_cancel:
            time.sleep(min(2.0, opts.scrape_interval_s))
            after = scraper.sample()
            running = running_now(after) if after else None
            cancellation = {
                "cancelled": n_cancel,
                "running_after_run": running,
                "freed": None if running is None else running == 0,
            }

    records = col.records
    if opts.tokenizer is not None and opts.keep_text:
        tok = opts.tokenizer
        for r in records:
            if r.output_text is not None and r.status == RequestStatus.OK:
                r.tokenizer_completion_tokens = len(tok.encode(r.output_text))
    records.sort(key=lambda r: (r.send_ns, r.index))
    metrics = compute_metrics(
        records,
        warmup_s=spec.warmup_s,
        cooldown_s=spec.cooldown_s,
        slo=slo,
        stream=spec.stream,
    )
    if slo is not None:
        apply_turn_slo(metrics, records, slo, spec)
    apply_memory_slo(metrics, slo, server.peak("kv_cache_usage") if server else None)
    worker_cpu = sum(s.cpu_s for s in stats) if len(cfgs) > 1 else 0.0
    cpu_s = parent_cpu + worker_cpu
    if len(cfgs) > 1:
        cpu_util = max((s.cpu_s / s.wall_s for s in stats if s.wall_s > 0), default=0.0)
    else:
        cpu_util = parent_cpu / wall_s if wall_s > 0 else 0.0
    warnings = client_warnings(metrics, open_loop=spec.arrival.open_loop, cpu_util=cpu_util)
    lag = max((s.loop_lag_p99_ms for s in stats), default=0.0)
    if lag > 10.0:
        warnings.append(f"event-loop lag P99 {lag:.1f} ms")
    client = ClientInfo(
        workers=max(1, len(cfgs)),
        cpu_s=cpu_s,
        cpu_util=cpu_util,
        event_loop=loop_name,
        loop_lag_p99_ms=lag,
        bottleneck=bool(warnings),
        warnings=warnings,
    )
    status = RunStatus.COMPLETED
    unreachable = unreachable_cause(records)
    if interrupted:
        status = RunStatus.INTERRUPTED
    elif unreachable:
        status = RunStatus.FAILED
    elif col.missed:
        status = RunStatus.SLO_MISSED
    elif col.tripped:
        status = RunStatus.CIRCUIT_BREAKER
    result = RunResult(
        id=run_id,
        created_utc=created.isoformat(timespec="seconds"),
        target=target,
        workload=spec.model_dump(mode="json"),
        load=load,
        slo=slo,
        status=status,
        stop_reason=unreachable or col.tripped if status != RunStatus.COMPLETED else None,
        anchor_ns=anchor,
        started_unix_s=started_unix,
        duration_s=wall_s,
        client=client,
        requests=requests,
        records=records,
        metrics=metrics,
        server=server,
        cancellation=cancellation,
    )
    if col.stored is not None:
        col.stored.finish(result)
    if interrupted:
        raise BenchInterrupted(result)
    return result
