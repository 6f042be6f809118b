"""The simulator's request records, kept as columns and built one at a time on access.

Why (benchmarks/sim_speed.py's memory): a simulated request's content chunks are consecutive step
ends of the run, so its chunk times are one range (or, after a preemption, a few ranges)
of the run's array of step-end times. Storing those ranges instead of 256 Python ints per
request takes a 100,000-request RunResult from ~2.5 GB to a few MB, and the metrics read
the columns directly (`metrics.compute.RecordColumns`). A `RequestRecord` with plain
lists is built only when someone indexes or iterates (JSON export, the store, reports),
so everything downstream sees ordinary records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from servetune.metrics.compute import NS_PER_MS, STATUS_CODES, FlatChunks, RecordColumns
from servetune.results.schema import RequestRecord
from servetune.status import RequestStatus

# Above this many inter-chunk gaps the pooled ITL is summarised from (distinct step gap,
# count) pairs instead of the expanded sample: identical count/min/max/percentiles, mean
# and std to rounding (`stats.summarize_weighted`), without 8 bytes per gap.
MAX_EXPANDED_GAPS = 1_000_000


@dataclass
class RangedChunks:
    """Chunks as ranges into `times` (ns, non-decreasing): segment k of the table covers
    times[a[k]:b[k]] and belongs to record rec[k]; segments are in record, then time,
    order. Every chunk carries one token (the simulator streams token by token)."""

    times: np.ndarray
    rec: np.ndarray
    a: np.ndarray
    b: np.ndarray
    n: int

    def lens(self) -> np.ndarray:
        return np.bincount(self.rec, weights=self.b - self.a, minlength=self.n).astype(np.int64)

    def flat(self, keep: np.ndarray) -> FlatChunks:
        """The kept records' chunks, expanded (record order)."""
        sel = keep[self.rec]
        a, b, rec = self.a[sel], self.b[sel], self.rec[sel]
        seg_len = b - a
        total = int(seg_len.sum())
        start = np.cumsum(seg_len) - seg_len
        idx = np.arange(total) - np.repeat(start - a, seg_len)
        lens = np.bincount(rec, weights=seg_len, minlength=self.n).astype(np.int64)[keep]
        return FlatChunks(self.times[idx], np.ones(total, dtype=np.int64), lens)

    def gaps_ms(
        self, keep: np.ndarray
    ) -> tuple[tuple[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]:
        sel = keep[self.rec]
        a, b, rec = self.a[sel], self.b[sel], self.rec[sel]
        if int(np.maximum(b - a, 0).sum()) <= MAX_EXPANDED_GAPS:
            return self.flat(keep).gaps_ms(np.ones(int(keep.sum()), dtype=bool))
        # Weighted: each step gap j (times[j] -> times[j+1]) counted once per record whose
        # segment spans it (difference array), plus the gaps across a record's segments.
        t = self.times
        cnt = np.zeros(len(t) + 1, dtype=np.int64)
        long = b - a >= 2
        np.add.at(cnt, a[long], 1)
        np.add.at(cnt, b[long] - 1, -1)
        counts = np.cumsum(cnt)[: len(t) - 1]
        values = np.diff(t) / NS_PER_MS
        cross = rec[1:] == rec[:-1]
        extra = (t[a[1:][cross]] - t[b[:-1][cross] - 1]) / NS_PER_MS
        v = np.concatenate([values, extra])
        c = np.concatenate([counts, np.ones(len(extra), dtype=np.int64)])
        return (v, c), (v, c)

    def largest_gap_ns(self) -> np.ndarray:
        """0, a lower bound: the simulator streams token by token, a step apart, so there is
        no burst for `buffering` to excuse a late read in (and no expansion of the ranges)."""
        return np.zeros(self.n, dtype=np.int64)


class SimRecords(Sequence[RequestRecord]):
    """Columns of one simulated run's records, in (send, index) order; indexing builds a
    fresh RequestRecord (edits to it are not kept)."""

    def __init__(
        self,
        *,
        times_ns: np.ndarray,
        index: np.ndarray,
        send_ns: np.ndarray,
        scheduled_ns: np.ndarray,
        scheduled_has: np.ndarray,
        priority: np.ndarray,
        prompt: np.ndarray,
        out: np.ndarray,
        ok: np.ndarray,
        seg_rec: np.ndarray,
        seg_a: np.ndarray,
        seg_b: np.ndarray,
        preemptions: np.ndarray,
        cached: np.ndarray,
        reasons: dict[int, str],
        sub: Sequence[str],
        prefix_group: np.ndarray,
    ) -> None:
        self.times_ns = times_ns
        self.index, self.send_ns = index, send_ns
        self.scheduled_ns, self.scheduled_has = scheduled_ns, scheduled_has
        self.priority, self.prompt, self.out, self.ok = priority, prompt, out, ok
        self.chunks = RangedChunks(times_ns, seg_rec, seg_a, seg_b, len(index))
        self.preemptions, self.cached = preemptions, cached
        self.reasons, self.sub, self.prefix_group = reasons, sub, prefix_group
        self.n_chunks = self.chunks.lens()
        has = self.n_chunks > 0
        first_seg = np.full(len(index), -1)
        last_seg = np.full(len(index), -1)
        # segments are in record order: the first/last segment of each record
        first_seg[seg_rec[::-1]] = np.arange(len(seg_rec))[::-1]
        last_seg[seg_rec] = np.arange(len(seg_rec))
        self.first = np.zeros(len(index), dtype=np.int64)
        self.last = np.zeros(len(index), dtype=np.int64)
        self.first[has] = times_ns[seg_a[first_seg[has]]]
        self.last[has] = times_ns[seg_b[last_seg[has]] - 1]
        self.end_ns = np.where(has, self.last, send_ns)
        self._seg_start = first_seg
        self._seg_stop = last_seg + 1

    def __len__(self) -> int:
        return len(self.index)

    @overload
    def __getitem__(self, i: int) -> RequestRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestRecord]: ...
    def __getitem__(self, i: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(i, slice):
            return [self._record(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._record(i % n)

    def __iter__(self) -> Iterator[RequestRecord]:
        return (self._record(k) for k in range(len(self)))

    def chunk_ns(self, k: int) -> list[int]:
        """Record k's chunk arrival times (ns)."""
        if self._seg_start[k] < 0:
            return []
        t, c = self.times_ns, self.chunks
        out: list[int] = []
        for s in range(int(self._seg_start[k]), int(self._seg_stop[k])):
            out.extend(t[c.a[s] : c.b[s]].tolist())
        return out

    def _record(self, k: int) -> RequestRecord:
        send = int(self.send_ns[k])
        sched = int(self.scheduled_ns[k]) if self.scheduled_has[k] else None
        prio = int(self.priority[k])
        group = int(self.prefix_group[k])
        base = dict(
            index=int(self.index[k]),
            sub=self.sub[k],
            priority=prio if prio else None,
            prefix_group=group if group >= 0 else None,
            scheduled_ns=sched,
            queue_ns=send - sched if sched is not None else 0,
            send_ns=send,
            connect_ns=0,
            prompt_tokens=int(self.prompt[k]),
            max_tokens=int(self.out[k]),
            usage_prompt_tokens=int(self.prompt[k]),
        )
        if not self.ok[k]:
            return RequestRecord.model_construct(
                **base,
                chunk_ns=[],
                chunk_tokens=[],
                end_ns=send,
                status=RequestStatus.ERROR,
                error="http_4xx",
                http_status=400,
                error_detail=self.reasons.get(k),
            )
        ns = self.chunk_ns(k)
        return RequestRecord.model_construct(
            **base,
            first_event_ns=ns[0],
            chunk_ns=ns,
            chunk_tokens=[1] * len(ns),
            first_answer_ns=ns[0],
            end_ns=ns[-1],
            status=RequestStatus.OK,
            finish_reason="length",
            usage_completion_tokens=len(ns),
            server_timings={
                "preemptions": float(self.preemptions[k]),
                "cached": int(self.cached[k]),
            },
        )

    def columns(self) -> RecordColumns:
        """What compute_metrics reads, without building any record."""
        n = len(self)
        zeros = np.zeros(n, dtype=np.int64)
        no = np.zeros(n, dtype=bool)
        queue = np.where(self.scheduled_has, self.send_ns - self.scheduled_ns, 0)
        return RecordColumns(
            send=self.send_ns,
            end=self.end_ns,
            status=np.where(
                self.ok, STATUS_CODES[RequestStatus.OK], STATUS_CODES[RequestStatus.ERROR]
            ).astype(np.int8),
            errors=[None if self.ok[k] else "http_4xx" for k in range(n)]
            if not self.ok.all()
            else [None] * n,
            scheduled=self.scheduled_ns,
            scheduled_has=self.scheduled_has,
            first_event=np.where(self.ok, self.first, 0),
            queue=queue,
            input_tokens=self.prompt,
            output_tokens=np.where(self.ok, self.n_chunks, 0),
            usage_out=np.where(self.ok, self.n_chunks, 0),
            usage_out_has=self.ok.copy(),
            tokenizer_out=zeros,
            tokenizer_out_has=no,
            n_chunks=self.n_chunks,
            first=self.first,
            last=self.last,
            chunks=self.chunks,
        )
