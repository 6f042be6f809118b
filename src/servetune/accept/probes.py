"""The live probes of seed 003 §15: each sends its load as points through `Prober`
(the measure seam) and judges what came back. Thresholds are stated where they are set;
where the seed gives none, the docs (docs/accept.md) say why the number was chosen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servetune.accept.checklist import (
    Finding,
    Status,
    failed,
    not_applicable,
    passed,
    unchecked,
)
from servetune.accept.measuring import (
    Prober,
    Sizes,
    at_rate,
    materialize_one,
    output_p99,
    single,
    total_p99,
)
from servetune.bench.client import Timeouts
from servetune.measure.real import engine_sampling
from servetune.measure.steady import SteadyRule, judge
from servetune.results.schema import RequestRecord, RunResult
from servetune.status import RequestStatus
from servetune.workload.materialize import Request
from servetune.workload.spec import WorkloadSpec

SHED_CODES = (429, 503)  # what a deployment answers when it sheds load
# What an engine or gateway answers a request too long for it: vLLM and llama.cpp 400,
# TGI 422 (validation), a gateway 413. Any other 4xx is no length refusal.
LENGTH_REFUSALS = (400, 413, 422)
# Answers that say nothing about a request's length: it was shed or not let in.
NOT_JUDGED = {
    **dict.fromkeys(SHED_CODES, "re-run when the deployment has room (the request was shed)"),
    **dict.fromkeys((401, 403), "give an --api-key the deployment accepts"),
}
REJECT_FAST_MS = 1000.0  # a shed request answered later than this has queued anyway
# How fast the admitted requests' TTFT may grow under overload k: at most FLAT_SHARE of
# what an unbounded queue gives. Without a bound the backlog grows at (k - 1) x capacity
# requests per second and each waits backlog / capacity, so TTFT rises (k - 1) s per s
# (bare vLLM here: +2.1 s/s at 4x); a bounded queue stays flat within the noise of a
# short window (llama.cpp behind the front: +0.09 s/s over 6 s), hence 10%.
FLAT_SHARE = 0.1
COLD_RATIO = 3.0  # first requests vs steady TTFT above this: traffic came before warm-up
# A non-streaming request that outlived its client's patience this many times over was not
# given up only because the client's own timer ran late (an event loop reads the answer
# before a timer that fell due while the process waited for a CPU).
LATE_CLIENT = 2.0


@dataclass
class Capacity:
    """The deployment's measured capacity: completions per second with `users` busy."""

    req_s: float
    users: int
    run_id: str


def _ttft_ms(r: RequestRecord) -> float | None:
    return (r.chunk_ns[0] - r.send_ns) / 1e6 if r.chunk_ns else None


def _ok(res: RunResult) -> list[RequestRecord]:
    return [r for r in res.records if r.status == RequestStatus.OK]


def warm_up(p: Prober, spec: WorkloadSpec, sizes: Sizes) -> Finding:
    """The first requests the deployment sees from us vs the rest (one user, in order):
    an instance put behind traffic before its warm-up (JIT, CUDA graphs, caches) answers
    its first requests several times slower (seed 003 §11, 预热: load, JIT, CUDA graphs,
    NCCL and typical requests done before traffic)."""
    n = max(sizes.warm_requests, 6)
    res = p.measure("warmup", spec.with_load(concurrency=1, count=n))
    # answered requests only: a truncated, reset or stalled one streamed chunks too (it
    # had counted as completed, and its TTFT in the cold-start ratio)
    ttft = [t for r in sorted(_ok(res), key=lambda r: r.send_ns) if (t := _ttft_ms(r))]
    if len(ttft) < 6:
        return failed(
            "the deployment must answer plain requests", f"only {len(ttft)}/{n} requests completed"
        ).with_run(res.id)
    first = float(np.median(ttft[:2]))
    steady = float(np.median(ttft[len(ttft) // 2 :]))
    ratio = first / steady if steady > 0 else 1.0
    ev = f"first 2 requests TTFT median {first:.0f} ms vs steady {steady:.0f} ms ({ratio:.1f}x)"
    if ratio > COLD_RATIO and _lag_explains(res, first - steady):
        return _late_client(res, "a cold start", [ev], ratio=ratio)
    if ratio > COLD_RATIO:
        return failed(
            "warm the instance up (typical requests) before it takes traffic", ev, ratio=ratio
        ).with_run(res.id)
    return passed(ev, ratio=ratio).with_run(res.id)


def capacity(p: Prober, spec: WorkloadSpec, users: int, sizes: Sizes) -> Capacity:
    """Completions per second with `users` closed-loop users (the saturated rate)."""
    res = p.measure(
        f"capacity-c{users}",
        spec.with_load(concurrency=users, count=max(sizes.capacity_requests, 3 * users)),
    )
    return Capacity(res.metrics.req_s, users, res.id)


def _run_to_length(spec: WorkloadSpec, engine: str) -> WorkloadSpec:
    """The probe's request with `ignore_eos` on whatever the workload sends: a model that
    stops at its end-of-text token before the cap shows nothing about the cap. Not to an
    engine that answers 422 to fields outside the OpenAI schema (engine_sampling): that
    422 would read as the cap's refusal."""
    sampling = spec.sampling.model_copy(update={"ignore_eos": True})
    return engine_sampling(spec.model_copy(update={"sampling": sampling}), engine)


def output_cap(p: Prober, spec: WorkloadSpec, cap: int | None) -> Finding:
    """Ask for 4x the promised cap: the server must refuse (4xx) or stop at the cap for
    length (finish_reason "length"). An answer that stopped under the cap for another
    reason (end of text, a stop string) was never long enough to meet a cap: it is
    unchecked, not a pass. Without a promised cap there is nothing to hold the server to:
    a missing input is unchecked, as every other item's is, not a failed deployment."""
    if cap is None:
        return unchecked("give --max-new-tokens N (the output cap the deployment promises)")
    ask = 4 * cap
    req = materialize_one(p.tokenizer, spec, 16, ask)
    res = p.measure(
        "output-cap", _run_to_length(single(spec, req, stream=True), p.dep.engine), [req]
    )
    rec = res.records[0]
    base = f"asked max_tokens={ask} (4x the cap {cap})"
    if rec.http_status in LENGTH_REFUSALS:
        return passed(f"{base}: refused with HTTP {rec.http_status}", cap=cap).with_run(res.id)
    if fix := _unjudged_fix(rec, "output cap"):
        return unchecked(fix, f"{base}: HTTP {rec.http_status}", cap=cap).with_run(res.id)
    if rec.status != RequestStatus.OK:
        return failed(
            "the over-long request must be refused or truncated, not fail",
            f"{base}: {rec.error} {rec.error_detail or ''}".strip(),
        ).with_run(res.id)
    got = rec.output_tokens
    if got <= cap and rec.finish_reason == "length":
        return passed(f"{base}: truncated at {got} tokens", cap=cap, got=got).with_run(res.id)
    if got <= cap:
        return unchecked(
            "the answer must run to a length limit: serve the probe a model that honours "
            "ignore_eos, or give a --max-new-tokens it reaches",
            f"{base}: the model stopped at {got} tokens "
            f"(finish_reason {rec.finish_reason or 'not given'}), before any cap",
            cap=cap,
            got=got,
        ).with_run(res.id)
    return failed(
        "cap the output in front of the engine: a gateway that lowers max_tokens "
        f"(servetune accept-shedder --max-tokens {cap}); vLLM's --max-model-len bounds "
        "prompt + output only, and llama.cpp's -n is overridden by a request's own max_tokens",
        f"{base}: the server generated {got} tokens",
        cap=cap,
        got=got,
    ).with_run(res.id)


def input_limit(p: Prober, spec: WorkloadSpec, sample: list[Request], limit: int | None) -> Finding:
    """The context limit against the real distribution's P99 input + output, and a
    request over the limit: refused quickly (400/413/422) or served truncated (its usage
    within the limit), never served whole, a 5xx or a hang."""
    need = total_p99(sample)
    if limit is None:
        return unchecked(
            "give --config with max_model_len (or a server that reports it)",
            f"workload P99 input+output = {need} tokens",
        )
    ev = [f"context limit {limit} tokens vs workload P99 input+output {need} tokens"]
    req = materialize_one(p.tokenizer, spec, limit + 64, 8)
    res = p.measure(
        "input-over-limit",
        single(spec, req, stream=False),
        [req],
        timeouts=Timeouts(10.0, 60.0, 60.0, 60.0),
    )
    rec = res.records[0]
    line, status, fix = _over_limit(rec, req.prompt_tokens, limit)
    ev.append(line)
    values: dict[str, Any] = {"limit": limit, "need": need}
    if rec.usage_prompt_tokens is not None:
        values["served_prompt_tokens"] = rec.usage_prompt_tokens
    if need > limit:
        return failed(
            f"raise the input limit to at least {need} tokens (the real P99), or "
            "route long requests to a long-context pool",
            *ev,
            **values,
        ).with_run(res.id)
    return Finding(status, ev, fix=fix, values=values).with_run(res.id)


def _over_limit(rec: RequestRecord, sent: int, limit: int) -> tuple[str, Status, str | None]:
    """How the deployment answered a `sent`-token prompt over its `limit`: (evidence
    line, status, fix)."""
    ms = (rec.end_ns - rec.send_ns) / 1e6
    what = f"a {sent}-token prompt"
    if rec.http_status in LENGTH_REFUSALS:
        return f"{what} was refused: HTTP {rec.http_status} in {ms:.0f} ms", Status.PASS, None
    if fix := _unjudged_fix(rec, "input limit"):
        return f"{what} got HTTP {rec.http_status} after {ms:.0f} ms", Status.UNCHECKED, fix
    if rec.status != RequestStatus.OK:
        got = f"HTTP {rec.http_status}" if rec.http_status else (rec.error or rec.status)
        return (
            f"{what} got {got} after {ms:.0f} ms",
            Status.FAIL,
            "a prompt over the limit must be refused (400, 413 or 422), not an error or a hang",
        )
    served = rec.usage_prompt_tokens
    if served is None:
        return (
            f"{what} was served (HTTP 200) in {ms:.0f} ms; the answer reports no usage",
            Status.UNCHECKED,
            "report usage in the answer, or refuse over-limit prompts: a 200 without the "
            "prompt's token count cannot show the prompt was truncated",
        )
    if served > limit:
        return (
            f"{what} was served whole: {served} prompt tokens > the limit {limit}",
            Status.FAIL,
            "the server does not enforce max_model_len: set the engine's context limit "
            f"(--max-model-len {limit}) or refuse longer prompts at the gateway",
        )
    return f"{what} was served truncated to {served} tokens in {ms:.0f} ms", Status.PASS, None


def _unjudged_fix(rec: RequestRecord, what: str) -> str | None:
    """Why a one-request probe's answer says nothing about the length limit under test
    (`what`): its request was shed (429/503) or not let in (401/403); None otherwise.
    Passing such an answer as a refusal once accepted a deployment that refused all."""
    status = rec.http_status
    if status not in NOT_JUDGED:
        return None
    return f"{NOT_JUDGED[status]}: HTTP {status} says nothing about the {what}"


def queue_bound(p: Prober, spec: WorkloadSpec, cap: Capacity, sizes: Sizes) -> Finding:
    """Offer `overload` x the measured capacity (open loop): a bounded queue sheds the
    excess with 429/503 quickly, and the wait of what it admits stays flat. A bound must
    also admit what the deployment carries: one that serves nothing (every request 429)
    bounds nothing, and with no capacity measured there is no overload to offer."""
    if not (np.isfinite(cap.req_s) and cap.req_s > 0):
        return failed(
            "the deployment must serve what it can carry and shed only the excess",
            f"the capacity probe ({cap.users} users, run {cap.run_id}) served no request: "
            "no capacity to overload, nothing admitted to bound",
            offered_req_s=0.0,
            served=0,
        ).with_run(cap.run_id)
    rate = max(cap.req_s, 0.1) * sizes.overload
    n = max(sizes.min_queue_requests, int(rate * sizes.queue_seconds))
    pt = at_rate(spec, rate, n)
    res = p.measure(f"overload-x{sizes.overload:g}", pt)
    shed = [r for r in res.records if r.http_status in SHED_CODES]
    ok = _ok(res)
    max_slope = FLAT_SHARE * (sizes.overload - 1)
    st = judge(res, pt, SteadyRule(warmup_s=0.0, window_s=1.0, max_queue_slope=max_slope))
    slope = st.queue_slope if st is not None else None
    reject_ms = [(r.end_ns - r.send_ns) / 1e6 for r in shed]
    p95_reject = float(np.percentile(reject_ms, 95)) if reject_ms else None
    e2e = [(r.chunk_ns[-1] - r.send_ns) / 1e9 for r in ok if r.chunk_ns]
    ev = [
        f"offered {rate:.2f} req/s = {sizes.overload:g}x the measured capacity "
        f"{cap.req_s:.2f} req/s ({cap.users} users, run {cap.run_id}); {n} requests",
        f"{len(shed)} shed with 429/503"
        + (f", P95 time to reject {p95_reject:.0f} ms" if p95_reject is not None else ""),
        f"{len(ok)} served; TTFT slope "
        + ("not measured" if slope is None else f"{slope:+.3f} s per s of run")
        + (f"; E2E max {max(e2e):.1f} s" if e2e else ""),
    ]
    values = {
        "offered_req_s": rate,
        "shed": len(shed),
        "served": len(ok),
        "reject_p95_ms": p95_reject,
        "queue_slope_s_per_s": slope,
    }
    if not shed:
        return failed(
            "put a hard queue bound in front (a gateway that answers 429 beyond N "
            "in flight, e.g. `servetune accept-shedder`)",
            *ev,
            **values,
        ).with_run(res.id)
    if not ok:
        return failed(
            "the bound refused everything: admit what the deployment carries at its "
            "capacity and shed only the excess",
            *ev,
            **values,
        ).with_run(res.id)
    slow = p95_reject is not None and p95_reject > REJECT_FAST_MS
    grows = slope is not None and slope > max_slope
    reject_excess = p95_reject - REJECT_FAST_MS if slow and p95_reject is not None else None
    growth = slope * res.duration_s * 1000.0 if grows and slope is not None else None  # ms
    if (slow or grows) and _lag_explains(res, reject_excess, growth):
        return _late_client(res, "rejects and queue growth", ev, **values)
    if slow:
        return failed(
            f"reject at once: shed requests waited over {REJECT_FAST_MS:.0f} ms", *ev, **values
        ).with_run(res.id)
    if grows:
        return failed(
            f"the admitted queue still grows (> {max_slope:.2g} s/s): lower the bound",
            *ev,
            **values,
        ).with_run(res.id)
    return passed(*ev, **values).with_run(res.id)


def _lag_explains(res: RunResult, *excess_ms: float | None) -> bool:
    """Whether the client's own lateness explains every failing excess it is given (ms past
    what a check allows; None for a figure that passed): each no larger than the client's
    event-loop lag (P99). A starved client timestamps late, so such a figure says nothing
    about the deployment; a real slow reject, growing queue or cold start exceeds it."""
    lag_ms = res.client.loop_lag_p99_ms
    return all(e is None or e <= lag_ms for e in excess_ms)


def _late_client(res: RunResult, timed: str, ev: list[str], **values: Any) -> Finding:
    """Unchecked, not failed: what `timed` measured may be the client's own lateness."""
    lag = res.client.loop_lag_p99_ms
    return unchecked(
        f"re-run where the client gets a core (the host was too busy to time {timed})",
        *ev,
        f"the client's own event loop ran {lag:.0f} ms late (P99): what looks slow may be "
        "the client's, not the deployment's",
        **values,
        client_lag_p99_ms=lag,
    ).with_run(res.id)


def cancellation(p: Prober, spec: WorkloadSpec, users: int, sizes: Sizes) -> Finding:
    """Cancel streams after a few chunks, and abandon non-streaming requests after a
    client timeout; then read the engine's running gauge until it is 0 (time to free)."""
    m = p.metrics()
    if m is None or m.get("requests_running") is None:
        return unchecked(
            "expose the engine's /metrics with a running-requests gauge "
            "(llama.cpp: --metrics) to read when cancelled work is freed"
        )
    long_out = max(256, 4 * output_p99(p.requests(spec.with_load(concurrency=1, count=50))))
    data = spec.with_load(concurrency=users, count=users).model_dump()
    data["mix"] = [
        {**sub, "output_tokens": {"dist": "fixed", "value": long_out}} for sub in data["mix"]
    ]
    ev: list[str] = []
    values: dict[str, float | None] = {}
    runs: list[str] = []
    ok, idle, busy_host, abandon_after = True, False, False, sizes.nonstream_abandon_s
    for stream in (True, False):
        pt = WorkloadSpec.model_validate({**data, "stream": stream})
        kind = "streaming" if stream else "non-streaming"
        if stream:
            res = p.measure(
                "cancel-stream",
                pt,
                cancel_fraction=1.0,
                cancel_after_chunks=sizes.cancel_after_chunks,
            )
        else:
            t = abandon_after
            res = p.measure("cancel-nonstream", pt, timeouts=Timeouts(10.0, t, t, t))
        runs.append(res.id)
        if stream:  # abandon the non-streaming requests as far in as the streams went
            waited = [
                (r.end_ns - r.send_ns) / 1e9
                for r in res.records
                if r.status == RequestStatus.CANCELLED
            ]
            abandon_after = (
                max(0.05, float(np.median(waited))) if waited else sizes.nonstream_abandon_s
            )
            values["nonstream_abandon_s"] = abandon_after
        ended = res.anchor_ns + max((r.end_ns for r in res.records), default=0)
        freed = p.wait_idle(ended, sizes.free_within_s)
        gave_up = sum(r.status != RequestStatus.OK for r in res.records)
        values[f"{kind}_free_s"] = freed
        if not gave_up:
            idle = True
            why, host = _nothing_given_up(res, stream, abandon_after)
            busy_host = busy_host or host
            ev.append(f"{kind}: {why}: nothing to free")
        elif freed is None:
            ok = False
            ev.append(
                f"{kind}: {gave_up}/{len(res.records)} requests given up by the client; "
                f"the engine still runs work {sizes.free_within_s:g} s later"
            )
        else:
            ev.append(
                f"{kind}: {gave_up}/{len(res.records)} requests given up; engine idle "
                f"{freed:.2f} s after the last (gauge polled every 0.1 s)"
            )
    if not ok:
        f = failed(
            "the engine (or the gateway in front) must abort a request when its client goes",
            *ev,
            **values,
        )
    elif idle:
        fix = (
            "re-run where the client and the stream get a core (the host was too busy)"
            if busy_host
            else f"send requests that outlive the client's patience (outputs of {long_out})"
        )
        f = unchecked(fix, *ev)
        f.values = values
    else:
        f = passed(*ev, **values)
    f.runs = runs
    return f


def _nothing_given_up(res: RunResult, stream: bool, patience_s: float) -> tuple[str, bool]:
    """Why every request of a cancellation probe ended before its client gave up, and
    whether the cause is the host rather than the server: a held stream (every chunk at
    the end) cannot be cut after its first chunks, and a client whose timer fired only
    after the answer came was not scheduled in time (measured on a 2-core host with a
    one-core hog: a 0.08 s patience, answers read 2.9 s in)."""
    if stream and res.metrics.stream_buffered:
        return "the streams arrived held (every chunk at once), so none could be cut", True
    took = [(r.end_ns - r.send_ns) / 1e9 for r in res.records]
    if not stream and took and min(took) > LATE_CLIENT * patience_s:
        return (
            f"the client's {patience_s:.2f} s patience fired only after the answers had "
            f"come ({min(took):.2f} s in): the client was not scheduled in time",
            True,
        )
    return (
        "every request ended before the client gave up (an output cap shorter than the probe's?)",
        False,
    )


def per_user(p: Prober, spec: WorkloadSpec, cap: Capacity, sizes: Sizes) -> Finding:
    """Two API keys at once: one floods at `overload` x capacity, the other sends a light
    load. A per-user limit refuses the flood (429) and serves the light user in full."""
    keys = p.dep.api_keys
    if len(keys) < 2:
        return unchecked(
            "give two API keys (--api-key A --api-key B) of a gateway that limits each user"
        )
    flood_users = max(2, int(np.ceil(cap.users * sizes.overload)))
    flood = spec.with_load(concurrency=flood_users, count=flood_users * 4)
    light = spec.with_load(concurrency=1, count=max(4, flood_users))
    a, b = p.measure_together(
        [
            ("user-a-flood", flood, {"api_key": keys[0]}),
            ("user-b-light", light, {"api_key": keys[1]}),
        ]
    )
    a_shed = sum(r.http_status in SHED_CODES for r in a.records)
    b_shed = sum(r.http_status in SHED_CODES for r in b.records)
    b_ok = len(_ok(b))
    ev = [
        f"user A: {flood_users} concurrent, {a_shed}/{len(a.records)} refused (429/503)",
        f"user B: 1 concurrent, {b_ok}/{len(b.records)} served, {b_shed} refused",
    ]
    f = (
        passed(*ev)
        if a_shed and not b_shed and b_ok == len(b.records)
        else failed("limit concurrency (and RPS, tokens) per API key at the gateway", *ev)
    )
    f.runs = [a.id, b.id]
    return f


def monitoring(p: Prober) -> tuple[Finding, Finding]:
    """Which metric families the engine exports (its /metrics), for two items: latency
    histograms (TTFT, TPOT/ITL, queue time: P99 comes from histograms) and the prefix
    cache hit rate."""
    m = p.metrics()
    if m is None:
        miss = "the engine exports no /metrics (llama.cpp: --metrics)"
        return failed("expose /metrics and scrape it", miss), failed("expose /metrics", miss)
    want = {"ttft_seconds": "TTFT", "itl_seconds": "TPOT/ITL", "queue_time_seconds": "queue time"}
    found = [f"{label}: {n}" for n, label in want.items() if n in m.histograms]
    missing = [label for n, label in want.items() if n not in m.histograms]
    names = sorted(m.raw)
    ev = [f"histograms found: {', '.join(found) or 'none'}", f"{len(names)} series exported"]
    if missing:
        lat = failed(
            f"the engine exports no {', '.join(missing)} histogram: measure them at "
            "the gateway or pick an engine that exports them",
            *ev,
        )
    else:
        lat = passed(*ev)
    hit = [n for n in ("prefix_cache_hits_total", "prefix_cache_hit_rate") if n in m.values]
    llamacpp_rate = m.engine == "llamacpp" and {
        "prefix_cache_hits_total",
        "prompt_tokens_total",
    } <= set(m.values)
    if hit and ("prefix_cache_queries_total" in m.values or "prefix_cache_hit_rate" in m.values):
        pc = passed(f"prefix cache series: {', '.join(hit)} (+ queries): hit rate = hits / queries")
    elif llamacpp_rate:  # llama.cpp counts the prompt tokens it did not take from the cache
        pc = passed(
            "llama.cpp prompt_tokens_cached_total and prompt_tokens_total: hit rate = "
            "cached / (cached + processed)"
        )
    elif hit:
        pc = failed(
            "export prefix-cache queries too: hits alone give no rate",
            f"found {', '.join(hit)} but no queries counter",
        )
    else:
        pc = failed("monitor the prefix-cache hit rate", "no prefix-cache series exported")
    return lat, pc


def hardware_monitoring(dcgm_url: str | None, on_gpu: bool) -> Finding:
    """GPU memory, utilisation, temperature, power and errors in a DCGM exporter."""
    if dcgm_url is None:
        if not on_gpu:
            return not_applicable("the deployment serves on CPU: no GPU to monitor")
        return unchecked("give --dcgm-url (a DCGM exporter's /metrics)")
    import httpx

    try:
        text = httpx.get(dcgm_url, timeout=5.0).text
    except httpx.HTTPError as exc:
        return failed("make the DCGM exporter reachable", f"{dcgm_url}: {type(exc).__name__}")
    want = {
        "memory": "DCGM_FI_DEV_FB_USED",
        "utilisation": "DCGM_FI_DEV_GPU_UTIL",
        "temperature": "DCGM_FI_DEV_GPU_TEMP",
        "power": "DCGM_FI_DEV_POWER_USAGE",
        "errors": "DCGM_FI_DEV_XID_ERRORS",
    }
    found = {k: v for k, v in want.items() if v in text}
    ev = [f"found: {', '.join(f'{k} ({v})' for k, v in found.items()) or 'none'}"]
    if len(found) < len(want):
        miss = [v for k, v in want.items() if k not in found]
        return failed(f"add {', '.join(miss)} to the exporter's counters", *ev)
    return passed(*ev)
