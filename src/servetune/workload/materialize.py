"""WorkloadSpec + tokenizer -> the concrete request list (no HTTP here).

`bench` sends these requests and `simulate` replays them, so both see the same
prompt token counts, output lengths, arrival offsets, priorities and prefix groups.
Everything is drawn from numpy generators seeded by the spec's seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from servetune.workload.sources import check_replay_span, message_text, read_dataset, trace_rows
from servetune.workload.spec import (
    MAX_TOKENS,
    Empirical,
    Fixed,
    LengthDist,
    LogNormal,
    Normal,
    SubWorkload,
    Uniform,
    WorkloadSpec,
)
from servetune.workload.tokenizer import Tokenizer, safe_token_pieces

# Closed-loop runs bounded only by duration draw their requests from a pool this big,
# cycling through it (the record's `index` shows which pool entry was sent).
DEFAULT_POOL = 4096


class Request(BaseModel):
    """One request, ready to send. `prompt_tokens` is the exact count under the tokenizer
    used (the chat template, added by the server, is not included)."""

    model_config = ConfigDict(frozen=True)

    index: int
    sub: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    # bounded as a workload's lengths are: a replayed file's -5 or 1e12 is refused on load
    prompt_tokens: int = Field(ge=0, le=MAX_TOKENS)
    output_tokens: int | None = Field(ge=0, le=MAX_TOKENS)
    arrival_s: float | None = Field(None, allow_inf_nan=False)
    priority: int | None = None
    prefix_group: int | None = None


# --- pure samplers ---------------------------------------------------------------------


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """n integer lengths from `dist`, clipped to [min, max]."""
    if isinstance(dist, Fixed):
        x = np.full(n, float(dist.value))
    elif isinstance(dist, Uniform):
        x = rng.integers(dist.low, dist.high + 1, size=n).astype(float)
    elif isinstance(dist, Normal):
        x = rng.normal(dist.mean, dist.std, size=n)
    elif isinstance(dist, LogNormal):
        mu = math.log(dist.mean) - dist.sigma**2 / 2  # E[X] = exp(mu + sigma^2/2)
        x = rng.lognormal(mu, dist.sigma, size=n)
    elif isinstance(dist, Empirical):
        x = _sample_empirical(dist, n, rng)
    else:  # pragma: no cover - the union is closed
        raise TypeError(dist)
    # A tail beyond MAX_TOKENS (a lognormal's) is clipped there: int64 would wrap it.
    hi = dist.max if dist.max is not None else MAX_TOKENS
    return np.clip(np.rint(x), dist.min, hi).astype(np.int64)


def probabilities(weights: Sequence[float]) -> np.ndarray:
    """`weights` (finite, >= 0, not all 0) scaled to sum to 1. Where their sum overflows
    (two weights of 1e308: w / inf is all zeros), scaled by the largest first; otherwise
    divided as before, so a seed draws the same requests as it always has."""
    w = np.asarray(weights, dtype=float)
    total = w.sum()
    if not np.isfinite(total):
        w = w / w.max()
        total = w.sum()
    return w / total


def _sample_empirical(dist: Empirical, n: int, rng: np.random.Generator) -> np.ndarray:
    if dist.values is not None:
        w = dist.weights if dist.weights is not None else [1.0] * len(dist.values)
        return rng.choice(np.asarray(dist.values, dtype=float), size=n, p=probabilities(w))
    assert dist.bin_edges is not None and dist.counts is not None
    edges = np.asarray(dist.bin_edges, dtype=float)
    b = rng.choice(len(dist.counts), size=n, p=probabilities(dist.counts))
    return rng.uniform(edges[b], edges[b + 1])


def arrival_offsets_s(
    kind: str,
    rate: float,
    rng: np.random.Generator,
    *,
    count: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
) -> np.ndarray:
    """Send times (s from the run start) of an open-loop schedule; the first is at 0.

    constant: gaps of 1/rate. poisson: exponential gaps, mean 1/rate. gamma: gaps
    Gamma(shape=b, scale=1/(rate*b)), mean 1/rate, CV^2 = 1/b (vLLM bench's burstiness).
    """
    if count is None and duration_s is None:
        raise ValueError("count or duration_s")
    n = (
        count
        if count is not None
        else int(rate * duration_s * 1.2 + 20 * math.sqrt(rate * duration_s) + 10)
    )
    while True:
        if kind == "constant":
            # k / rate, not a sum of gaps: the sum's rounding put rate x duration + 1 sends
            # inside the duration (the last at 0.999999999 s of a 1 s run at 10/s)
            t = np.arange(n) / rate
            if duration_s is None:
                return t
            if t[-1] >= duration_s:
                return t[t < duration_s]
            n *= 2
            continue
        if kind == "poisson":
            gaps = rng.exponential(1.0 / rate, size=n)
        elif kind == "gamma":
            gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
        else:
            raise ValueError(f"not an open-loop arrival kind: {kind}")
        t = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        if duration_s is None:
            return t
        if t[-1] >= duration_s:
            return t[t < duration_s]
        n *= 2


# --- prompt synthesis ------------------------------------------------------------------


class PromptMaker:
    """Makes prompts of exact token counts from a pool of round-trippable tokens."""

    def __init__(self, tok: Tokenizer, rng: np.random.Generator) -> None:
        self.tok = tok
        self.rng = rng
        self.pieces = safe_token_pieces(tok)
        self.pool = np.asarray(list(self.pieces))

    def ids(self, n: int, rng: np.random.Generator | None = None) -> list[int]:
        g = rng if rng is not None else self.rng
        return self.pool[g.integers(0, len(self.pool), size=n)].tolist()

    def _join(self, ids: Sequence[int]) -> str:
        """The text of `ids`: their pieces joined (no /detokenize call per prompt); ids from
        elsewhere go through the tokenizer's decode."""
        pieces = self.pieces
        text = (
            "".join(pieces[i] for i in ids)
            if all(i in pieces for i in ids)
            else self.tok.decode(list(ids))
        )
        return text.lstrip(" ")

    def text(self, prefix_ids: Sequence[int], n: int) -> tuple[str, int]:
        """Text whose encoding has exactly `n` tokens and starts with `prefix_ids`.
        Only the tail after the prefix is adjusted, so shared prefixes stay shared.
        One encode per prompt checks the count (an HTTP call on a server's tokenizer)."""
        tok = self.tok
        ids = list(prefix_ids[:n]) + self.ids(max(0, n - len(prefix_ids)))
        keep = min(len(prefix_ids), n)
        for _ in range(8):
            text = self._join(ids)
            m = len(tok.encode(text))
            if m == n:
                return text, m
            if m > n:
                cut = max(keep, len(ids) - (m - n))
                if cut == len(ids):
                    break
                ids = ids[:cut]
            else:
                ids = ids + self.ids(n - m)
        text = self._join(ids)
        return text, len(tok.encode(text))  # best effort; the record keeps the true count


# --- materialisation -------------------------------------------------------------------


def materialize(
    spec: WorkloadSpec, tok: Tokenizer, *, pool_size: int | None = None
) -> list[Request]:
    """The full request list of `spec`. Open loop: one request per scheduled arrival.
    Closed loop: `count` requests, or a pool that the senders cycle through. Sessions:
    one request per turn (`session_plan`)."""
    if spec.sessions is not None:
        from servetune.workload.session_plan import plan_sessions  # it builds on this module

        return plan_sessions(spec, tok).requests()
    seq = np.random.SeedSequence(spec.seed)
    rng_arrival, rng_mix, rng_len, rng_text = (np.random.default_rng(s) for s in seq.spawn(4))
    maker = PromptMaker(tok, rng_text)
    if spec.trace is not None:
        return _from_trace(spec, maker)

    offsets, n = _offsets(spec, rng_arrival, pool_size)

    which = rng_mix.choice(len(spec.mix), size=n, p=probabilities([s.weight for s in spec.mix]))
    out: list[Request | None] = [None] * n
    for k, sub in enumerate(spec.mix):
        idx = np.flatnonzero(which == k)
        for i, req in zip(idx.tolist(), _sub_requests(sub, len(idx), maker, rng_len), strict=True):
            out[i] = req
    result: list[Request] = []
    for i, r in enumerate(out):
        assert r is not None
        arrival = float(offsets[i]) if offsets is not None else None
        result.append(r.model_copy(update={"index": i, "arrival_s": arrival}))
    return result


def _draw_synthetic(
    sub: SubWorkload, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt targets, output lengths, prefix groups or -1) of a synthetic sub-workload,
    drawn from `rng` in a fixed order, so text and count-only materialisation agree."""
    assert sub.input_tokens is not None and sub.output_tokens is not None
    ins = sample_lengths(sub.input_tokens, n, rng)
    outs = sample_lengths(sub.output_tokens, n, rng)
    groups = np.full(n, -1)
    if sub.prefix is not None:
        groups = rng.integers(0, sub.prefix.groups, size=n)
        # Every prompt holds its prefix and at least one token of its own.
        ins = np.maximum(ins, sub.prefix.tokens + 1)
    return np.maximum(ins, 1), outs, groups


def _sub_requests(
    sub: SubWorkload, n: int, maker: PromptMaker, rng: np.random.Generator
) -> list[Request]:
    if n == 0:
        return []
    if sub.dataset is not None:
        return _from_dataset(sub, n, maker, rng)
    ins, outs, groups = _draw_synthetic(sub, n, rng)
    prefixes: list[list[int]] = []
    if sub.prefix is not None:
        prefixes = [maker.ids(sub.prefix.tokens) for _ in range(sub.prefix.groups)]
    reqs = []
    for i in range(n):
        g = int(groups[i])
        text, count = maker.text(prefixes[g] if g >= 0 else [], int(ins[i]))
        reqs.append(
            Request(
                index=0,
                sub=sub.name,
                prompt=text,
                prompt_tokens=count,
                output_tokens=int(outs[i]),
                priority=sub.priority,
                prefix_group=g if g >= 0 else None,
            )
        )
    return reqs


@dataclass
class RequestColumns:
    """The request list as arrays (no prompt text): what the simulator reads. Why: building
    100,000 `Request` models costs more than simulating them (benchmarks/sim_speed.py)."""

    sub_names: list[str]
    sub: np.ndarray  # index into sub_names
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # -1: not given
    arrival_s: np.ndarray  # nan: closed loop
    priority: np.ndarray  # 0 with priority_has False: not given
    priority_has: np.ndarray
    prefix_group: np.ndarray  # -1: none
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    @classmethod
    def from_requests(cls, requests: Sequence[Request]) -> RequestColumns:
        names = sorted({r.sub for r in requests})
        code = {s: k for k, s in enumerate(names)}
        n = len(requests)

        def col(f: Any, dtype: Any) -> np.ndarray:
            return np.fromiter(map(f, requests), dtype=dtype, count=n)

        return cls(
            sub_names=names,
            sub=col(lambda r: code[r.sub], np.int64),
            prompt_tokens=col(lambda r: r.prompt_tokens, np.int64),
            output_tokens=col(lambda r: -1 if r.output_tokens is None else r.output_tokens, int),
            arrival_s=col(lambda r: np.nan if r.arrival_s is None else r.arrival_s, float),
            priority=col(lambda r: r.priority or 0, np.int64),
            priority_has=col(lambda r: r.priority is not None, bool),
            prefix_group=col(lambda r: -1 if r.prefix_group is None else r.prefix_group, int),
            index=col(lambda r: r.index, np.int64),
        )

    def requests(self) -> list[Request]:
        """The same requests as `Request` models (prompt text None)."""
        out = []
        arr = self.arrival_s.tolist()
        for k in range(len(self)):
            g, o, p = int(self.prefix_group[k]), int(self.output_tokens[k]), arr[k]
            out.append(
                Request.model_construct(
                    index=int(self.index[k]),
                    sub=self.sub_names[int(self.sub[k])],
                    prompt_tokens=int(self.prompt_tokens[k]),
                    output_tokens=o if o >= 0 else None,
                    arrival_s=None if p != p else p,  # nan -> None
                    priority=int(self.priority[k]) if self.priority_has[k] else None,
                    prefix_group=g if g >= 0 else None,
                )
            )
        return out


def materialize_columns(spec: WorkloadSpec) -> RequestColumns | None:
    """`materialize` without prompt text, as columns: the same counts, output lengths,
    arrivals, priorities and prefix groups (the same RNG streams, drawn in the same order;
    the text stream is not touched). None when the spec needs a tokenizer to count
    (datasets, traces)."""
    if spec.trace is not None or any(sub.dataset is not None for sub in spec.mix):
        return None
    seq = np.random.SeedSequence(spec.seed)
    rng_arrival, rng_mix, rng_len, _ = (np.random.default_rng(s) for s in seq.spawn(4))
    offsets, n = _offsets(spec, rng_arrival, None)
    which = rng_mix.choice(len(spec.mix), size=n, p=probabilities([s.weight for s in spec.mix]))
    prompt = np.zeros(n, dtype=np.int64)
    outs = np.zeros(n, dtype=np.int64)
    groups = np.full(n, -1, dtype=np.int64)
    prio = np.zeros(n, dtype=np.int64)
    prio_has = np.zeros(n, dtype=bool)
    for k, sub in enumerate(spec.mix):
        idx = np.flatnonzero(which == k)
        if len(idx) == 0:
            continue
        ins, o, g = _draw_synthetic(sub, len(idx), rng_len)
        prompt[idx], outs[idx], groups[idx] = ins, o, g
        if sub.priority is not None:
            prio[idx], prio_has[idx] = sub.priority, True
    return RequestColumns(
        sub_names=[s.name for s in spec.mix],
        sub=which.astype(np.int64),
        prompt_tokens=prompt,
        output_tokens=outs,
        arrival_s=offsets if offsets is not None else np.full(n, np.nan),
        priority=prio,
        priority_has=prio_has,
        prefix_group=groups,
        index=np.arange(n, dtype=np.int64),
    )


def _offsets(
    spec: WorkloadSpec, rng: np.random.Generator, pool_size: int | None
) -> tuple[np.ndarray | None, int]:
    """(open-loop send offsets or None, number of requests)."""
    arr = spec.arrival
    if not arr.open_loop:
        return None, spec.count if spec.count is not None else (pool_size or DEFAULT_POOL)
    offsets = arrival_offsets_s(
        arr.kind,
        float(arr.rate or 1.0),
        rng,
        count=spec.count,
        duration_s=spec.duration_s if spec.count is None else None,
        burstiness=arr.burstiness,
    )
    return offsets, len(offsets)


def _from_dataset(
    sub: SubWorkload, n: int, maker: PromptMaker, rng: np.random.Generator
) -> list[Request]:
    assert sub.dataset is not None
    rows = read_dataset(sub.dataset)
    order = rng.permutation(len(rows)) if sub.dataset.shuffle else np.arange(len(rows))
    outs = sample_lengths(sub.output_tokens, n, rng) if sub.output_tokens is not None else None
    tok = maker.tok
    reqs = []
    for i in range(n):
        row = rows[int(order[i % len(rows)])]
        messages = row.messages
        if messages:
            prompt_tokens = sum(len(tok.encode(message_text(m.get("content")))) for m in messages)
        else:
            prompt_tokens = len(tok.encode(row.prompt or ""))
        if outs is not None:
            out = int(outs[i])
        elif row.output_tokens is not None:
            out = row.output_tokens
        elif row.reply:
            out = max(1, len(tok.encode(row.reply)))
        else:
            out = None
        reqs.append(
            Request(
                index=0,
                sub=sub.name,
                prompt=None if messages else row.prompt,
                messages=messages,
                prompt_tokens=prompt_tokens,
                output_tokens=out,
                priority=sub.priority,
            )
        )
    return reqs


def _from_trace(spec: WorkloadSpec, maker: PromptMaker) -> list[Request]:
    """Mooncake-style trace: equal hash ids -> identical token blocks -> shared prefixes."""
    tr = spec.trace
    assert tr is not None
    rows = trace_rows(spec)
    blocks: dict[int, list[int]] = {}
    t0 = min(r.timestamp_ms for r in rows)  # the first send, were the lines out of order
    check_replay_span(spec)
    priority = spec.mix[0].priority if spec.mix else None
    reqs = []
    for i, row in enumerate(rows):
        ids: list[int] = []
        for h in row.hash_ids:
            if h not in blocks:
                blocks[h] = maker.ids(tr.block_tokens, np.random.default_rng([spec.seed, h]))
            ids.extend(blocks[h])
        text, count = maker.text(ids, max(1, row.input_length))
        ts = (row.timestamp_ms - t0) / 1000.0 / tr.time_scale
        reqs.append(
            Request(
                index=i,
                sub="trace",
                prompt=text,
                prompt_tokens=count,
                output_tokens=row.output_length,
                arrival_s=ts if spec.arrival.kind == "trace" else None,
                priority=priority,
                prefix_group=row.hash_ids[0] if row.hash_ids else None,
            )
        )
    if spec.arrival.kind != "trace" and spec.arrival.open_loop:
        # the trace's lines at another rate: a duration ends the run first (its lines were
        # all sent, past the duration), else the trace's end does
        duration = spec.duration_s if spec.count is None else None
        offs = arrival_offsets_s(
            spec.arrival.kind,
            float(spec.arrival.rate or 1.0),
            np.random.default_rng(spec.seed),
            count=None if duration else len(reqs),
            duration_s=duration,
            burstiness=spec.arrival.burstiness,
        )
        reqs = [
            r.model_copy(update={"arrival_s": float(t)}) for r, t in zip(reqs, offs, strict=False)
        ]
    return reqs
