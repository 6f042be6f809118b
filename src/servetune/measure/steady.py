"""Steady state: an open-loop load counts as carried only when the engine keeps up with it.

A point that runs for a few seconds can "hold" any rate: the run ends before the queue
builds. Seed 003 §14 asks every combination to run "long enough to cover the steady state
after warm-up" (每个组合至少运行足够长时间,覆盖预热后的稳态区间), and DESIGN.md states
a capacity as "measured at steady state (achieved ≈ offered, queue not growing)". So an
open-loop point is sized and judged by one rule, for the simulator and the real engine:

- size: the arrivals span a warm-up plus a measurement window of fixed seconds, so the
  request count grows with the rate (never below the workload's own count, at most a cap);
  the warm-up is excluded from the metrics (`WorkloadSpec.warmup_s`);
- judge: over the window, achieved (completions per second) over offered (arrivals per
  second) must stay near 1 - a queue grows at (offered - achieved) - and the time to
  first token, which includes the wait in the queue, must not rise across the window.
  Either miss fails the point whatever its percentiles (`judge`, `apply_steady_state`).
- hold in both halves: the SLO's TTFT and TPOT percentile targets must also hold over
  each half of the window (its earlier- and later-sent half of the requests) on their
  own. A queue that starts to build late in the window pushes its tail there, while the
  whole window's percentile still averages it away: on llama.cpp (2 slots, this CPU) a
  point that passed over a 20 s window missed P95 TTFT in a run 10x as long. Judging each
  half charges that trend (or a start-up transient) to the point.

A point that passes is still weak evidence when its TTFT rises across the window within
the limit (`weak_evidence`), or when its rate is so close to the engine's saturation that
the queue takes longer than half the window to settle (`settles_in_window`, Morse's
relaxation time, once a point has shown the saturated rate): the tuner then credits the
load below it. And it shows no
more than the rate its arrivals offered (`credited_rate`).

Closed-loop points are not judged: their users bound the queue (Little's law: at most
`concurrency` requests are ever in the system), so it cannot grow without limit.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from servetune.metrics.compute import (
    RecordColumns,
    completion_shift_ns,
    has_tpot,
    record_columns,
    schedule_window,
)
from servetune.metrics.pct import QUANTILES, fmt_ms, upper_bound_rank
from servetune.metrics.stats import summarize
from servetune.results.schema import RunResult, SLOCheck
from servetune.slo import SLO
from servetune.status import RequestStatus
from servetune.workload.spec import WorkloadSpec

CHECK = "steady_state"  # the metric name of the checks added to a run's SLO checks
HALVES = ("early_", "late_")  # the prefixes of the per-half checks' stats
MIN_THIRD = 5  # requests per third of the window below which no slope is estimated


@dataclass(frozen=True)
class SteadyRule:
    """How long an open-loop point runs, and how far from steady it may be."""

    warmup_s: float = 15.0  # arrivals at the start excluded: in-flight requests build up
    window_s: float = 60.0  # arrivals measured after the warm-up, at least
    max_requests: int = 20_000  # cap: at higher rates the window is shorter
    min_achieved: float = 0.95  # achieved / offered over the window, at least
    max_queue_slope: float = 0.02  # TTFT rise per second of run (s/s), at most
    # Arrivals the window holds at least, whatever the rate (the window stretches at low
    # rates): with 15 arrivals a Poisson draw is off by ~26% and one completion cut off by
    # the window's edge is 7%; with 300, by ~6%.
    min_arrivals: int = 0
    # A passing point is credited only when each TTFT/TPOT percentile target also holds
    # at this confidence (`upper_bounds`); None: the sample's percentile is taken as is.
    percentile_confidence: float | None = None

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.warmup_s < 0:
            raise ValueError("window_s must be > 0 and warmup_s >= 0")
        if not 0 < self.min_achieved <= 1 or self.max_queue_slope < 0 or self.max_requests < 1:
            raise ValueError("min_achieved in (0, 1], max_queue_slope >= 0, max_requests >= 1")
        if self.min_arrivals < 0:
            raise ValueError("min_arrivals >= 0")
        if self.percentile_confidence is not None and not 0 < self.percentile_confidence < 1:
            raise ValueError("percentile_confidence in (0, 1)")

    def count(self, rate: float, base: int, warmup_s: float | None = None) -> int:
        """Requests whose Poisson arrivals at `rate` span warm-up (`warmup_s`, default the
        rule's) + window (the expected count, rate x seconds), the window holding at least
        `min_arrivals`, at least `base`; `max_requests` caps them all."""
        warm = self.warmup_s if warmup_s is None else warmup_s
        want = max(
            math.ceil(rate * (warm + self.window_s)),
            math.ceil(rate * warm) + self.min_arrivals,
        )
        return max(1, min(self.max_requests, max(base, want)))

    def sized(self, spec: WorkloadSpec, rate: float) -> WorkloadSpec:
        """`spec` at `rate`, long enough for the window, its warm-up excluded. A sessions
        workload warms up for its sessions' mean think time (or tool latency) at least:
        until then the window would open on first turns only, before the follow-ups, with
        their longer prompts, have joined, and read a load lighter than the steady one."""
        at = spec.with_load(rate=rate)
        base = at.count or math.ceil(rate * (at.duration_s or 0.0))
        warm = max(at.warmup_s, self.warmup_s, session_idle_s(at))
        data = at.model_dump()
        data["count"] = self.count(rate, base, warm)
        data["duration_s"] = None  # the count ends the arrivals (materialize: count first)
        data["warmup_s"] = warm
        return WorkloadSpec.model_validate(data)


def session_idle_s(spec: WorkloadSpec) -> float:
    """A session's mean planned idle time (the think times or tool latencies between its
    turns): a lower bound on how long it lives, its model calls left out. 0 for a
    workload of single requests."""
    if spec.sessions is None:
        return 0.0
    return _mean_idle_s(spec.model_dump_json(include={"sessions", "seed"}))


@functools.lru_cache(maxsize=64)
def _mean_idle_s(sessions_json: str) -> float:
    """`session_idle_s` of a spec's sessions and seed, over a fixed draw of 256 sessions
    (a run of 24 would be noisy); cached: a capacity search sizes many points of one
    workload, and planning a dataset's sessions takes ~0.3 s."""
    from servetune.workload.session_plan import plan_sessions

    data = {**json.loads(sessions_json), "count": 256, "arrival": {"kind": "poisson", "rate": 1}}
    plan = plan_sessions(WorkloadSpec.model_validate(data))
    idle = [sum(t.delay_s for t in s.turns) for s in plan.sessions]
    return sum(idle) / len(idle) if idle else 0.0


# The simulator is cheap (3,000 requests in ~0.2 s): a minute of window, tight margins.
# The real engine: a minute too - near its capacity a few slots' queue is stationary on
# average but makes long excursions, which 20 s windows missed (llama.cpp, 2 slots on this
# CPU: 3.4 req/s held for 25 s, then failed P95 TTFT in a 4-minute run; 2.8 held). So 70 s
# of arrivals per point, then the drain (at most 2 x the request timeout): a capacity
# search of ~5 points takes ~6-8 minutes a config. Its margins are wider: a real host is
# noisier than the simulator.
# At low rates the simulator's window holds at least 300 arrivals (cheap: ~0.1 s), so a
# point's draw and its completions at the window's edge no longer decide its verdict; the
# real engine's at least 30 (at 0.125 req/s: 4 minutes of arrivals).
SIM_STEADY = SteadyRule(min_arrivals=300)
REAL_STEADY = SteadyRule(
    warmup_s=10.0,
    window_s=60.0,
    max_requests=2_000,
    min_achieved=0.9,
    max_queue_slope=0.05,
    min_arrivals=30,
    percentile_confidence=0.8,
)


def default_rule(backend_kind: str) -> SteadyRule:
    return SIM_STEADY if backend_kind == "sim" else REAL_STEADY


@dataclass(frozen=True)
class Steady:
    """The evidence of one open-loop point: achieved vs offered and the queue's trend."""

    offered_req_s: float  # arrivals in the window per second
    achieved_req_s: float  # completions in the window shifted by `latency_s`, per second
    queue_slope: float | None  # s of TTFT per s of run; None: too few requests to say
    latency_s: float  # median send -> last token of the window's requests
    arrivals: int  # requests that arrived in the window
    window_s: float
    warmup_s: float
    rule: SteadyRule
    # (half, metric, stat, value ms over that half of the window, the SLO's target ms) per
    # TTFT and TPOT percentile target and half ("early", "late"; metric "ttft", "tpot")
    halves: tuple[tuple[str, str, str, float, float], ...] = ()
    # (metric, stat, the order statistic's rank, n, its value ms, the SLO's target ms) per
    # TTFT and TPOT percentile target, over the whole window (`upper_bounds`)
    bounds: tuple[tuple[str, str, int, int, float, float], ...] = ()
    unit: str = "req/s"  # what offered and achieved count: requests, or sessions started

    @property
    def achieved_ratio(self) -> float:
        return self.achieved_req_s / self.offered_req_s if self.offered_req_s > 0 else 1.0

    @property
    def allowance(self) -> float:
        """How far achieved may fall below offered: the rule's margin, widened to two
        standard errors of the count when the window holds few requests - completions and
        arrivals differ by the change in requests in flight, ~sqrt(L) with L = offered x
        latency (Little's law) - plus the one completion the shifted window's edge can
        cut off (at 0.125 req/s, 9 arrivals: 8 of 9 completions is 89%, and a steady
        point failed on it), but at most doubled: a queue that grows inflates the
        latency, and with it this estimate, exactly when the verdict matters."""
        margin = 1.0 - self.rule.min_achieved
        if self.arrivals <= 0:
            return 2.0 * margin
        noise = (2.0 * math.sqrt(self.offered_req_s * self.latency_s) + 1.0) / self.arrivals
        return min(2.0 * margin, max(margin, noise))

    @property
    def keeps_up(self) -> bool:
        return self.achieved_ratio >= 1.0 - self.allowance

    @property
    def queue_flat(self) -> bool:
        return self.queue_slope is None or self.queue_slope <= self.rule.max_queue_slope

    @property
    def late_ttft(self) -> tuple[tuple[str, float, float], ...]:
        """(stat, value, target) of the TTFT targets over the window's later half."""
        return tuple((s, v, t) for h, m, s, v, t in self.halves if (h, m) == ("late", "ttft"))

    @property
    def holds_halves(self) -> bool:
        return all(v <= t for *_, v, t in self.halves)

    @property
    def steady(self) -> bool:
        return self.keeps_up and self.queue_flat and self.holds_halves

    def checks(self) -> list[SLOCheck]:
        """As SLO checks (value <= target passes): the shortfall of achieved below
        offered, and the queue's slope."""
        short = SLOCheck(
            metric=CHECK,
            stat="shortfall",
            target=round(self.allowance, 6),
            value=1.0 - self.achieved_ratio,
            ok=self.keeps_up,
        )
        slope = SLOCheck(
            metric=CHECK,
            stat="queue_slope",
            target=self.rule.max_queue_slope,
            value=self.queue_slope,
            ok=self.queue_flat,
            note=None if self.queue_slope is not None else "too few requests to fit a trend",
        )
        halves = [
            SLOCheck(metric=CHECK, stat=f"{h}_{m}_{stat}", target=t, value=v, ok=v <= t)
            for h, m, stat, v, t in self.halves
        ]
        return [short, slope, *halves]

    def signals(self) -> dict[str, Any]:
        """What the tuner's point, its output and the store state as evidence."""
        return {
            "steady": self.steady,
            "offered_req_s": self.offered_req_s,
            "achieved_req_s": self.achieved_req_s,
            "rate_unit": self.unit,
            "achieved_ratio": self.achieved_ratio,
            "achieved_min_ratio": 1.0 - self.allowance,
            "queue_slope_s_per_s": self.queue_slope,
            "max_queue_slope_s_per_s": self.rule.max_queue_slope,
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "late_ttft_ms": {stat: v for stat, v, _ in self.late_ttft},
            "halves_ms": {f"{h}_{m}_{stat}": v for h, m, stat, v, _ in self.halves},
            "upper_bounds_ms": {
                f"{m}_{stat}": {
                    "value": v,
                    "target": t,
                    "rank": k,
                    "n": n,
                    "confidence": self.rule.percentile_confidence,
                }
                for m, stat, k, n, v, t in self.bounds
            },  # fmt: skip
        }


def judge(res: RunResult, spec: WorkloadSpec, rule: SteadyRule) -> Steady | None:
    """The steady-state evidence of a run of `spec` over its measurement window (None
    for a closed loop, or a run without records).

    Offered and achieved are the run's own metrics (metrics.compute): arrivals scheduled
    per second over the schedule's window (sends, when the records carry no schedule), and
    completions per second in the window moved by the median latency
    (`completion_shift_ns`), which holds the completions of the window's own arrivals
    however short the warm-up was next to the latency, while a queue that grows still
    completes only at the service rate. Queue slope: `queue_slope`."""
    if not spec.arrival.open_loop or not len(res.records):
        return None
    m = res.metrics
    c = record_columns(res.records)
    start, end = m.window_start_ns, m.window_end_ns
    sent = (c.send >= start) & (c.send <= end)
    done = (c.n_chunks > 0) & c.status_is(RequestStatus.OK)
    if c.scheduled_has.any():
        arrivals = int((c.scheduled_has & (c.scheduled >= start) & (c.scheduled <= end)).sum())
    else:
        arrivals = int(sent.sum())
    kept = keeping_up(c, spec, done)
    if kept is None:  # no schedule, or a window within one latency: the run's own rates
        kept = (m.offered_req_s or m.sent_req_s, m.req_s, m.completion_shift_s)
    return Steady(
        offered_req_s=kept[0],
        achieved_req_s=kept[1],
        queue_slope=queue_slope(c, sent & done),
        latency_s=kept[2],
        unit="sessions/s" if spec.sessions is not None else "req/s",
        arrivals=arrivals,
        window_s=m.window_s,
        warmup_s=spec.warmup_s,
        rule=rule,
        halves=halves(c, sent & done, res.slo),
        bounds=upper_bounds(c, sent & done, res.slo, rule.percentile_confidence),
    )


def keeping_up(
    c: RecordColumns, spec: WorkloadSpec, done: np.ndarray
) -> tuple[float, float, float] | None:
    """(offered, achieved per second, the shift s) of the scheduled requests: arrivals
    over [lo, hi - shift) and completions over the same span moved by `shift`, their
    median latency; lo, hi the schedule's window (`metrics.compute.schedule_window`).
    Ending the arrivals' span one shift before the last arrival keeps the count unbiased:
    the run's rates count completions up to one shift past the last arrival, where no
    later arrival makes up for those that finish late, and read low by E[(shift -
    latency)+] x rate (a chat mix whose latencies spread 1-13 s read 97% at a steady
    point). A sessions run schedules sessions (first turns; a follow-up goes when its
    answer and think time are over), so both count first turns: counted over all turns,
    completions read 127% of the offered sessions/s and a growing queue could not fail.
    None: no schedule, or a window within one latency."""
    win = schedule_window(c, spec.warmup_s, spec.cooldown_s)
    if win is None:
        return None
    lo, hi = win
    sched = c.scheduled_has
    shift = completion_shift_ns(c, sched & (c.scheduled >= lo) & (c.scheduled < hi))
    span_s = (hi - shift - lo) / 1e9
    if span_s <= 0:
        return None
    offered = int((sched & (c.scheduled >= lo) & (c.scheduled < hi - shift)).sum()) / span_s
    achieved = int((sched & done & (c.last >= lo + shift) & (c.last < hi)).sum()) / span_s
    return offered, achieved, shift / 1e9


def _latencies(c: RecordColumns, sel: np.ndarray) -> tuple[np.ndarray, ...]:
    """(send ns, TTFT ms, TPOT ms, has a TPOT) of the `sel` requests, TPOT as the metric
    contract defines it ((E2E - TTFT) / (output tokens - 1), `metrics.compute.has_tpot`)."""
    send = c.send[sel]
    ttft_ms = (c.first[sel] - send) / 1e6
    n_out = c.output_tokens[sel]
    timed = has_tpot(n_out, c.n_chunks[sel], c.first[sel], c.last[sel])
    tpot_ms = (c.last[sel] - c.first[sel]) / 1e6 / np.maximum(n_out - 1, 1)
    return send, ttft_ms, tpot_ms, timed


def _targets(slo: SLO, ttft_ms: np.ndarray, tpot_ms: np.ndarray) -> list[tuple]:
    """(metric, values, {stat: target ms}) of the SLO's TTFT and TPOT percentile targets."""
    pairs = (("ttft", ttft_ms, slo.ttft_ms), ("tpot", tpot_ms, slo.tpot_ms))
    return [(m, v, t) for m, v, t in pairs if t is not None and len(v)]


def halves(
    c: RecordColumns, sel: np.ndarray, slo: SLO | None
) -> tuple[tuple[str, str, str, float, float], ...]:
    """The SLO's TTFT and TPOT percentile targets over each half of the `sel` requests by
    send time: (half, metric, stat, value ms, target ms) each, with the run's own
    percentile method (`metrics.stats.summarize`). Empty without such targets or with too
    few requests to split (fewer than two thirds' worth, as `queue_slope`)."""
    if slo is None or int(sel.sum()) < 2 * MIN_THIRD:
        return ()
    send, ttft_ms, tpot_ms, timed = _latencies(c, sel)
    order = np.argsort(send, kind="stable")
    cut = len(order) // 2
    out = []
    for half, idx in (("early", order[:cut]), ("late", order[cut:])):
        for metric, values, targets in _targets(slo, ttft_ms[idx], tpot_ms[idx][timed[idx]]):
            d = summarize(values)
            for stat, target in targets.items():
                v = getattr(d, stat, None)
                if v is not None:
                    out.append((half, metric, stat, float(v), float(target)))
    return tuple(out)


def upper_bounds(
    c: RecordColumns, sel: np.ndarray, slo: SLO | None, confidence: float | None
) -> tuple[tuple[str, str, int, int, float, float], ...]:
    """Each TTFT and TPOT percentile target of the SLO against the percentile's upper
    confidence bound over the `sel` requests: the order statistic that lies above the
    true percentile with `confidence` (`metrics.pct.upper_bound_rank`). A sample P95 of
    75 requests rests on its 4 largest values; a run 10x as long tells it apart from
    the true P95 (llama.cpp here: 409 ms over 75 requests passed a 525 ms target, the
    same load over 840 requests read 642 ms). Empty without such targets or confidence."""
    if slo is None or confidence is None or not int(sel.sum()):
        return ()
    _, ttft_ms, tpot_ms, timed = _latencies(c, sel)
    out = []
    for metric, values, targets in _targets(slo, ttft_ms, tpot_ms[timed]):
        ordered = np.sort(values)
        for stat, target in targets.items():
            q = QUANTILES.get(stat)
            if q is None:
                continue
            k = upper_bound_rank(len(ordered), q, confidence)
            out.append((metric, stat, k, len(ordered), float(ordered[k - 1]), float(target)))
    return tuple(out)


def weak_evidence(signals: dict[str, Any]) -> list[str]:
    """Why a steady point is weak evidence that its rate is carried (empty: it is not, or
    the point was not judged): its TTFT trend rises at over half the limit, a queue
    building slower than the window can show; or a percentile target is met by the
    sample but not by its upper confidence bound (`upper_bounds`, the real engine's
    rule). Not crediting it costs one lattice step (a factor 2^(1/4), 16%, on the rate
    lattice)."""
    if "steady" not in signals:
        return []
    why = []
    slope, limit = signals.get("queue_slope_s_per_s"), signals.get("max_queue_slope_s_per_s")
    if slope is not None and limit is not None and slope > limit / 2:
        why.append(f"its TTFT trend rises ({slope:+.3f} s/s, over half the {limit:g} limit)")
    for name, b in (signals.get("upper_bounds_ms") or {}).items():
        if b["value"] > b["target"]:
            metric, stat = name.split("_", 1)
            why.append(
                f"{stat.upper()} {metric.upper()}'s {b['confidence']:.0%} upper bound (rank "
                f"{b['rank']} of {b['n']} requests) {b['value']:,.0f} ms > {b['target']:,.0f}"
            )
    return why
    return []


def rate_unit(signals: dict[str, Any]) -> str:
    """The unit of a judged point's rates: req/s, or sessions/s for a sessions workload
    (points stored before the unit was kept read req/s)."""
    return str(signals.get("rate_unit") or "req/s")


def saturated_rate(points_signals: list[dict[str, Any]]) -> float | None:
    """The service rate the engine showed at saturation: the most any judged point that
    did not keep up completed per second (an overload's completions run at the service
    rate; its arrivals do not matter). None until a point has been overloaded."""
    rates = [
        float(s["achieved_req_s"])
        for s in points_signals
        if "steady" in s and s.get("achieved_ratio", 1.0) < s.get("achieved_min_ratio", 0.0)
    ]
    return max(rates) if rates else None


def relaxation_s(rate: float, service_rate: float) -> float:
    """How long a queue at `rate` takes to forget where it started, for a server that
    completes `service_rate` per second at saturation: Morse's relaxation time of the
    M/M/1 queue, 1 / (mu (1 - sqrt(rho))^2) (P. M. Morse, "Stochastic properties of
    waiting lines", Operations Research 3(3), 1955). It grows without bound as rho -> 1:
    at 94% of saturation a 3 req/s server takes ~360 s, at 80% ~30 s."""
    if service_rate <= 0 or rate >= service_rate:
        return math.inf
    return 1.0 / (service_rate * (1.0 - math.sqrt(rate / service_rate)) ** 2)


def settles_in_window(
    signals: dict[str, Any], load: float, service_rate: float | None
) -> list[str]:
    """Why a passing open-loop point at `load` does not prove its rate (empty: it does, or
    nothing is known of the saturation): its window is shorter than twice the queue's
    relaxation time at that load, so the window saw one excursion of a queue that makes
    longer ones. On llama.cpp (2 slots, this CPU) 2.83 req/s against a saturated 2.98
    passed a 63 s window (P95 TTFT 1.3 s) and missed by 4x (7.7 s) in a run 10x as long."""
    if "steady" not in signals or not service_rate:
        return []
    window = float(signals.get("window_s") or 0.0)
    tau = relaxation_s(load, service_rate)
    if window >= 2.0 * tau:
        return []
    settle = "never" if math.isinf(tau) else f"~{tau:,.0f} s"
    return [
        f"at {load / service_rate:.0%} of the saturated {service_rate:.3g} "
        f"{rate_unit(signals)} a queue "
        f"settles in {settle} (Morse's relaxation time), over half the {window:.0f} s window"
    ]


def credited_rate(signals: dict[str, Any], load: float) -> float:
    """The rate a passing open-loop point shows carried: its nominal `load`, or what its
    arrivals offered over the window when that was less. A Poisson draw of n arrivals is
    off by ~1/sqrt(n), and with one seed its shape is the same at every rate: a draw that
    offered 93% of 1 req/s offers ~94% of 4 req/s too (the GPU what-if's chat traffic), so
    the point tested the lighter load; on the simulated llama.cpp (2 slots) a 45-arrival
    point at 0.59 req/s offered 0.49, passed, and 450 arrivals at 0.62 missed P95 TTFT."""
    offered = signals.get("offered_req_s") if "steady" in signals else None
    return min(load, offered) if offered else load


def queue_slope(c: RecordColumns, sel: np.ndarray) -> float | None:
    """How fast the wait grows: TTFT (send -> first token, which includes the time queued)
    of the last third of the `sel` requests (by send time) minus that of the first third,
    medians (robust to a burst), over the time between them. In a queue that grows
    because arrivals outpace service, the wait grows at (offered - achieved) / achieved
    seconds per second; in steady state the slope is ~0."""
    if int(sel.sum()) < 3 * MIN_THIRD:
        return None
    send = c.send[sel]
    ttft = c.first[sel] - send
    thirds = np.array_split(np.argsort(send, kind="stable"), 3)
    first, last = thirds[0], thirds[-1]
    dt = float(np.median(send[last]) - np.median(send[first]))
    if dt <= 0:
        return None
    return float(np.median(ttft[last]) - np.median(ttft[first])) / dt


def apply_steady_state(res: RunResult, spec: WorkloadSpec, rule: SteadyRule) -> Steady | None:
    """Judge a run of `spec` (open loop) and add the verdict to its SLO checks: a point
    that does not keep up fails, whatever its percentiles (as `apply_memory_slo` adds the
    memory check)."""
    st = judge(res, spec, rule)
    if st is None:
        return None
    m = res.metrics
    m.slo_checks = [c for c in m.slo_checks if c.metric != CHECK] + st.checks()
    if m.slo_pass is not None:
        m.slo_pass = all(c.ok for c in m.slo_checks)
    return st


def check_text(c: dict[str, Any]) -> str:
    """A steady-state check in words: `steady state: achieved 74% of offered < 95%`,
    `steady state: TTFT +0.210 s per s of run > 0.02`."""
    v, t, ok = c.get("value"), c.get("target") or 0.0, c.get("ok")
    stat = str(c.get("stat"))
    if stat.startswith(HALVES):
        half, metric, p = stat.split("_", 2)
        which = "later" if half == "late" else "earlier"
        return (
            f"steady state: {p.upper()} {metric.upper()} of the window's {which} half "
            f"{fmt_ms(v or 0.0)} ms {'<=' if ok else '>'} {fmt_ms(t)}"
        )
    if c.get("stat") == "shortfall":
        got = 1.0 - (v or 0.0)
        return f"steady state: achieved {got:.0%} of offered {'>=' if ok else '<'} {1 - t:.0%}"
    if v is None:
        return "steady state: queue trend not measured (too few requests)"
    slope = round(v, 3) + 0.0  # a slope of -0.00001 reads +0.000, not -0.000
    return f"steady state: TTFT {slope:+.3f} s per s of run {'<=' if ok else '>'} {t:g}"


def evidence_text(signals: dict[str, Any]) -> str | None:
    """A point's steady-state evidence in words (None when it was not judged):
    `steady state: achieved 99% of the offered 45.1 req/s, TTFT slope +0.000 s/s over a
    60 s window after 15 s of warm-up`."""
    if "steady" not in signals:
        return None
    slope = signals.get("queue_slope_s_per_s")
    trend = "TTFT trend not measured" if slope is None else f"TTFT slope {slope:+.3f} s/s"
    head = "steady state" if signals["steady"] else "NOT steady"
    return (
        f"{head}: achieved {signals['achieved_ratio']:.0%} of the offered "
        f"{signals['offered_req_s']:.3g} {rate_unit(signals)}, {trend} over a "
        f"{signals['window_s']:.0f} s window after {signals['warmup_s']:.0f} s of warm-up"
    )
