"""The metric contract (docs/metrics.md; DESIGN.md "Metric contract"), as pure functions.

Inputs are raw records with monotonic-ns timestamps; nothing here does I/O, so `bench`
and `simulate` compute identical figures from identical records.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servetune.metrics.stats import summarize
from servetune.results.schema import Metrics, RequestRecord, SLOCheck
from servetune.slo import SLO

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def measurement_window(
    records: Sequence[RequestRecord], warmup_s: float = 0.0, cooldown_s: float = 0.0
) -> tuple[int, int, bool]:
    """(start_ns, end_ns, fell_back). The window runs from the first send + warm-up to the
    last send - cool-down: ramp-up and the drain after the last send are excluded
    (field notes: vLLM #18475, GuideLLM #93 count them in throughput). If that leaves
    nothing (tiny runs), the whole run, first send to last end, is used and flagged."""
    if not records:
        return 0, 0, True
    first = min(r.send_ns for r in records)
    last_send = max(r.send_ns for r in records)
    start = first + int(warmup_s * NS_PER_S)
    end = last_send - int(cooldown_s * NS_PER_S)
    if (
        end - start > 0
        and any(start <= r.send_ns <= end for r in records)
        and (warmup_s > 0 or cooldown_s > 0 or end - start >= 0.5 * (_last_end(records) - first))
    ):
        return start, end, False
    return first, _last_end(records), True


def _last_end(records: Sequence[RequestRecord]) -> int:
    return max(max(r.end_ns, r.chunk_ns[-1] if r.chunk_ns else r.end_ns) for r in records)


def request_latencies_ms(r: RequestRecord) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT, E2E) of one request, ms. TTFT: send -> first content chunk (role-only
    chunks excluded). E2E: send -> last content chunk (not the trailing usage/[DONE]).
    TPOT: (E2E - TTFT) / (output_tokens - 1), vLLM's definition; None below 2 tokens."""
    if not r.chunk_ns:
        return None, None, None
    ttft = (r.chunk_ns[0] - r.send_ns) / NS_PER_MS
    e2e = (r.chunk_ns[-1] - r.send_ns) / NS_PER_MS
    n = r.output_tokens
    tpot = (e2e - ttft) / (n - 1) if n >= 2 and len(r.chunk_ns) >= 2 else None
    return ttft, tpot, e2e


def itl_samples_ms(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(pooled, per_token). Pooled: every gap between consecutive content chunks, once per
    gap, pooled over requests (vLLM/SGLang ITL). Per-token: a gap before a chunk of k
    tokens becomes k samples of gap/k (genai-perf's division by the chunk's tokens)."""
    gaps: list[np.ndarray] = []
    per_tok: list[np.ndarray] = []
    for r in records:
        if len(r.chunk_ns) < 2:
            continue
        g = np.diff(np.asarray(r.chunk_ns, dtype=np.int64)) / NS_PER_MS
        k = np.maximum(np.asarray(r.chunk_tokens[1:], dtype=np.int64), 1)
        gaps.append(g)
        per_tok.append(np.repeat(g / k, k))
    if not gaps:
        return np.empty(0), np.empty(0)
    return np.concatenate(gaps), np.concatenate(per_tok)


def _tokens_in_window(r: RequestRecord, start: int, end: int) -> float:
    """Output tokens of `r` that arrived inside [start, end]. Chunks carry their own counts;
    when usage says more tokens than the chunks counted (multi-token chunks without
    per-chunk usage), each chunk's share is scaled so the request's total is usage's."""
    if not r.chunk_ns:
        return 0.0
    tok = np.asarray(r.chunk_tokens, dtype=float)
    t = np.asarray(r.chunk_ns)
    inside = float(tok[(t >= start) & (t <= end)].sum())
    total = float(tok.sum())
    return inside * (r.output_tokens / total) if total > 0 else 0.0


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most requests the client had on the wire at once (send -> end)."""
    ev = sorted([(r.send_ns, 1) for r in records] + [(r.end_ns, -1) for r in records])
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def meets_slo(r: RequestRecord, thresholds: dict[str, float]) -> bool:
    """A request counts toward goodput when it completed and every threshold holds."""
    if r.status != "ok":
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


def compute_metrics(
    records: Sequence[RequestRecord],
    *,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    slo: SLO | None = None,
    stream: bool = True,
) -> Metrics:
    """All client metrics of one run from its raw records."""
    if not records:
        return Metrics()
    start, end, _ = measurement_window(records, warmup_s, cooldown_s)
    window_s = max((end - start) / NS_PER_S, 1e-9)
    measured = [r for r in records if start <= r.send_ns <= end]
    ok = [r for r in measured if r.status == "ok"]
    failed = [r for r in measured if r.status == "error"]
    cancelled = sum(r.status == "cancelled" for r in measured)
    aborted = sum(r.status == "aborted" for r in measured)
    attempted = len(measured) - cancelled - aborted

    lat = [request_latencies_ms(r) for r in ok]
    ttft = [x[0] for x in lat if x[0] is not None]
    tpot = [x[1] for x in lat if x[1] is not None] if stream else []
    e2e = [x[2] for x in lat if x[2] is not None]
    pooled, per_tok = itl_samples_ms(ok) if stream else (np.empty(0), np.empty(0))
    first_event = [(r.first_event_ns - r.send_ns) / NS_PER_MS for r in ok if r.first_event_ns]
    lag = [(r.send_ns - r.scheduled_ns) / NS_PER_MS for r in measured if r.scheduled_ns is not None]

    out_tokens = sum(_tokens_in_window(r, start, end) for r in records)
    in_tokens = sum(r.input_tokens for r in measured if r.chunk_ns)
    # Completions are counted by when they finish (steady-state throughput), whatever
    # their send time; latency samples are taken from requests sent in the window.
    done_in_window = [
        r for r in records if r.status == "ok" and r.chunk_ns and start <= r.chunk_ns[-1] <= end
    ]
    errors_by_class: dict[str, int] = {}
    for r in failed:
        key = r.error or "unknown"
        errors_by_class[key] = errors_by_class.get(key, 0) + 1
    scheduled = [r for r in records if r.scheduled_ns is not None]

    m = Metrics(
        window_start_ns=start,
        window_end_ns=end,
        window_s=window_s,
        measured=len(measured),
        completed=len(ok),
        failed=len(failed),
        cancelled=cancelled,
        aborted=aborted,
        error_rate=len(failed) / attempted if attempted else 0.0,
        errors_by_class=dict(sorted(errors_by_class.items())),
        ttft_ms=summarize(ttft),
        first_event_ms=summarize(first_event),
        tpot_ms=summarize(tpot),
        itl_ms=summarize(pooled),
        itl_per_token_ms=summarize(per_tok),
        e2e_ms=summarize(e2e),
        send_lag_ms=summarize(lag),
        queue_ms=summarize([r.queue_ns / NS_PER_MS for r in measured]),
        input_tokens=int(in_tokens),
        output_tokens=int(round(out_tokens)),
        output_tok_s=out_tokens / window_s,
        total_tok_s=(out_tokens + in_tokens) / window_s,
        req_s=len(done_in_window) / window_s,
        offered_req_s=(
            sum(start <= r.scheduled_ns <= end for r in scheduled) / window_s  # type: ignore[operator]
            if scheduled
            else None
        ),
        sent_req_s=len(measured) / window_s,
        max_in_flight=max_in_flight(records),
    )
    compared = [
        r
        for r in measured
        if r.usage_completion_tokens is not None and r.tokenizer_completion_tokens is not None
    ]
    diffs = [abs(r.usage_completion_tokens - r.tokenizer_completion_tokens) for r in compared]  # type: ignore[operator]
    m.token_count_compared = len(compared)
    m.token_count_mismatched = sum(d > 0 for d in diffs)
    m.token_count_max_abs_diff = max(diffs, default=0)
    if slo is not None:
        apply_slo(m, records, measured, slo, attempted)
    return m


def apply_slo(
    m: Metrics,
    records: Sequence[RequestRecord],
    measured: Sequence[RequestRecord],
    slo: SLO,
    attempted: int,
) -> None:
    """Goodput (good requests finishing in the window per second), attainment (good /
    attempted: errors and timeouts are misses; deliberate cancellations and run-end aborts
    are not attempts) and pass/fail of every percentile target."""
    thr = slo.per_request()
    start, end = m.window_start_ns, m.window_end_ns
    finishing = [r for r in records if r.chunk_ns and start <= r.chunk_ns[-1] <= end]
    m.goodput_req_s = sum(meets_slo(r, thr) for r in finishing) / m.window_s
    good = sum(meets_slo(r, thr) for r in measured)
    m.slo_attainment = good / attempted if attempted else None
    checks: list[SLOCheck] = []
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        targets = getattr(slo, metric)
        if targets is None:
            continue
        dist = getattr(m, metric)
        for stat, target in targets.items():
            v = getattr(dist, stat)
            checks.append(
                SLOCheck(
                    metric=metric,
                    stat=stat,
                    target=target,
                    value=v,
                    ok=v is not None and v <= target,
                )
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


def client_warnings(
    m: Metrics, *, open_loop: bool, cpu_util: float, lag_p99_limit_ms: float = 10.0
) -> list[str]:
    """Reasons to believe the client, not the server, limited the run (field notes #2/#3).
    Non-empty means the result is flagged `client.bottleneck`."""
    out = []
    if open_loop and m.send_lag_ms.p99 is not None and m.send_lag_ms.p99 > lag_p99_limit_ms:
        out.append(f"send lag P99 {m.send_lag_ms.p99:.1f} ms > {lag_p99_limit_ms:g} ms")
    if open_loop and m.offered_req_s and m.sent_req_s < 0.98 * m.offered_req_s:
        out.append(f"sent {m.sent_req_s:.1f} req/s < 98% of offered {m.offered_req_s:.1f} req/s")
    if cpu_util > 0.9:
        out.append(f"client CPU {cpu_util:.0%} of its cores")
    return out
