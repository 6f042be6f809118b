"""The diagnosis rules: each a small pure function from `Evidence` to a `Finding` (or None),
citing the seed section it implements. A finding says what fired, with the numbers that
fired it, and the seed's actions in the seed's order, each with a knob and a next value.

Ordering (`diagnose`): a host problem, then a client one, come first, because while the
engine cannot get a core or the client cannot send, every engine figure is suspect (DESIGN.md
metric contract: an overloaded client is never counted as server latency). Then the
engine findings by score: errors and lost capacity before latency shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from servetune.diagnose.evidence import Evidence
from servetune.diagnose.knobs import Defaults, engine_has, knobs
from servetune.diagnose.predict import (
    fits_in_kv,
    fp8_kv_gain,
    queue_free_ttft_ms,
)
from servetune.sim.engine import llamacpp_batches
from servetune.telemetry.contention import contention, free_cores

# A host problem first: a starved host also starves the client, so its lag is a symptom.
KINDS = ("host", "client", "engine")

# Thresholds. The seeds name the symptoms, not the numbers: the values are servetune's,
# chosen so the symptoms reproduced on purpose here fire and healthy runs do not
# (tests/test_diagnose*.py); the runner's client warnings are reused where they exist.
QUEUE_SHARE = 0.3  # engine queue time >= 30% of TTFT: TTFT is mostly waiting
KV_FULL = 0.95  # KV usage >= 95% of the pool: "KV Cache接近满载" (seed 003 §13)
TAIL_RATIO = 3.0  # P99 >= 3x P50 ("P99 far above P50 means spikes", seed 000 §6.3)
SPREAD_RATIO = 4.0  # lengths whose P99 is >= 4x their P50 are a long/short mix
STARVED_WAIT = 0.5  # engine threads waited for a CPU >= half their runnable time
STARVED_CORES = 0.25  # ... and that wait is worth a quarter core or more (an idle engine
# that waits 60% of its few runnable microseconds is not starved)
HOST_BUSY = 0.9  # host CPU >= 90% busy
OTHERS_SHARE = 1 / 3  # processes other than the engine and the client hold >= a third of
# the busy CPU (an engine whose own threads outnumber the cores also waits for CPUs: that
# is not a host problem, so the wait alone does not fire). A share of the busy CPU, not of
# the cores: a starved engine still holds its pinned core, so six hogs on two cores were
# seen holding only 0.91 of them next to the engine's 1.04 while it waited 1.2 cores' worth
STEAL = 0.05  # >= 5% of CPU time stolen by the hypervisor
LAG_MS = 10.0  # send lag P99 above 10 ms (the runner's client warning, metrics.compute) ...
LAG_SHARE = 0.05  # ... and above 5% of TTFT P50: large enough to distort what is measured
SENT_SHARE = 0.98  # sent under 98% of offered (the runner's client warning)
CLIENT_CPU = 0.9  # the client's processes above 90% of their cores (the runner's warning)
GPU_LOW_UTIL = 0.5  # GPU busy under half the time
CLOCK_DROP = 0.8  # SM clock under 80% of its maximum: downclocked (seed 003 §13 "GPU降频")
ERROR_SHARE = 0.001  # failed requests over 0.1% of those sent: seed 003 §1's 5xx ceiling
# "TTFT high" / "TPOT high" is judged against the run's SLO; a run without one against seed
# 003 §1's example service-level targets ("P95 TTFT小于800毫秒, P99 TTFT小于2秒, P95 TPOT小于
# 40毫秒每token"): a 51 ms TTFT that is most of a 12-token answer is not high.
PCTS = ("p50", "p90", "p95", "p99")
SEED_SLO = {"ttft_ms": {"p95": 800.0, "p99": 2000.0}, "tpot_ms": {"p95": 40.0}}


@dataclass
class Action:
    """One thing to change: the knob, its value now and the next one to try, why, and the
    predicted effect when the planner or a queueing bound can say it."""

    knob: str
    now: Any
    next: Any
    why: str
    predicted: str | None = None

    def line(self) -> str:
        s = f"{self.knob}: {self.now} -> {self.next}  ({self.why})"
        return s + (f"; predicted {self.predicted}" if self.predicted else "")


@dataclass
class Finding:
    key: str
    kind: str  # client | host | engine
    title: str
    seed: str  # the seed section(s) this rule implements
    trigger: str  # the numbers that fired it
    score: float
    actions: list[Action] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.0f} ms")


def _ttft_share(ev: Evidence) -> float | None:
    t, e = ev.ttft.get("mean"), ev.e2e.get("mean")
    return t / e if t is not None and e else None


def _over_target(ev: Evidence, metric: str) -> str | None:
    """Why `metric` (ttft_ms, tpot_ms) is high: its first statistic above the run's SLO
    target for it, else above seed 003 §1's example target (`SEED_SLO`); None when every
    one is within (or nothing was measured)."""
    targets, whose = ev.slo.get(metric), "the run's SLO"
    if not targets:
        targets, whose = SEED_SLO[metric], "seed 003 §1's example; the run set none"
    dist = ev.ttft if metric == "ttft_ms" else ev.tpot
    name = metric.split("_")[0].upper()
    for stat, target in targets.items():
        # a percentile not at hand is at least the highest lower one measured
        below = PCTS[: PCTS.index(stat) + 1] if stat in PCTS else (stat,)
        seen = [s for s in below if dist.get(s) is not None]
        if seen and (v := dist[seen[-1]]) > target:
            return (
                f"{name} {_stat(seen[-1])} {_ms(v)} over the {_stat(stat)} target of"
                f" {_ms(target)} ({whose})"
            )
    return None


def _stat(stat: str) -> str:
    return stat.upper() if stat in PCTS else stat


def _smaller(
    knob: str, now: Any, default: Defaults, nxt: Callable[[int], int], why: str
) -> Action | None:
    """`knob` lowered to `nxt(base)`: base is its value now, else the engine's lowest default
    (so the value is below the default on every device). None when that is not below base:
    a "smaller" that is the same or larger is no advice. An engine whose default is not
    known here gets the direction only."""
    base = now or (default[0] if default else None)
    if base is None:
        return Action(knob, "default", "below its default", why)
    value = nxt(int(base))
    return Action(knob, now or "default", value, why) if value < int(base) else None


def _bigger(
    knob: str, now: Any, default: Defaults, nxt: Callable[[int], int], why: str
) -> Action | None:
    """`knob` raised to `nxt(base)`: base is its value now, else the engine's default. None
    when that is not above base. A default that depends on the device (vLLM's) gives no
    number: nxt of the largest would be several times the smallest, and a batch or budget
    raised that far on a small GPU is the next OOM."""
    base = now or (default[0] if default and default[0] == default[1] else None)
    if base is None:
        shown = f" ({default[0]}, or {default[1]} by GPU)" if default else ""
        return Action(knob, "default", f"above its default{shown}", why)
    value = nxt(int(base))
    return Action(knob, now or "default", value, why) if value > int(base) else None


def _queue_share(ev: Evidence) -> float | None:
    """Share of TTFT spent queued: the engine's own queue histogram when it has one; else
    a load past the batch cap queues (users - cap) of every `users` requests: a closed
    loop's users, an open loop's peak in flight (no arrival waits for an answer). None
    when no request completed: there is no TTFT to take a share of."""
    t = ev.ttft.get("mean")
    if not t:
        return None
    if ev.queue_ms is not None:
        return min(1.0, ev.queue_ms / t)
    cap, users = ev.batch_cap, ev.concurrency or ev.max_in_flight
    if cap and users and ev.waiting_max and ev.waiting_max > 0 and users > cap:
        return (users - cap) / users
    return None


def client_limited(ev: Evidence) -> Finding | None:
    """The client, not the server, set the pace: it sent behind its schedule, sent less
    than offered, or ran out of CPU (DESIGN.md metric contract; field notes, load testers
    #2/#3). The runner's event-loop lag warning alone does not fire: on a busy host it is
    the host's symptom (host_starved), and a closed loop has no schedule to fall behind."""
    if ev.live:
        return None
    why = []
    lag, t50 = ev.send_lag_p99_ms, ev.ttft.get("p50") or 0.0
    if ev.offered_req_s and lag is not None and lag > max(LAG_MS, LAG_SHARE * t50):
        why.append(f"send lag P99 {lag:.0f} ms (TTFT P50 {t50:.0f} ms)")
    if ev.offered_req_s and ev.sent_req_s < SENT_SHARE * ev.offered_req_s:
        why.append(f"sent {ev.sent_req_s:.2f} of {ev.offered_req_s:.2f} req/s offered")
    if ev.client_cpu_util > CLIENT_CPU:
        why.append(f"client CPU {ev.client_cpu_util:.0%} of its cores")
    if not why:
        return None
    cap, queued = ev.client_cap, ev.client_queue_p99_ms or 0.0
    if cap and ev.client_cpu_util <= CLIENT_CPU and lag is not None and queued >= 0.5 * lag:
        # The wait is the in-flight cap the user set, not a slow sender: more workers
        # would change nothing (bench.md: the cap's wait shows as queue time and lag).
        return Finding(
            "client_cap",
            "client",
            f"The client's own cap of {cap} requests in flight held the load back",
            "DESIGN.md metric contract (offered vs achieved, send lag, client queue)",
            "; ".join(why) + f"; client queue P99 {queued:.0f} ms behind the cap; achieved "
            f"{ev.achieved_req_s:.2f} req/s",
            100.0,
            [
                Action(
                    "bench --max-concurrency", str(cap), "higher, or none", "let the rate through"
                )
            ],
        )
    workers_next = "2x the workers (or a second client host)"
    return Finding(
        "client_bottleneck",
        "client",
        "The load generator is the bottleneck, not the engine",
        "DESIGN.md metric contract (offered vs achieved, send lag); seed 003 §13 low GPU"
        " utilisation, first check: is the load really arriving",
        "; ".join(why) + f"; achieved {ev.achieved_req_s:.2f} req/s",
        100.0,
        [
            Action("bench --workers", "auto", workers_next, "more sender processes"),
            Action("client placement", "engine host", "another host", "stop sharing cores"),
        ],
    )


def host_starved(ev: Evidence) -> Finding | None:
    """The engine waits for CPUs: the host is saturated by other processes, or the
    hypervisor steals time (seed 003 §13 low GPU util "检查CPU"; §8 CPU/NUMA; seed 000
    §6.2 CPU bottleneck, "top看CPU占用"; seed 002 §6.2 CPU preprocessing)."""
    t = ev.tel
    wait, busy = t.get("engine_runq_wait_share_mean"), t.get("host_cpu_busy_mean")
    steal = t.get("host_cpu_steal_mean") or 0.0
    wait_cores = t.get("engine_runq_wait_cores_mean") or 0.0
    cores = int(t.get("host_cpu_cores_max", 0) or 0)
    other = t.get("other_cpu_cores_mean") or 0.0
    starved = (
        wait is not None
        and busy is not None
        and wait >= STARVED_WAIT
        and wait_cores >= STARVED_CORES
        and busy >= HOST_BUSY
        and cores > 0
        and other >= OTHERS_SHARE * busy * cores
    )
    # or fewer cores left free than the engine's threads want (`telemetry.contention`:
    # llama.cpp's threads beside one busy process wait at its step barrier, share 50%)
    held = contention(t)
    if not starved and held is None and steal < STEAL:
        return None
    eng = t.get("engine_cpu_cores_mean") or 0.0
    trig = (
        f"engine threads waited for a CPU {wait or 0:.0%} of their runnable time"
        f" ({wait_cores:.1f} cores' worth);"
        f" host CPU {busy or 0:.0%} busy; other processes used {other:.1f}"
        f" of {cores or '?'} cores, the engine {eng:.1f}; steal {steal:.1%}"
    )
    free = free_cores(cores, other) if cores else None
    threads = knobs(ev.engine).threads
    acts = [
        Action(
            "other processes on the host",
            f"{other:.1f} cores",
            "0 (stop them or move the engine)",
            "they take the engine's cores",
        ),
        Action(
            f"engine {threads}",
            ev.config.get("threads") or "all cores",
            f"{free} dedicated core{'s' if free > 1 else ''}" if free else "dedicated cores",
            "pin the engine to cores nothing else uses",
        ),
    ]
    if steal >= STEAL:
        acts.insert(0, Action("host", "shared VM", "dedicated host", f"steal {steal:.1%}"))
    return Finding(
        "host_overloaded",
        "host",
        "The host is overloaded: the engine is starved of CPU",
        "seed 003 §13 (low GPU utilisation: check CPU) and §8; seed 000 §6.2; seed 002 §6.2",
        trig,
        90.0,
        acts,
    )


def oom(ev: Evidence) -> Finding | None:
    """Out of memory: seed 003 §13's OOM order, verbatim order (seed 000 §6.1 agrees:
    gpu_memory_utilization first, 0.8 as the first retry)."""
    kind = (ev.failure or {}).get("kind")
    if kind != "oom" and not ev.oom_errors:
        return None
    c, k = ev.config, knobs(ev.engine)
    tp = int(c.get("tensor_parallel_size") or 1)
    need = int((ev.input_tokens.get("p99") or 0) + (ev.output_tokens.get("p99") or 0))
    mml = c.get("max_model_len")
    trig = (
        f"engine failure: {ev.failure.get('reason')}"
        if kind == "oom" and ev.failure
        else f"{ev.oom_errors} requests failed out of memory"
    )
    return Finding(
        "oom",
        "engine",
        "Out of memory",
        "seed 003 §13 OOM order; seed 000 §6.1; seed 002 §6.1",
        trig,
        95.0,
        [
            *filter(
                None,
                [
                    _smaller_pool(ev),
                    _smaller_activations(ev),
                    _smaller(
                        k.batch,
                        ev.batch_cap,
                        k.batch_default,
                        lambda b: max(1, b // 2),
                        "3rd: fewer sequences",
                    ),
                    # a length already under what the requests need is not shortened
                    None
                    if mml and need and need >= int(mml)
                    else Action(
                        "max_model_len",
                        mml or "model max",
                        need or "P99 input + output",
                        "4th: P99 input + output",
                    ),
                    _fifth_oom_step(ev),
                ],
            ),
            Action("enforce_eager", bool(c.get("enforce_eager")), True, "6th: CUDA graph buffers"),
            Action(
                "tensor_parallel_size",
                tp,
                2 * tp,
                "7th: also look for duplicate processes",
            ),
        ],
    )


def _smaller_pool(ev: Evidence) -> Action | None:
    """Seed 003 §13's 1st OOM step, a smaller KV pool, in the engine's own terms. A pool the
    config fixes (kv_cache_tokens: llama.cpp -c, vLLM's block override; kv_cache_space_gib)
    is halved: the memory fraction does not size it then, so lowering that changes
    nothing. Else the fraction: 0.05 lower, to no less than seed 000 §6.1's 0.8 ("vLLM默认
    0.9, 建议先设0.8"); a fraction already at or under 0.8 is not the one set too high, so
    the step is skipped (never raised: max(0.8, 0.7) asked a 0.7 server for more memory)."""
    c, why = ev.config, "1st: a smaller KV pool"
    if knobs(ev.engine).pool == "kv_cache_tokens" or c.get("kv_cache_tokens"):
        tokens = ev.kv_pool_tokens
        nxt = tokens // 2 if tokens else "half the default -c"
        return Action("kv_cache_tokens", tokens or "default", nxt, why)
    if c.get("kv_cache_space_gib"):
        space = float(c["kv_cache_space_gib"])
        return Action("kv_cache_space_gib", space, space / 2, why)
    gmu = float(c.get("gpu_memory_utilization") or 0.9)
    nxt = round(max(0.8, gmu - 0.05), 2)
    return Action("gpu_memory_utilization", gmu, nxt, why) if nxt < gmu else None


def _smaller_activations(ev: Evidence) -> Action | None:
    """Seed 003 §13's 2nd OOM step, smaller activation peaks: the tokens one forward pass
    may take, halved. vLLM's pass is its step budget (max_num_batched_tokens). llama.cpp
    splits its -b batch into passes of -ub tokens and sizes its compute buffer for one
    -ub pass (llama_context reserves the worst-case graph at n_ubatch,
    `sim.engine.llamacpp_batches`): halving -b from its 2048 default freed nothing,
    so there the step is -ub."""
    c, k, why = ev.config, knobs(ev.engine), "2nd: smaller activation peaks"
    if ev.engine != "llamacpp":
        return _smaller(k.budget, ev.batched_tokens, k.budget_default, lambda b: b // 2, why)
    _, ubatch = llamacpp_batches(ev.batched_tokens, c.get("ubatch_size"))
    if ubatch <= 1:
        return None
    return Action("ubatch_size", c.get("ubatch_size") or f"default ({ubatch})", ubatch // 2, why)


def _fifth_oom_step(ev: Evidence) -> Action | None:
    """Seed 003 §13's 5th OOM step, "KV cache FP8 or weight quantisation": the KV cache first,
    unless the pool already runs 8-bit (as the engine reported it), then the weights; neither
    when both are already quantized."""
    k = knobs(ev.engine)
    kv, factor = fp8_kv_gain(ev)
    if (factor or 1.0) > 1.0:
        return Action("kv_cache_dtype", kv, k.kv8, "5th: or weight quantisation")
    if ev.effective("quantization"):  # quantized weights and an 8-bit pool: nothing left here
        return None
    return Action("quantization", "none", k.weights8, f"5th: the KV cache is already {kv}")


# Error classes (docs/metrics.md) by what they say about the server, the most telling
# first: the cause, the knob to change and its next value, why (seed 003 §10 timeouts,
# §13 symptoms, §15 "429 instead of queueing").
ERROR_CAUSES: tuple[tuple[str, frozenset[str], Action], ...] = (
    (
        "timed out (the server stalled or queued past the limits)",
        frozenset({"ttft_timeout", "idle_timeout", "total_timeout"}),
        Action("offered load", "now", "lower (or max_num_seqs lower)", "requests wait past the "
               "timeouts: the server carries less than was sent; raise a timeout only if the "
               "SLO allows that wait"),
    ),
    (
        "failed on the server (5xx, an error event, a cut stream)",
        frozenset({"http_5xx", "server_error_event", "truncated_stream", "connection_reset"}),
        Action("engine log", "unread", "read its tail (engine logs)", "the server failed the "
               "requests itself: an OOM, a crash or a bad request shape is in its log"),
    ),
    (
        "were shed (429: a bounded queue or a rate limit refused them)",
        frozenset({"http_429"}),
        Action("offered load", "now", "under the front's bound", "a front refusing at once is "
               "right past capacity (seed 003 §15); below capacity the bound is too low"),
    ),
    (
        "could not connect",
        frozenset({"connect_error", "connect_timeout"}),
        Action("server", "unreachable at times", "check it is up and its connection limit",
               "the requests never reached the engine"),
    ),
    (
        "were malformed or refused as requests (4xx)",
        frozenset({"http_4xx", "malformed_response", "client_error"}),
        Action("request shape", "as sent", "--api, model name, prompt within max_model_len",
               "the server rejected what was sent, not the load"),
    ),
)  # fmt: skip


def failed_requests(ev: Evidence) -> Finding | None:
    """Requests that failed, past seed 003 §1's 0.1%, by cause: timeouts, server errors,
    shedding, connections, bad requests (out-of-memory failures are `oom`'s). The largest
    cause names the finding; every cause present gives its action, largest first."""
    errors = {k: n for k, n in ev.errors.items() if n}
    failed = sum(errors.values()) - ev.oom_errors
    sent = ev.completed + sum(errors.values())
    if failed <= 0 or not sent or failed / sent <= ERROR_SHARE:
        return None
    causes = sorted(
        ((sum(errors.get(k, 0) for k in kinds), why, act) for why, kinds, act in ERROR_CAUSES),
        key=lambda c: -c[0],
    )
    present = [c for c in causes if c[0]]
    top = present[0][1] if present else "failed"
    classes = ", ".join(f"{n} {k}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1]))
    return Finding(
        "failed_requests",
        "engine",
        f"{failed} of {sent} requests failed; most {top}",
        "seed 003 §1 (5xx under 0.1%), §10 timeouts, §13, §15 (429 instead of queueing)",
        f"{failed / sent:.1%} failed ({classes})",
        96.0,
        [act for _, _, act in present],
    )


def gpu_errors(ev: Evidence) -> Finding | None:
    """XID or uncorrected ECC errors during the run: hardware, not tuning (seed 003 §15:
    driver/hardware state is part of acceptance; §13 P99: the GPU itself)."""
    xid = ev.tel.get("gpu_xid_added") or 0
    ecc = ev.tel.get("gpu_ecc_uncorrected_added") or 0
    if not xid and not ecc:
        return None
    return Finding(
        "gpu_errors",
        "host",
        "GPU hardware errors during the run",
        "seed 003 §15 (driver and hardware pinned and healthy); §13 P99",
        f"{xid:.0f} XID events, {ecc:.0f} new uncorrected ECC errors",
        97.0,
        [Action("node", "in service", "drained", "XID/ECC: check dmesg and nvidia-smi -q")],
    )


def cancel_leak(ev: Evidence) -> Finding | None:
    """Cancelled requests still running after the client went away (seed 003 §13 P99 "断连
    请求未取消"; seed 002 §6.1 memory creeping up: "请求未释放 ... 检查调度器")."""
    c = ev.cancellation or {}
    if c.get("freed") is not False:
        return None
    left = c.get("running_after_run")
    left_text = "an unknown number of them" if left is None else f"{left:.0f}"
    e2e = ev.e2e.get("p99")
    return Finding(
        "cancel_leak",
        "engine",
        "Cancelled requests are not freed",
        "seed 003 §13 (P99 bad: disconnected requests not cancelled); seed 002 §6.1",
        f"{c.get('cancelled')} requests cancelled, {left_text} still running after the run",
        88.0,
        [
            Action(
                "engine abort-on-disconnect",
                "leaking",
                "fixed (engine upgrade)",
                "slots held by gone clients shrink the batch",
            ),
            Action(
                "gateway request timeout",
                "none",
                _ms(2 * e2e) if e2e else "2x P99 E2E",
                "bound what a leaked request can hold",
            ),
        ],
    )


def kv_pressure(ev: Evidence) -> Finding | None:
    """The KV pool is full: preemptions (recompute or swap) and a bad tail (seed 003 §13 P99
    "KV Cache接近满载、抢占与swap"; §4 KV cache; seed 000 §2.2; seed 002 §6.1)."""
    pre = ev.preemptions or 0.0
    kv = ev.kv_usage_max
    if pre <= 0 and not (kv is not None and kv >= KV_FULL and (ev.waiting_max or 0) > 0):
        return None
    c, k = ev.config, knobs(ev.engine)
    cur, factor = fp8_kv_gain(ev)
    seen = "not measured" if kv is None else f"peaked at {kv:.0%}"
    trig = f"KV usage {seen} with {pre:.0f} preemptions"
    if ev.ttft.get("p99") is not None:
        trig += f"; TTFT P99 {_ms(ev.ttft['p99'])} vs P50 {_ms(ev.ttft.get('p50'))}"
    acts = []
    # A pool fixed in tokens (vLLM --num-gpu-blocks-override, llama.cpp -c) grows only
    # with its number: an 8-bit KV cache or more memory alone leaves it as it is.
    fixed = "kv_cache_tokens" in c or k.pool == "kv_cache_tokens"
    if fixed:
        tokens = ev.kv_pool_tokens
        acts.append(
            Action(
                "kv_cache_tokens",
                tokens or "default",
                2 * tokens if tokens else "2x",
                "x2 pool, if memory holds it",
            )
        )
    if factor and factor > 1:
        why = f"x{factor:.1f} blocks, from the planner's KV bytes per element"
        if fixed:
            why += f", in the same memory once kv_cache_tokens is raised x{factor:.1f}"
        # no peak measured, no peak to scale: the factor alone is said
        predicted = None if fixed or kv is None else _kv_after(kv, factor, pre)
        acts.append(Action("kv_cache_dtype", cur, k.kv8, why, predicted))
    if fixed:
        pass
    elif "kv_cache_space_gib" in c:
        space = float(c["kv_cache_space_gib"])
        acts.append(Action("kv_cache_space_gib", space, space * 2, "x2 pool"))
    elif (gmu := float(c.get("gpu_memory_utilization") or 0.9)) < 0.95:
        # +0.03 up to 0.95 (seed 003 §4: 0.90-0.95 on a dedicated GPU); a fraction already
        # at or over 0.95 is left: the pool grows no further that way, and min(0.95, ...)
        # lowered a 0.97 as "bigger pool"
        acts.append(
            Action("gpu_memory_utilization", gmu, round(min(0.95, gmu + 0.03), 2), "bigger pool")
        )
    fit = fits_in_kv(ev)
    if fit is not None and ev.batch_cap and fit < ev.batch_cap:
        acts.append(Action(k.batch, ev.batch_cap, fit, "what the pool holds at P99 lengths"))
    return Finding(
        "kv_pressure",
        "engine",
        "KV cache full: preemptions",
        "seed 003 §13 (P99: KV cache near full, preemption) and §4; seed 002 §6.1",
        trig,
        80.0 + min(10.0, pre / 10),
        acts,
    )


def _kv_after(peak: float, factor: float, preemptions: float) -> str:
    """The peak KV usage `factor` times the blocks would give at this load. A pool seen full
    while it preempted held less than the demand: the peak it would have shown is unknown,
    so peak / factor is only a floor and says nothing of the preemptions."""
    after = peak / factor
    if peak >= KV_FULL and preemptions > 0:
        return (
            f"peak KV usage {peak:.0%} -> at least {after:.0%} at this load (the pool was"
            " full: demand beyond it was not seen, so preemptions may remain)"
        )
    done = ", preemptions -> 0" if after < 0.9 else ""
    return f"peak KV usage {peak:.0%} -> {after:.0%} at this load{done}"


def batch_queueing(ev: Evidence) -> Finding | None:
    """TTFT high with TPOT normal because requests queue at the batch cap (seed 003 §13
    "TTFT高但TPOT正常: 优先减少排队 ... 增加副本"; low GPU util "增加max_num_seqs")."""
    share = _queue_share(ev)
    if share is None or share < QUEUE_SHARE:
        return None
    # The queue-time histogram's delta is exact; the waiting gauge is sampled and, on a
    # loaded host where /metrics answers slowly, may hold only the idle scrapes before and
    # after the run. It vetoes only when there is no histogram to go by.
    if ev.queue_ms is None and (ev.waiting_max or 0) <= 0:
        return None
    cap = ev.batch_cap
    # The cap never seen reached: something else (the KV pool) held them - when the pool
    # was seen near full, or cannot be seen. The running gauge is sampled, and its peak
    # reads one under the cap when no scrape lands while the batch is full (vLLM-CPU: 12
    # users on 4 seqs read running 3, waiting 8, the pool nearly empty).
    kv_held = ev.kv_usage_max is None or ev.kv_usage_max >= KV_FULL
    if cap and ev.running_max and ev.running_max < cap and kv_held:  # 0: idle scrapes only
        return None
    knob = knobs(ev.engine).batch
    nxt = 2 * cap if cap else None
    # No more than the pool holds at P99 lengths: past it a paged pool preempts, and
    # llama.cpp (its -c split over the slots) refuses every request longer than a slot.
    # At or below the cap the knob drops out as a no-op and replicas come first.
    fit = fits_in_kv(ev)
    if nxt and fit is not None:
        nxt = max(cap or 1, min(nxt, fit))
    t50 = ev.ttft.get("p50")
    trig = (
        f"{_queue_seen(ev)}"
        + (f" ({knob} {cap})" if cap else "")
        + f"; queueing is {share:.0%} of TTFT (TTFT P50 {_ms(t50)}, TPOT P50"
        f" {_ms(ev.tpot.get('p50'))})"
    )
    pred = queue_free_ttft_ms(ev, share)
    users = ev.concurrency or ev.max_in_flight
    acts = [
        Action(
            knob,
            cap or "default",
            nxt or "2x",
            "more requests in the batch, as many as the KV pool holds",
            f"TTFT P50 {_ms(t50)} -> about {_ms(pred)} once the queue drains;"
            " TPOT rises with the batch: measure it"
            if pred is not None
            else None,
        ),
        Action(
            "replicas",
            1,
            max(2, -(-users // cap)) if cap and users else 2,
            "users / batch cap, when the batch cannot grow",
        ),
    ]
    return Finding(
        "batch_queueing",
        "engine",
        "TTFT high, TPOT normal: requests queue at the batch cap",
        "seed 003 §13 (TTFT high but TPOT normal; low GPU utilisation)",
        trig,
        70.0 + 10.0 * share,
        acts,
    )


def _queue_seen(ev: Evidence) -> str:
    """What the engine's gauges showed of the queue; figures nobody measured (a simulated
    run has no gauges, only the closed loop's users past the cap) are left out."""
    if not ev.waiting_max:
        return f"engine queue time {_ms(ev.queue_ms)} a request (the waiting gauge sampled none)"
    seen = f"waiting peaked at {ev.waiting_max:.0f}"
    if ev.waiting_mean is not None:
        seen += f" (mean {ev.waiting_mean:.1f})"
    if ev.running_max is not None:
        seen += f", running at {ev.running_max:.0f}"
    return seen


def tail_mix(ev: Evidence) -> Finding | None:
    """P99 bad with the mean fine, from long and short requests sharing the batch (seed 003
    §13 "平均延迟正常但P99很差: 长短请求混跑、输出上限"; seed 000 §6.3)."""
    e50, e99 = ev.e2e.get("p50"), ev.e2e.get("p99")
    t50, t99 = ev.ttft.get("p50"), ev.ttft.get("p99")
    e_ratio = e99 / e50 if e50 and e99 else 0.0
    t_ratio = t99 / t50 if t50 and t99 else 0.0
    if max(e_ratio, t_ratio) < TAIL_RATIO:
        return None
    i, o = ev.input_tokens, ev.output_tokens
    i_spread = i["p99"] / i["p50"] if i.get("p50") else 0.0
    o_spread = o["p99"] / o["p50"] if o.get("p50") else 0.0
    if max(i_spread, o_spread) < SPREAD_RATIO:
        return None
    which, ratio = ("E2E", e_ratio) if e_ratio >= t_ratio else ("TTFT", t_ratio)
    p50, p99 = (e50, e99) if which == "E2E" else (t50, t99)
    mean = ev.e2e.get("mean") if which == "E2E" else ev.ttft.get("mean")
    trig = (
        f"{which} P99 {_ms(p99)} is {ratio:.1f}x its P50 {_ms(p50)} (mean {_ms(mean)});"
        f" inputs P50 {i.get('p50', 0):.0f} -> P99 {i.get('p99', 0):.0f} tokens,"
        f" outputs P50 {o.get('p50', 0):.0f} -> P99 {o.get('p99', 0):.0f}"
    )
    # Split between the short and the long class: the geometric mean of the input P50
    # and P99 sits between them whatever the blend's weights.
    split = int(round((i.get("p50", 0.0) * i.get("p99", 0.0)) ** 0.5))
    k = knobs(ev.engine)
    chunk = 2 * int(i.get("p50") or 128)
    return Finding(
        "tail_long_short_mix",
        "engine",
        "P99 bad, mean fine: long and short requests share the batch",
        "seed 003 §13 (mean fine but P99 bad: long/short mix, output cap); seed 000 §6.3",
        trig,
        60.0 + min(10.0, ratio),
        [
            Action(
                "pools",
                "one pool",
                f"two: inputs > {split} tokens apart",
                "long prefills stop blocking short requests",
            ),
            Action(
                "max_tokens (server cap)",
                "none",
                int(o.get("p99") or 0) or "P99 output",
                "bound the longest decodes",
            ),
            *filter(
                None,
                [
                    _smaller(
                        f"{k.budget} (chunked prefill)",
                        ev.batched_tokens,
                        k.budget_default,
                        lambda b: max(256, min(b, chunk)),
                        "smaller prefill chunks interleave with decodes",
                    )
                ],
            ),
        ],
    )


def prefill_heavy(ev: Evidence) -> Finding | None:
    """TTFT dominates E2E without queueing: prefill-bound (seed 003 §13 "TTFT高但TPOT正常:
    增加Prefill预算、开启Flash Attention和Prefix Cache、减少输入长度"). TTFT must also be high:
    over the run's SLO, or seed 003 §1's example targets (`_over_target`); a short answer's
    healthy TTFT is most of its E2E too."""
    share = _ttft_share(ev)
    q = _queue_share(ev)
    i50, o50 = ev.input_tokens.get("p50"), ev.output_tokens.get("p50")
    if share is None or share < 0.4 or not i50 or not o50 or i50 < 4 * o50:
        return None
    high = _over_target(ev, "ttft_ms")
    if high is None or (q is not None and q >= QUEUE_SHARE):
        return None
    k = knobs(ev.engine)
    # EngineConfig's canonical knob (on by default in vLLM v1 and llama.cpp): when it is
    # already on, the action is to make prompts share their prefix so it hits.
    pc_on = ev.config.get("enable_prefix_caching", True)
    # A bigger budget shortens a prefill only when prompts reach the budget in force (else
    # each one is already a single step), and a long/short mix asks for smaller chunks
    # (tail_mix): a bigger budget would undo it.
    mbt = ev.batched_tokens
    in_force = mbt or (k.budget_default[0] if k.budget_default else None)
    longest = ev.input_tokens.get("p99") or i50
    reach = in_force is None or longest >= in_force
    why = "a bigger prefill budget per step"
    budget = (
        _bigger(k.budget, mbt, k.budget_default, lambda b: 2 * b, why)
        if reach and tail_mix(ev) is None
        else None
    )
    return Finding(
        "prefill_heavy",
        "engine",
        "TTFT high, TPOT normal: prefill-bound",
        "seed 003 §13 (TTFT high but TPOT normal); §1 (targets)",
        f"{high}; TTFT is {share:.0%} of E2E (TTFT P50 {_ms(ev.ttft.get('p50'))}, TPOT P50"
        f" {_ms(ev.tpot.get('p50'))}); inputs P50 {i50:.0f} tokens vs outputs {o50:.0f};"
        " queueing " + ("unknown" if q is None else f"{q:.0%} of TTFT"),
        55.0,
        [
            Action("prompt layout", "as sent", "shared part first", "so the prefix cache hits")
            if pc_on
            else Action("enable_prefix_caching", False, True, "shared prefixes skip prefill"),
            *filter(None, [budget]),
            Action("input length", f"P50 {i50:.0f}", f"{int(i50 // 2)}", "trim the prompt"),
        ],
    )


def decode_heavy(ev: Evidence) -> Finding | None:
    """Decode dominates E2E at a busy batch: TPOT-bound (seed 003 §13 "TTFT正常但TPOT高:
    减少活跃decode batch、降低batched tokens、减小Prefill块 ... 检查内存带宽和TP通信"). TPOT
    must also be high: over the run's SLO, or seed 003 §1's example target."""
    share = _ttft_share(ev)
    i50, o50 = ev.input_tokens.get("p50"), ev.output_tokens.get("p50")
    run = ev.running_busy_mean  # the batch while decoding (idle scrapes at the ends left out)
    if share is None or share > 0.2 or not i50 or not o50 or o50 < 4 * i50:
        return None
    if run is None or run < 1.5:
        return None
    high = _over_target(ev, "tpot_ms")
    if high is None:
        return None
    k = knobs(ev.engine)
    half_run = max(1, int(run // 2))
    return Finding(
        "decode_heavy",
        "engine",
        "TPOT high, TTFT normal: decode-bound",
        "seed 003 §13 (TTFT normal but TPOT high); §1 (targets)",
        f"{high}; decode is {1 - share:.0%} of E2E (TPOT P50 {_ms(ev.tpot.get('p50'))}, TTFT"
        f" P50 {_ms(ev.ttft.get('p50'))}) at a running batch of {run:.1f}; outputs P50"
        f" {o50:.0f} tokens vs inputs {i50:.0f}",
        50.0,
        [
            *filter(
                None,
                [
                    _smaller(
                        k.batch,
                        ev.batch_cap,
                        k.batch_default,
                        lambda _: half_run,
                        "a smaller decode batch: faster tokens, less throughput",
                    ),
                    _smaller(
                        k.budget,
                        ev.batched_tokens,
                        k.budget_default,
                        lambda b: max(256, b // 2),
                        "fewer prefill tokens inserted per decode step",
                    ),
                ],
            ),
            Action("memory bandwidth / TP", "-", "check", "decode reads all weights per step"),
        ],
    )


def gpu_underused(ev: Evidence) -> Finding | None:
    """GPU utilisation low, or memory plentiful with low throughput (seed 003 §13 GPU利用率低
    and 显存很多但吞吐低; seed 000 §6.2; seed 002 §6.2: batch size first, then arrivals,
    then CPU)."""
    util = ev.tel.get("gpu_util_mean")
    if util is None or util >= GPU_LOW_UTIL:
        return None
    mem = ev.tel.get("gpu_memory_used_max")
    cap, batch = ev.batch_cap, knobs(ev.engine).batch
    run = ev.running_mean
    trig = f"GPU utilisation averaged {util:.0%}"
    if run is not None:
        trig += f" with {run:.1f} requests running" + (f" of {batch} {cap}" if cap else "")
    if mem is not None:
        trig += f"; GPU memory peak {mem / 2**30:.1f} GiB"
    # Seed 003 §13's order: is there enough load, then a bigger cap. With the cap unknown
    # the batch cannot be said to be full, so load comes first; the cap is raised from the
    # engine's default, never to a number under it (256 was half of vLLM's 1024 on an H100).
    under_cap = cap is None or (run is not None and run < 0.5 * cap)
    load = Action(
        "offered load",
        f"{run:.1f} running" if run is not None else "-",
        "more concurrency",
        "first in the seed's order: is there enough load",
    )
    bigger = _bigger(
        batch, cap, knobs(ev.engine).batch_default, lambda b: 2 * b, "batch limit too small"
    )
    acts = [
        *([load] if under_cap else []),
        *([bigger] if bigger is not None and (cap is None or not under_cap) else []),
        Action("CPU / tokenizer / streaming", "-", "check", "host-side stalls"),
    ]
    tp = int(ev.config.get("tensor_parallel_size") or 1)
    if tp > 1:
        acts.append(Action("tensor_parallel_size", tp, tp // 2, "TP too large for the load"))
    return Finding(
        "gpu_underused",
        "engine",
        "Low GPU utilisation",
        "seed 003 §13 (low GPU utilisation; plenty of memory but low throughput); seed 000 §6.2",
        trig,
        45.0,
        acts,
    )


def gpu_clocks(ev: Evidence) -> Finding | None:
    """The GPU downclocked (heat or power cap) while the run went (seed 003 §13 P99 "GPU降频"):
    a power/thermal throttle reason, or the SM clock under 80% of its maximum in a sample
    where the GPU was busy (`evidence.busy_clock`: an idle GPU lowers its clocks by design)."""
    lo, hi = ev.tel.get("gpu_sm_clock_mhz_busy_min"), ev.tel.get("gpu_sm_clock_max_mhz_max")
    throttled = (ev.tel.get("gpu_throttled_max") or 0) >= 1
    dropped = lo is not None and hi and lo < CLOCK_DROP * hi
    if not throttled and not dropped:
        return None
    trig = "clock throttle reasons set (power/thermal)" if throttled else ""
    if lo is not None and hi:
        clock = f"SM clock down to {lo:.0f} of {hi:.0f} MHz while busy"
        trig = (trig + "; " if trig else "") + clock
    temp = ev.tel.get("gpu_temp_c_max")
    if temp is not None:
        trig += f"; peak {temp:.0f} C"
    return Finding(
        "gpu_downclocked",
        "host",
        "The GPU downclocked during the run",
        "seed 003 §13 (P99 bad: GPU downclocking)",
        trig,
        75.0,
        [
            Action("cooling / power cap", "-", "check", "nvidia-smi -q -d PERFORMANCE"),
            Action("application clocks", "default", "locked", "nvidia-smi -lgc for stable runs"),
        ],
    )


RULES: tuple[Callable[[Evidence], Finding | None], ...] = (
    client_limited,
    host_starved,
    gpu_errors,
    oom,
    failed_requests,
    cancel_leak,
    kv_pressure,
    gpu_clocks,
    batch_queueing,
    tail_mix,
    prefill_heavy,
    decode_heavy,
    gpu_underused,
)


def doable(ev: Evidence, a: Action) -> bool:
    """An action worth printing: it changes something (not `0.95 -> 0.95`), on a knob the
    engine has at both values (the adapter's own unsupported-knob report: no fp8 KV cache
    or memory fraction on llama.cpp)."""
    return a.now != a.next and engine_has(ev.engine, a.knob, (a.now, a.next))


def diagnose(ev: Evidence) -> list[Finding]:
    """Every finding that fires, client and host problems first, then by score; each with
    only the actions that are `doable`."""
    found = [f for rule in RULES if (f := rule(ev)) is not None]
    for f in found:
        f.actions = [a for a in f.actions if doable(ev, a)]
    return sorted(found, key=lambda f: (KINDS.index(f.kind), -f.score))
