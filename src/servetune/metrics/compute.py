"""The metric contract (docs/metrics.md; DESIGN.md "Metric contract"), as pure functions.

Inputs are raw records with monotonic-ns timestamps; nothing here does I/O, so `bench`
and `simulate` compute identical figures from identical records.

Speed (benchmarks/sim_speed.py): `compute_metrics` uses columns (numpy arrays over all records at
once), not per record. Records become columns through `record_columns`; a record
container may hand over its own columns (`columns()`: the simulator's lazy records keep
chunk times as ranges into one array of step ends, so 100,000 x 256 chunk timestamps are
never materialised). Every figure is computed with the same float operations, in the
same order, as the per-record definitions below, so the results are identical.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from servetune.metrics.buffering import MAX_MS_PER_TOKEN, buffered_mask, run_is_buffered
from servetune.metrics.pct import fmt_ms, is_max_only, min_samples
from servetune.metrics.stats import summarize, summarize_weighted
from servetune.results.schema import Dist, Load, Metrics, RequestRecord, SLOCheck
from servetune.slo import SLO
from servetune.status import RequestStatus

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
# A request's status in the columns: its RequestStatus's position, as a small int.
STATUS_CODES: dict[str, int] = {s.value: i for i, s in enumerate(RequestStatus)}


# --- per-record definitions (the contract; the columnar code below computes the same) ---


def measurement_window(
    records: Sequence[RequestRecord], warmup_s: float = 0.0, cooldown_s: float = 0.0
) -> tuple[int, int, bool]:
    """(start_ns, end_ns, fell_back). The window runs from the first send + warm-up to the
    last send - cool-down: ramp-up and the drain after the last send are excluded
    (field notes: vLLM #18475, GuideLLM #93 count them in throughput). If that leaves
    nothing (tiny runs), the whole run, first send to last end, is used and flagged."""
    if not records:
        return 0, 0, True
    return _window(record_columns(records), warmup_s, cooldown_s)


def request_latencies_ms(r: RequestRecord) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT, E2E) of one request, ms. TTFT: send -> first content chunk (role-only
    chunks excluded). E2E: send -> last content chunk (not the trailing usage/[DONE]).
    TPOT: (E2E - TTFT) / (output_tokens - 1), vLLM's definition; None below 2 tokens."""
    if not r.chunk_ns:
        return None, None, None
    ttft = (r.chunk_ns[0] - r.send_ns) / NS_PER_MS
    e2e = (r.chunk_ns[-1] - r.send_ns) / NS_PER_MS
    n = r.output_tokens
    timed = has_tpot(n, len(r.chunk_ns), r.chunk_ns[0], r.chunk_ns[-1])
    tpot = (e2e - ttft) / (n - 1) if timed else None
    return ttft, tpot, e2e


def has_tpot(tokens: Any, chunks: Any, first_ns: Any, last_ns: Any) -> Any:
    """Whether a request's TPOT was measured (scalars or numpy arrays): 2+ tokens in 2+
    content chunks that did not all arrive at once (faster than any real decode,
    `buffering.MAX_MS_PER_TOKEN` a token). Why the last: a client (or an API server) the
    host descheduled reads every event it owes in one read or a few microseconds apart
    (`bench.http` stamps a read). That answer's E2E - TTFT is ~0 because its decode went
    into its TTFT, not because decode was free: no measurement (vLLM-CPU beside the test
    suite: 13 of 24 answers so, a P50 TPOT of ~0.01 ms; beside two CPU hogs, P50 0)."""
    floor_ns = MAX_MS_PER_TOKEN * NS_PER_MS * (tokens - 1)
    return (tokens >= 2) & (chunks >= 2) & (last_ns - first_ns > floor_ns)


def itl_samples_ms(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(pooled, per_token). Pooled: every gap between consecutive content chunks, once per
    gap, pooled over requests (vLLM/SGLang ITL). Per-token: a gap before a chunk of k
    tokens becomes k samples of gap/k (genai-perf's division by the chunk's tokens)."""
    cols = record_columns(records)
    (pooled, _), (per_tok, _) = cols.chunks.gaps_ms(np.ones(cols.n, dtype=bool))
    return pooled, per_tok


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most requests the client had on the wire at once (send -> end)."""
    cols = record_columns(records)
    return _max_in_flight(cols.send, cols.end)


def meets_slo(r: RequestRecord, thresholds: dict[str, float]) -> bool:
    """A request counts toward goodput when it completed and every threshold holds."""
    if r.status != RequestStatus.OK:
        return False
    ttft, tpot, e2e = request_latencies_ms(r)
    vals = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}
    for k, limit in thresholds.items():
        v = vals.get(k)
        if v is None:
            if k == "tpot_ms":  # fewer than 2 tokens: TPOT undefined, not a miss
                continue
            return False
        if v > limit:
            return False
    return True


# --- columns ---------------------------------------------------------------------------


class ChunkSource(Protocol):
    """Where the per-chunk data of the records lives (flat arrays, or sim step ranges)."""

    def largest_gap_ns(self) -> np.ndarray:
        """Per record, the longest wait between two of its chunks, or a lower bound of it
        (0 with fewer than two chunks)."""
        ...

    def gaps_ms(
        self, keep: np.ndarray
    ) -> tuple[tuple[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]:
        """((pooled, counts), (per_token, counts)) over the records where `keep`;
        counts None means one sample per value, in record order."""
        ...


@dataclass
class FlatChunks:
    """Chunks of all records concatenated in record order (`lens` per record)."""

    ns: np.ndarray
    tok: np.ndarray
    lens: np.ndarray

    def _owner(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.lens)), self.lens)

    def largest_gap_ns(self) -> np.ndarray:
        """Per record, the longest wait between two of its chunks (0 with fewer than two).
        `buffering` leaves it out of a burst's span: a client descheduled once while it
        parses a burst stamps one long gap into it (seen: 5-15 ms among 23 gaps of 0)."""
        out = np.zeros(len(self.lens), dtype=np.int64)
        has = self.lens >= 2
        if not has.any():
            return out
        starts = np.cumsum(self.lens) - self.lens
        gaps = np.append(np.diff(self.ns), 0)  # gaps[k]: chunk k to chunk k + 1
        ends = (starts + self.lens - 1)[self.lens > 0]
        gaps[ends] = 0  # a record's last chunk to the next record's first is no gap
        out[has] = np.maximum.reduceat(gaps, starts[has])
        return out

    def gaps_ms(
        self, keep: np.ndarray
    ) -> tuple[tuple[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]:
        if len(self.ns) < 2:
            return (np.empty(0), None), (np.empty(0), None)
        owner = self._owner()
        # gap p lies between chunks p and p+1 of the same record
        same = (owner[1:] == owner[:-1]) & keep[owner[:-1]]
        g = np.diff(self.ns)[same] / NS_PER_MS
        k = np.maximum(self.tok[1:][same], 1)
        return (g, None), (np.repeat(g / k, k), None)


@dataclass
class RecordColumns:
    """What the metrics read from each record, as arrays over records (record order).
    `*_has` masks say where a nullable field is set; `first`/`last` are the first and last
    content chunk (valid where `n_chunks > 0`)."""

    send: np.ndarray
    end: np.ndarray
    status: np.ndarray  # STATUS_CODES
    errors: list[str | None]
    scheduled: np.ndarray
    scheduled_has: np.ndarray
    first_event: np.ndarray  # 0 where absent (a falsy first_event_ns is not a sample)
    queue: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    usage_out: np.ndarray
    usage_out_has: np.ndarray
    tokenizer_out: np.ndarray
    tokenizer_out_has: np.ndarray
    n_chunks: np.ndarray
    first: np.ndarray
    last: np.ndarray
    chunks: ChunkSource

    @property
    def n(self) -> int:
        return len(self.send)

    def status_is(self, status: RequestStatus) -> np.ndarray:
        """Mask of the records that ended with `status`."""
        return self.status == STATUS_CODES[status]


class HasColumns(Protocol):
    """A record container that can give its columns directly (sim.records.SimRecords)."""

    def columns(self) -> RecordColumns: ...


def _ints(values: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    has = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    arr = np.fromiter((v or 0 for v in values), dtype=np.int64, count=len(values))
    return arr, has


def record_columns(records: Sequence[RequestRecord]) -> RecordColumns:
    """Columns of `records` (or the container's own, when it has them)."""
    own = getattr(records, "columns", None)
    if callable(own):
        return own()
    rows = [r.__dict__ for r in records]  # pydantic keeps field values in __dict__
    n = len(rows)

    def col(name: str) -> list:
        return [d[name] for d in rows]

    chunk_ns, chunk_tok = col("chunk_ns"), col("chunk_tokens")
    lens = np.fromiter(map(len, chunk_ns), dtype=np.int64, count=n)
    total = int(lens.sum())
    flat_ns = np.fromiter(itertools.chain.from_iterable(chunk_ns), dtype=np.int64, count=total)
    flat_tok = np.fromiter(itertools.chain.from_iterable(chunk_tok), dtype=np.int64, count=total)
    has = lens > 0
    starts = np.cumsum(lens) - lens
    first = np.zeros(n, dtype=np.int64)
    last = np.zeros(n, dtype=np.int64)
    first[has] = flat_ns[starts[has]]
    last[has] = flat_ns[starts[has] + lens[has] - 1]
    sched, sched_has = _ints(col("scheduled_ns"))
    usage, usage_has = _ints(col("usage_completion_tokens"))
    tokz, tokz_has = _ints(col("tokenizer_completion_tokens"))
    status = np.fromiter((STATUS_CODES[s] for s in col("status")), dtype=np.int8, count=n)
    return RecordColumns(
        send=np.fromiter(col("send_ns"), dtype=np.int64, count=n),
        end=np.fromiter(col("end_ns"), dtype=np.int64, count=n),
        status=status,
        errors=col("error"),
        scheduled=sched,
        scheduled_has=sched_has,
        first_event=np.fromiter((v or 0 for v in col("first_event_ns")), np.int64, count=n),
        queue=np.fromiter(col("queue_ns"), dtype=np.int64, count=n),
        input_tokens=np.fromiter((r.input_tokens for r in records), np.int64, count=n),
        output_tokens=np.fromiter((r.output_tokens for r in records), np.int64, count=n),
        usage_out=usage,
        usage_out_has=usage_has,
        tokenizer_out=tokz,
        tokenizer_out_has=tokz_has,
        n_chunks=lens,
        first=first,
        last=last,
        chunks=FlatChunks(flat_ns, flat_tok, lens),
    )


# --- columnar maths ----------------------------------------------------------------------


def _window(c: RecordColumns, warmup_s: float, cooldown_s: float) -> tuple[int, int, bool]:
    """measurement_window on columns (see its docstring). "Tiny" is judged against the
    window's span plus the median latency, not the last end: one request that stalls into
    a 60 s timeout must not turn a 10 s run's window into 65 s and every rate 6x low. The
    same test holds for a window a warm-up or cool-down cut (docs/metrics.md): shorter than
    half of its span plus the median latency, i.e. shorter than one latency, it holds a
    handful of completions (9.85 s of warm-up in a 10 s run of 500 ms requests left 50 ms
    and read 0 req/s), so the whole run is measured and `window_note` says why."""
    first = int(c.send.min())
    last_send = int(c.send.max())
    start = first + int(warmup_s * NS_PER_S)
    end = last_send - int(cooldown_s * NS_PER_S)
    ends = np.where(c.n_chunks > 0, np.maximum(c.end, c.last), c.end)
    # the typical latency of a served request: quick refusals (a shedder's 429s, 1 ms) do
    # not shrink it (behind a 3-slot front, 4 users' 9 refusals in 5 ms and 3 answers at
    # 60 ms: the 5 ms of sends is tiny next to 60 ms, and counted as a window, 0 req/s)
    served = _median_latency_ns(c, np.ones(c.n, dtype=bool))
    latency = served if served is not None else int(np.median(ends - c.send))
    typical = end - start + latency  # without a trim: the sends' span plus a latency
    if (
        end - start > 0
        and bool(((c.send >= start) & (c.send <= end)).any())
        and end - start >= 0.5 * typical
    ):
        return start, end, False
    return first, int(ends.max()), True


def _whole_rounds(c: RecordColumns, start: int, end: int, first: bool) -> tuple[int, int]:
    """A closed loop's rate window cut to whole rounds of its users: from `start` (its first
    send, when `first`: every user starts then; else the first completion after it) to the
    completion that closes the last whole multiple of the users' count after it. The
    latency samples stay those sent in the whole window.

    Why: each of N requests after the first c (users) is sent as one finishes, so the
    last send is the (N - c)-th completion. When c does not divide N - c, a lockstep loop
    (a server at a fixed pace, the simulator) ends its window one completion into a round
    and counts that round's time with one of its c completions: 3 users, 16 requests read
    4-6% low, the simulator's coinciding completions all counted, and `validate` saw a 15%
    miss where the 15-request runs agreed to 3%. Counted between completions c apart, a
    window spans whole rounds wherever a round starts, lockstep or staggered."""
    users = _max_in_flight(c.send, c.end)
    ends = np.where(c.n_chunks > 0, c.last, c.end)[~c.status_is(RequestStatus.ABORTED)]
    times = np.sort(ends[(ends > start) & (ends <= end)])
    anchor = start
    if not first and len(times):
        anchor, times = int(times[0]), times[1:]  # a completion: a user's round starts there
    whole = users * (len(times) // users) if users else 0
    # two whole rounds at least: a run of little more than one round (80 requests of 64
    # users) has no steady pace to keep, its first round's burst would be all it measured
    if whole < 2 * users or whole == len(times):
        return start, end
    return anchor, int(times[whole - 1])


def _median_latency_ns(c: RecordColumns, sel: np.ndarray) -> int | None:
    """Median send -> last content chunk of the `ok` requests in `sel` (None: none)."""
    done = sel & (c.n_chunks > 0) & c.status_is(RequestStatus.OK)
    return int(np.median(c.last[done] - c.send[done])) if done.any() else None


def completion_shift_ns(c: RecordColumns, sent: np.ndarray) -> int:
    """The median latency (send -> last content chunk) of the `ok` requests in `sent`: an
    open loop's window that counts completions (and their tokens) is the sends' window
    moved this much later. A request sent at t ends about one latency later, so in steady
    state the moved window holds the completions of the window's own arrivals, with no
    ramp-up deficit (nothing finishes in the first latency after the first send: counted
    unmoved, 10 req/s of 2 s requests over 10 s read 8.1 req/s); a queue that grows still
    completes only at the service rate (Little's law; the steady-state check's reading)."""
    return _median_latency_ns(c, sent) or 0


def _rate(times: np.ndarray, lo: int, hi: int) -> float | None:
    """Events per second in [lo, hi), half-open so that a window whose edges are events
    themselves (first and last send) counts N - 1 gaps, not N (10 sends 1 s apart: 1.0/s,
    not 1.11/s)."""
    if hi <= lo:
        return None
    return int(((times >= lo) & (times < hi)).sum()) / ((hi - lo) / NS_PER_S)


def _offered(c: RecordColumns, warmup_s: float, cooldown_s: float) -> float | None:
    """Scheduled arrivals per second over the schedule's own window (first scheduled +
    warm-up to last scheduled - cool-down), so a client that falls behind shows as sent <
    offered: counted inside the sends' window, a schedule of 10/s sent at 5/s read 5/s."""
    win = schedule_window(c, warmup_s, cooldown_s)
    return None if win is None else _rate(c.scheduled[c.scheduled_has], *win)


def _offered_arrivals(c: RecordColumns, warmup_s: float, cooldown_s: float) -> int | None:
    """The scheduled arrivals in `_offered`'s window, both edges in (its rate counts the
    n - 1 gaps between them)."""
    win = schedule_window(c, warmup_s, cooldown_s)
    if win is None:
        return None
    sched = c.scheduled[c.scheduled_has]
    return int(((sched >= win[0]) & (sched <= win[1])).sum())


def schedule_window(c: RecordColumns, warmup_s: float, cooldown_s: float) -> tuple[int, int] | None:
    """[first scheduled + warm-up, last scheduled - cool-down) in ns (None: no schedule)."""
    if not c.scheduled_has.any():
        return None
    sched = c.scheduled[c.scheduled_has]
    lo = int(sched.min()) + int(warmup_s * NS_PER_S)
    return lo, int(sched.max()) - int(cooldown_s * NS_PER_S)


def _max_in_flight(send: np.ndarray, end: np.ndarray) -> int:
    """Sweep over (time, +1 send / -1 end) events; at equal times ends come first."""
    if len(send) == 0:
        return 0
    t = np.concatenate([send, end])
    d = np.concatenate([np.ones(len(send), np.int64), -np.ones(len(end), np.int64)])
    order = np.lexsort((d, t))
    return max(0, int(np.cumsum(d[order]).max()))


@dataclass
class _Latencies:
    """request_latencies_ms over the records where `sel`, in record order."""

    ttft: np.ndarray
    e2e: np.ndarray
    tpot: np.ndarray
    tpot_has: np.ndarray
    at_once: int  # answers of 2+ tokens with no TPOT: all their tokens came at once


def _latencies(c: RecordColumns, sel: np.ndarray) -> _Latencies:
    sel = sel & (c.n_chunks > 0)
    send = c.send[sel]
    ttft = (c.first[sel] - send) / NS_PER_MS
    e2e = (c.last[sel] - send) / NS_PER_MS
    n = c.output_tokens[sel]
    tpot_has = has_tpot(n, c.n_chunks[sel], c.first[sel], c.last[sel])
    tpot = (e2e[tpot_has] - ttft[tpot_has]) / (n[tpot_has] - 1)
    return _Latencies(ttft, e2e, tpot, tpot_has, int(((n >= 2) & ~tpot_has).sum()))


def _summ(sample: tuple[np.ndarray, np.ndarray | None]) -> Dist:
    values, counts = sample
    return summarize(values) if counts is None else summarize_weighted(values, counts)


def compute_metrics(
    records: Sequence[RequestRecord] | HasColumns,
    *,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    slo: SLO | None = None,
    stream: bool = True,
) -> Metrics:
    """All client metrics of one run from its raw records."""
    if not len(records):  # type: ignore[arg-type]
        return Metrics()
    c = record_columns(records)  # type: ignore[arg-type]
    start, end, whole_run = _window(c, warmup_s, cooldown_s)
    measured = (c.send >= start) & (c.send <= end)
    # a closed loop: no request scheduled (an open loop of sessions schedules its first
    # turns only, and has no users whose rounds to count)
    if not whole_run and not bool(c.scheduled_has[measured].any()):
        start, end = _whole_rounds(c, start, end, first=warmup_s == 0)  # its rates' window
    window_s = max((end - start) / NS_PER_S, 1e-9)
    # Only an open loop's window is moved: a closed loop sends as its requests finish, so
    # its last send is a completion and the unmoved window counts whole rounds (moved, a
    # 12-request run of 4 users counted ~3 rounds' completions in 2 rounds' time, +37%).
    # The whole-run window already holds the drain: nothing to move. Counts are over
    # [lo, hi): the moved window half-open, as `_rate`; an unmoved one keeps its last
    # event (a closed loop's last send is when a request finished, the whole run's last
    # end is one).
    open_loop = bool(c.scheduled_has[measured].all())
    shift = completion_shift_ns(c, measured) if open_loop and not whole_run else 0
    lo, hi = start + shift, end + shift + (0 if shift else 1)
    ok = measured & c.status_is(RequestStatus.OK)
    failed = measured & c.status_is(RequestStatus.ERROR)
    cancelled = int((measured & c.status_is(RequestStatus.CANCELLED)).sum())
    aborted = int((measured & c.status_is(RequestStatus.ABORTED)).sum())
    n_measured = int(measured.sum())
    n_failed = int(failed.sum())
    attempted = n_measured - cancelled - aborted

    lat = _latencies(c, ok)
    eligible, held, streamed = buffered_mask(
        c.send, c.first, c.last, c.output_tokens, ok & (c.n_chunks > 0), c.n_chunks,
        c.chunks.largest_gap_ns(),
    )  # fmt: skip
    buffered = stream and run_is_buffered(int(eligible.sum()), int(held.sum()), int(streamed.sum()))
    if stream and not buffered:
        pooled, per_tok = c.chunks.gaps_ms(ok)
        tpot = summarize(lat.tpot)
    else:  # not streamed, or streamed all at once: no token timing to measure
        pooled = per_tok = (np.empty(0), None)
        tpot = Dist()
    fe = ok & (c.first_event != 0)
    first_event = (c.first_event[fe] - c.send[fe]) / NS_PER_MS
    lag_sel = measured & c.scheduled_has
    # the client's own lateness: the wait on the user's --max-concurrency cap (queue) is
    # the load asked for, not a slow client (it had read as a CLIENT BOTTLENECK)
    lag = (c.send[lag_sel] - c.scheduled[lag_sel] - c.queue[lag_sel]) / NS_PER_MS

    has_chunks = c.n_chunks > 0
    # Completions are counted by when they finish (steady-state throughput), whatever
    # their send time, in the window moved by the median latency (completion_shift_ns);
    # latency samples are taken from requests sent in the window. Tokens are those of the
    # requests that finish in it (any status: a failed or cancelled request's partial
    # output was produced too), so token and request rates read the same requests: tokens
    # counted where they arrive still had the ramp-up's deficit (a stream's tokens come
    # over its whole latency, so no one window shift removes it: 10 req/s of 2 s streams
    # read 8% low), and an input token rate counted by send read a queue's backlog as
    # served.
    finishing = has_chunks & (c.last >= lo) & (c.last < hi)
    out_tokens = int(c.output_tokens[finishing].sum())
    in_tokens = int(c.input_tokens[finishing].sum())
    done_in_window = int((finishing & c.status_is(RequestStatus.OK)).sum())
    errors_by_class: dict[str, int] = {}
    for i in np.flatnonzero(failed).tolist():
        key = c.errors[i] or "unknown"
        errors_by_class[key] = errors_by_class.get(key, 0) + 1
    # Sends per second over the sends' own span, as `_offered` counts the schedule over
    # its own: the whole-run window runs on to the last end, and over it 10 sends at
    # 10/s of 2 s requests read 3.4/s, a false "sent < 98% of offered" (CLIENT BOTTLENECK).
    # A client that falls behind still shows: its late sends stretch their span.
    sent_rate = _rate(c.send, start, end if not whole_run else int(c.send.max()))
    # The whole run measured, the warm-up's sends too: the offered rate is over the whole
    # schedule as well (trimmed by a warm-up that left no window, it had none: None)
    trims = (0.0, 0.0) if whole_run else (warmup_s, cooldown_s)

    m = Metrics(
        window_start_ns=start,
        window_end_ns=end,
        window_s=window_s,
        window_whole_run=whole_run,
        window_trim_s=warmup_s + cooldown_s,
        completion_shift_s=shift / NS_PER_S,
        measured=n_measured,
        completed=int(ok.sum()),
        failed=n_failed,
        cancelled=cancelled,
        aborted=aborted,
        error_rate=n_failed / attempted if attempted else 0.0,
        errors_by_class=dict(sorted(errors_by_class.items())),
        # not streamed: the first token comes with the last, so a "TTFT" would be the E2E
        ttft_ms=Dist() if buffered or not stream else summarize(lat.ttft),
        first_event_ms=summarize(first_event),
        tpot_ms=tpot,
        itl_ms=_summ(pooled),
        itl_per_token_ms=_summ(per_tok),
        e2e_ms=summarize(lat.e2e),
        send_lag_ms=summarize(lag),
        queue_ms=summarize(c.queue[measured] / NS_PER_MS),
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        output_tok_s=out_tokens / window_s,
        total_tok_s=(out_tokens + in_tokens) / window_s,
        req_s=done_in_window / window_s,
        offered_req_s=_offered(c, *trims),
        # some measured requests scheduled, not all: a sessions schedule (first turns)
        offered_unit="sessions/s" if c.scheduled_has[measured].any() and not open_loop else "req/s",
        offered_arrivals=_offered_arrivals(c, *trims),
        sent_req_s=n_measured / window_s if sent_rate is None else sent_rate,
        max_in_flight=_max_in_flight(c.send, c.end),
        stream_buffered=buffered,
        stream_buffered_requests=int(held.sum()) if stream else 0,
        tpot_at_once_requests=lat.at_once if stream and not buffered else 0,
    )
    compared = measured & c.usage_out_has & c.tokenizer_out_has
    diffs = np.abs(c.usage_out[compared] - c.tokenizer_out[compared])
    m.token_count_compared = int(compared.sum())
    m.token_count_mismatched = int((diffs > 0).sum())
    m.token_count_max_abs_diff = int(diffs.max()) if len(diffs) else 0
    if slo is not None:
        _apply_slo(m, c, measured, finishing, slo, attempted, stream)
    return m


def _meets(c: RecordColumns, thresholds: dict[str, float]) -> np.ndarray:
    """meets_slo for every record at once."""
    lat = _latencies(c, np.ones(c.n, dtype=bool))
    idx = np.flatnonzero(c.n_chunks > 0)
    ok_lat = np.ones(len(idx), dtype=bool)
    tpot_full = np.zeros(len(idx))
    tpot_full[lat.tpot_has] = lat.tpot
    vals = {"ttft_ms": lat.ttft, "e2e_ms": lat.e2e}
    for k, limit in thresholds.items():
        if k == "tpot_ms":  # fewer than 2 tokens: TPOT undefined, not a miss
            ok_lat &= ~(lat.tpot_has & (tpot_full > limit))
        elif k in vals:
            ok_lat &= ~(vals[k] > limit)
        else:  # a metric without a value is a miss, as in meets_slo
            ok_lat[:] = False
    # Without chunks every latency is undefined: only a TPOT-only SLO is met.
    out = np.full(c.n, all(k == "tpot_ms" for k in thresholds))
    out[idx] = ok_lat
    return out & c.status_is(RequestStatus.OK)


def _apply_slo(
    m: Metrics,
    c: RecordColumns,
    measured: np.ndarray,
    finishing: np.ndarray,
    slo: SLO,
    attempted: int,
    stream: bool,
) -> None:
    thresholds = slo.per_request()
    if (not stream or m.stream_buffered) and set(thresholds) - {"e2e_ms"}:
        # token timing was not measured: nothing proves a request met its TTFT or TPOT
        # target, as the percentile checks below fail them (docs/metrics.md)
        meets = np.zeros(c.n, dtype=bool)
    else:
        meets = _meets(c, thresholds)
    m.goodput_req_s = int((meets & finishing).sum()) / m.window_s
    good = int((meets & measured).sum())
    m.slo_attainment = good / attempted if attempted else None
    checks: list[SLOCheck] = []
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        targets = getattr(slo, metric)
        if targets is None:
            continue
        dist = getattr(m, metric)
        for stat, target in targets.items():
            v = getattr(dist, stat)
            ok, note = _judge(m, metric, dist, stat, v is not None and v <= target, stream)
            checks.append(
                SLOCheck(metric=metric, stat=stat, target=target, value=v, ok=ok, note=note)
            )
    if slo.error_rate is not None:
        ok = m.error_rate <= slo.error_rate
        checks.append(
            SLOCheck(
                metric="error_rate", stat="max", target=slo.error_rate, value=m.error_rate, ok=ok
            )
        )
    m.slo_checks = checks
    m.slo_pass = all(c.ok for c in checks)


def _judge(
    m: Metrics, metric: str, dist: Dist, stat: str, ok: bool, stream: bool
) -> tuple[bool, str | None]:
    """One percentile check's verdict and why it reads as it does. Token timing that was
    not measured fails (nothing proves the target); a TPOT no request has (every output one
    token) is undefined, not missed, as in goodput's per-request rule, but when answers of
    2+ tokens each arrived all at once it was not measured; a percentile of too
    few requests (metrics.pct) keeps its value and says it rests on the largest ones."""
    if metric != "e2e_ms" and not stream:
        return ok, "not measurable: the requests were not streamed"
    if metric != "e2e_ms" and m.stream_buffered:
        return ok, "not measurable: the server buffered the stream"
    if metric == "tpot_ms" and dist.count == 0 and m.tpot_at_once_requests:
        return ok, "not measurable: every answer of 2+ tokens arrived all at once"
    if metric == "tpot_ms" and dist.count == 0 and m.completed:
        return True, "no request had 2+ output tokens: TPOT is undefined (not a miss)"
    if is_max_only(stat, dist.count) and dist.max is not None:
        need = min_samples(stat)
        return ok, (
            f"a sample of {dist.count} is too few for {stat.upper()} ({need} needed): it "
            f"rests on the largest values (max {fmt_ms(dist.max)} ms)"
        )
    return ok, None


def apply_memory_slo(m: Metrics, slo: SLO | None, kv_usage_peak: float | None) -> None:
    """Add the memory-headroom check (`SLO.kv_cache_usage_max`) once the run's peak KV
    usage is known (server gauge or simulator), after the record-based checks. An engine
    that exports no usage (llama.cpp preallocates each slot's KV, so its pool cannot run
    over) gets the check with no value and a note, and it does not fail the run."""
    if slo is None or slo.kv_cache_usage_max is None:
        return
    target = slo.kv_cache_usage_max
    if kv_usage_peak is None:
        check = SLOCheck(
            metric="kv_cache_usage",
            stat="max",
            target=target,
            value=None,
            ok=True,
            note="not measured: the engine exports no KV-cache usage",
        )
    else:
        peak = float(kv_usage_peak)
        check = SLOCheck(
            metric="kv_cache_usage", stat="max", target=target, value=peak, ok=peak <= target
        )
    m.slo_checks = [c for c in m.slo_checks if c.metric != "kv_cache_usage"] + [check]
    m.slo_pass = all(c.ok for c in m.slo_checks)


def window_note(m: Metrics) -> str | None:
    """Why a run that completed requests shows 0 req/s: `req_s` counts completions inside
    the measurement window (first to last send, an open loop's moved by the median
    latency), and in a run of a few requests none may finish inside it. A run of one send
    has no window between sends: its rate is one over its own latency, no throughput. A
    warm-up + cool-down that leave no window, or one shorter than a request's median
    latency (`_window`), have the whole run measured, and the warm-up asked for is not left
    out (it was, silently)."""
    if m.window_whole_run and m.window_trim_s > 0:
        return (
            f"the warm-up + cool-down ({m.window_trim_s:g} s) leave no window in this run, "
            "or one shorter than a request's median latency: every request is measured, the "
            "warm-up's too; raise --count or --duration, or shorten warmup_s/cooldown_s"
        )
    if m.completed == 1 and m.measured <= 1 and m.req_s > 0:
        return (
            f"{m.req_s:.3g} req/s is one request over its own latency, not a throughput: "
            "too few for a rate: raise --count or --duration"
        )
    if m.req_s > 0 or m.completed == 0:
        return None
    return (
        f"0 req/s: none of the {m.completed} completed requests finished inside the "
        "measurement window (docs/metrics.md); too few for a rate: raise --count"
    )


SCHEDULE_OFF = 0.15  # the schedule's own rate this far from the rate asked is said


def schedule_note(m: Metrics, load: Load) -> str | None:
    """A random schedule's own rate far from the rate asked (15% or more). Poisson and
    gamma gaps are drawn, so n arrivals offer rate x (1 +/- CV / sqrt(n)): 60 gamma
    arrivals at CV 3 vary by +/-39%, and one such schedule asked for 1.03 req/s offered
    1.73 (`benchmarks/cpu_heldout.py`, seed 7: meant as 60% of the capacity, it was 101%).
    Every figure is measured at the offered rate, so a user reading the asked one misreads
    the load; the note gives both and the spread to expect (CV / sqrt(n): the standard
    error of a mean of n independent gaps)."""
    if load.kind not in ("poisson", "gamma") or not load.rate or not m.offered_req_s:
        return None
    off = m.offered_req_s / load.rate - 1
    if abs(off) < SCHEDULE_OFF:
        return None
    cv = 1.0 if load.kind == "poisson" else 1 / math.sqrt(load.burstiness or 1.0)
    n = max(m.offered_arrivals or m.measured, 1)
    return (
        f"the schedule offered {m.offered_req_s:.3g} {m.offered_unit}, {abs(off):.0%} "
        f"{'above' if off > 0 else 'below'} the {load.rate:.3g} asked: {n} {load.kind} "
        f"arrivals at CV {cv:.2g} vary by +/-{cv / math.sqrt(n):.0%} (CV / sqrt(n)); every "
        "figure is at the offered rate (more requests narrow it)"
    )


def token_count_note(m: Metrics) -> str | None:
    """The server's usage and the client's tokenizer disagreeing on output lengths: the
    --tokenizer is not the served model's, so prompt lengths built with it are off too
    (DESIGN.md metric contract: a mismatch between the two is reported)."""
    if not m.token_count_mismatched:
        return None
    return (
        f"the server's usage and --tokenizer disagree on {m.token_count_mismatched} of "
        f"{m.token_count_compared} outputs (by up to {m.token_count_max_abs_diff} tokens): "
        "is --tokenizer the served model's?"
    )


def tpot_note(m: Metrics) -> str | None:
    """Answers whose tokens all arrived at once have no TPOT (`has_tpot`): say how many the
    TPOT figures leave out, so a P50 over 11 answers of 24 is not read as over 24."""
    k = m.tpot_at_once_requests
    if not k:
        return None
    return (
        f"{k} of {m.completed} answers came all at once (a busy host held the client or "
        f"the API server, or the server buffers short answers): TPOT is over the "
        f"{m.tpot_ms.count} that streamed; the others' wait is in their TTFT and E2E"
    )


def _sent_short(m: Metrics) -> bool:
    """Fewer than 98% of the offered requests sent. A sessions run's sent counts every
    turn and its offered its sessions: not comparable (its first turns' send lag is)."""
    offered = m.offered_req_s if m.offered_unit == "req/s" else None
    return bool(offered and m.sent_req_s < 0.98 * offered)


def cap_note(m: Metrics, load: Load) -> str | None:
    """An open loop whose sends waited on the user's --max-concurrency cap and fell short of
    the schedule: the load the cap let through, said as the cap's (it had read as a CLIENT
    BOTTLENECK, the send lag counting the wait on the cap)."""
    if load.kind in (None, "closed") or not m.queue_ms.max or not _sent_short(m):
        return None
    return (
        f"the --max-concurrency {load.concurrency} cap held sends back: sent "
        f"{m.sent_req_s:.3g} of {m.offered_req_s:.3g} req/s offered (client queue P99 "
        f"{m.queue_ms.p99:,.0f} ms); every figure is at the load it let through"
    )


def resent_note(records: Sequence[RequestRecord]) -> str | None:
    """Requests sent again after the server closed their reused connection unanswered
    (`RequestRecord.resent`): a stale keep-alive, or a server dropping requests, which
    the retry would otherwise hide from the error rate."""
    n = sum(1 for r in records if r.resent)
    if not n:
        return None
    return (
        f"{n} of {len(records)} requests were sent again on a new connection: the server "
        "closed their reused one without answering (a stale keep-alive; a server dropping "
        "requests reads the same); their times count from the first send"
    )


def client_warnings(
    m: Metrics, *, open_loop: bool, cpu_util: float, lag_p99_limit_ms: float = 10.0
) -> list[str]:
    """Reasons to believe the client, not the server, limited the run (field notes #2/#3).
    Non-empty means the result is flagged `client.bottleneck`."""
    out = []
    if open_loop and m.send_lag_ms.p99 is not None and m.send_lag_ms.p99 > lag_p99_limit_ms:
        out.append(f"send lag P99 {m.send_lag_ms.p99:.1f} ms > {lag_p99_limit_ms:g} ms")
    if open_loop and _sent_short(m) and not m.queue_ms.max:  # a cap's wait: `cap_note`
        out.append(f"sent {m.sent_req_s:.1f} req/s < 98% of offered {m.offered_req_s:.1f} req/s")
    if cpu_util > 0.9:
        out.append(f"client CPU {cpu_util:.0%} of its cores")
    return out
