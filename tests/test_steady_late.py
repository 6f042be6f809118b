"""The steady-state rule's third check: the SLO's TTFT and TPOT targets must hold over each
half of the window on its own. A tail that builds late in the window (or a start-up
transient early in it) fails the point even when the whole window's percentile and the
queue's median trend pass; the same tail spread over the whole window does not. And a
passing point is weak evidence for its nominal rate when its draw offered less or its
TTFT trend rises (`weak_evidence`)."""

from __future__ import annotations

import pytest

from servetune.measure.steady import REAL_STEADY, SIM_STEADY, apply_steady_state, check_text
from servetune.metrics.compute import compute_metrics
from servetune.results.schema import RequestRecord, RunResult
from servetune.slo import parse_slo
from servetune.workload.spec import parse_workload

S = 1_000_000_000
RATE, SECONDS, WARMUP = 10.0, 70, 10
SLO = parse_slo({"ttft_ms": {"p95": 2000}})


def _run(slow_every: int, slow_from_s: float) -> tuple[RunResult, object]:
    """Constant arrivals at RATE, each served at once in 100 ms (TTFT 50 ms), except every
    `slow_every`-th request sent after `slow_from_s`, whose first token takes 3 s."""
    spec = parse_workload({"count": int(RATE * SECONDS), "warmup_s": WARMUP,
                           "input_tokens": {"dist": "fixed", "value": 8},
                           "output_tokens": {"dist": "fixed", "value": 2},
                           "arrival": {"kind": "constant", "rate": RATE}})  # fmt: skip
    records = []
    for i in range(spec.count):
        send = int(i * S / RATE)
        slow = send >= slow_from_s * S and i % slow_every == 0
        first = send + (3 * S if slow else S // 20)
        records.append(
            RequestRecord(index=i, scheduled_ns=send, send_ns=send,
                          chunk_ns=[first, first + S // 20], chunk_tokens=[1, 1],
                          end_ns=first + S // 20)
        )  # fmt: skip
    m = compute_metrics(records, warmup_s=WARMUP, slo=SLO)
    return RunResult(id="x", created_utc="now", records=records, metrics=m, slo=SLO), spec


@pytest.mark.parametrize("rule", [SIM_STEADY, REAL_STEADY])
def test_a_tail_that_builds_late_fails_and_the_same_tail_spread_out_does_not(rule) -> None:
    # 1 request in 16 slow over the window's later half: 6.25% there, ~3% over the window
    late, spec = _run(slow_every=16, slow_from_s=WARMUP + (SECONDS - WARMUP) / 2)
    assert late.metrics.ttft_ms.p95 < 2000  # the whole window's P95 passes
    st = apply_steady_state(late, spec, rule)
    assert st is not None and st.keeps_up and st.queue_flat  # the other two checks pass
    assert not st.holds_halves and not st.steady and not late.metrics.slo_pass
    (stat, value, target), = st.late_ttft  # fmt: skip
    assert (stat, target) == ("p95", 2000) and value > 2000
    early = next(v for h, m, _, v, _ in st.halves if (h, m) == ("early", "ttft"))
    assert early == pytest.approx(50)  # the earlier half held: only the later half fails
    check = next(c for c in late.metrics.slo_checks if c.stat == "late_ttft_p95")
    text = check_text(check.model_dump())
    assert "P95 TTFT of the window's later half" in text and "> 2,000" in text
    assert st.signals()["late_ttft_ms"]["p95"] == pytest.approx(value)
    # 1 request in 32 slow over the whole run (~3% in either half): steady, passes
    spread, spec = _run(slow_every=32, slow_from_s=0)
    st = apply_steady_state(spread, spec, rule)
    assert st is not None and st.holds_halves and st.steady and spread.metrics.slo_pass


def test_one_completion_cut_off_by_the_window_edge_does_not_fail_a_sparse_point() -> None:
    from servetune.measure.steady import Steady

    def steady(arrivals: int, completed: int) -> Steady:
        window_s = arrivals / 0.125  # 0.125 req/s offered
        return Steady(offered_req_s=0.125, achieved_req_s=completed / window_s,
                      queue_slope=None, latency_s=1.5, arrivals=arrivals, window_s=window_s,
                      warmup_s=10, rule=REAL_STEADY)  # fmt: skip

    # 8 of 9: the edge's one request; 800 of 900 is a real shortfall (89% < 90%)
    assert steady(9, 8).keeps_up and not steady(900, 800).keeps_up
    assert steady(9, 8).allowance <= 2 * (1 - REAL_STEADY.min_achieved)  # still capped
    assert not steady(9, 6).keeps_up  # 67%: beyond any allowance


def test_a_start_up_transient_fails_the_early_half_and_tpot_is_judged_per_half() -> None:
    # every 8th request slow over the first 20 s of the window only: the early half's P95
    early, spec = _run(slow_every=8, slow_from_s=0)
    for r in early.records:  # undo the slowness after 30 s: a transient at the start
        if r.send_ns >= 30 * S:
            r.chunk_ns = [r.send_ns + S // 20, r.send_ns + S // 10]
    early.metrics = compute_metrics(early.records, warmup_s=WARMUP, slo=SLO)
    st = apply_steady_state(early, spec, REAL_STEADY)
    assert st is not None and not st.holds_halves
    assert [(h, m) for h, m, _, v, t in st.halves if v > t] == [("early", "ttft")]
    text = check_text(next(c for c in early.metrics.slo_checks
                           if c.stat == "early_ttft_p95").model_dump())  # fmt: skip
    assert "P95 TTFT of the window's earlier half" in text
    # a TPOT target is judged per half too (TPOT here: 50 ms per request)
    tight = parse_slo({"tpot_ms": {"p95": 40}})
    run, spec = _run(slow_every=10**9, slow_from_s=0)
    run.slo = tight
    run.metrics = compute_metrics(run.records, warmup_s=WARMUP, slo=tight)
    st = apply_steady_state(run, spec, REAL_STEADY)
    assert st is not None
    assert {(h, m, round(v)) for h, m, _, v, _ in st.halves} == {
        ("early", "tpot", 50), ("late", "tpot", 50)}  # fmt: skip


def test_a_rising_trend_is_weak_evidence_and_a_light_draw_credits_what_it_offered() -> None:
    from servetune.measure.steady import credited_rate, weak_evidence

    def signals(offered: float, slope: float | None) -> dict:
        return {"steady": True, "offered_req_s": offered, "queue_slope_s_per_s": slope,
                "max_queue_slope_s_per_s": 0.02}  # fmt: skip

    assert weak_evidence(signals(0.6, 0.0)) == []
    assert weak_evidence(signals(0.6, 0.009)) == []  # under half the limit
    rising = weak_evidence(signals(0.6, 0.012))
    assert len(rising) == 1 and "TTFT trend rises (+0.012 s/s" in rising[0]
    assert weak_evidence(signals(0.6, None)) == []  # too few requests: no trend
    assert weak_evidence({}) == []  # a closed loop: not judged
    # a draw that offered 82% of the nominal 0.595 req/s shows 0.49 carried, not 0.595
    assert credited_rate(signals(0.49, 0.0), 0.595) == pytest.approx(0.49)
    assert credited_rate(signals(0.65, 0.0), 0.595) == pytest.approx(0.595)  # never more
    assert credited_rate({}, 8.0) == 8.0  # closed loop: the load as given


def _point(load: float, passed: bool, achieved: float, window_s: float = 60.0):
    from servetune.measure.result import PointResult

    sig = {"steady": passed, "offered_req_s": load, "achieved_req_s": achieved,
           "achieved_ratio": achieved / load, "achieved_min_ratio": 0.9,
           "queue_slope_s_per_s": 0.0, "max_queue_slope_s_per_s": 0.05,
           "window_s": window_s}  # fmt: skip
    return PointResult("rate", load, passed, req_s=achieved, signals=sig)


def test_a_rate_close_to_saturation_is_not_proven_by_a_short_window() -> None:
    """Morse's relaxation time: a 3 req/s server settles in ~360 s at 94% load, ~30 s at
    80%; a 60 s window proves the second, not the first."""
    from servetune.measure.steady import relaxation_s, saturated_rate, settles_in_window

    assert relaxation_s(2.82, 3.0) == pytest.approx(1 / (3 * (1 - (0.94**0.5)) ** 2))
    assert 300 < relaxation_s(2.82, 3.0) < 420 and 25 < relaxation_s(2.4, 3.0) < 32
    assert relaxation_s(3.0, 3.0) == float("inf")
    pts = [_point(1, True, 1.0), _point(2, True, 2.0), _point(4, False, 2.98)]
    assert saturated_rate([p.signals for p in pts]) == pytest.approx(2.98)  # the overload
    assert saturated_rate([p.signals for p in pts[:2]]) is None  # no overload seen yet
    near = _point(2.83, True, 2.83).signals
    (why,) = settles_in_window(near, 2.83, 2.98)
    assert "95% of the saturated 2.98 req/s" in why and "over half the 60 s window" in why
    assert settles_in_window(_point(2.38, True, 2.38).signals, 2.38, 2.98) == []
    assert settles_in_window(near, 2.83, None) == []  # saturation unknown: nothing said
    # a fast server settles fast: 94% of 50 req/s takes ~21 s, a 60 s window proves it
    assert settles_in_window(_point(47, True, 47).signals, 47, 50) == []


def test_the_tuner_credits_the_proven_load_below_a_point_too_close_to_saturation() -> None:
    """A point passed in the doubling phase, before an overload showed the saturated rate,
    is judged again when the search ends: the capacity falls to the proven load below."""
    from servetune.tune.trial import TrialResult, _not_proven, _recheck

    pts = [_point(1, True, 1.0), _point(2.83, True, 2.83), _point(5.66, False, 2.98)]
    trial = TrialResult(key="k", config={}, label="x", backend="real", status="ok",
                        points=pts, capacity=2.83, first_fail=5.66)  # fmt: skip
    assert _not_proven(pts[0], pts) == [] and _not_proven(pts[2], pts) == []
    weak: dict = {}
    _recheck(trial, weak)
    assert trial.capacity == 1 and trial.first_fail == 2.83 and list(weak) == [2.83]
    fine = TrialResult(key="k", config={}, label="x", backend="real", status="ok",
                       points=pts[:1] + pts[2:], capacity=1, first_fail=5.66)  # fmt: skip
    _recheck(fine, weak := {})
    assert fine.capacity == 1 and weak == {}


def test_with_nothing_proven_below_the_search_steps_down_until_a_load_is() -> None:
    """The GPU what-if's max_num_seqs=128 trial: the search's start (38.05 req/s) passed,
    then overloads showed the engine saturated at 40; nothing below was measured. The
    search steps down the lattice (x 2^-1/4) to the first load that passes on proven
    evidence; with no probe left in its budget the capacity stays where it was."""
    from servetune.tune.capacity import Probe, rate_lattice
    from servetune.tune.trial import TrialResult, _look_below, _recheck

    lattice = rate_lattice(0.25, 1024)
    start = lattice.load(lattice.index_of(38.06))
    assert start == pytest.approx(38.054628)

    def trial() -> TrialResult:
        pts = [_point(start, True, start), _point(2 * start, False, 40.0)]
        return TrialResult(key="k", config={}, label="x", backend="sim", status="ok",
                           points=pts, capacity=start, first_fail=2 * start)  # fmt: skip

    measured: list[float] = []

    def measure(load: float) -> Probe:  # 32 req/s is 80% of 40: settles in ~2 s
        measured.append(load)
        return Probe(load, load < 30, 0.0, None)

    t, weak = trial(), {}
    why = _recheck(t, weak)
    assert why and "95% of the saturated 40 req/s" in why[0] and weak == {}
    _look_below(t, weak, why, measure, lattice, max_probes=12)
    assert measured == [pytest.approx(32.0), pytest.approx(26.908685)]
    assert t.capacity == pytest.approx(26.908685) and t.first_fail == pytest.approx(32.0)
    assert list(weak) == [start]
    # the probe budget spent: nothing measured, the capacity stays where the search left it
    t, weak, measured = trial(), {}, []
    _look_below(t, weak, _recheck(t, weak), measure, lattice, max_probes=2)
    assert measured == [] and t.capacity == start and weak == {}


def test_upper_bound_rank_is_the_order_statistic_interval() -> None:
    """The rank whose value lies above the true quantile with the confidence asked,
    against scipy's binomial: P(Bin(n, q) <= k - 1) >= c > P(Bin(n, q) <= k - 2)."""
    from scipy.stats import binom

    from servetune.metrics.pct import upper_bound_rank

    for n, q, c in [(75, 0.95, 0.8), (300, 0.95, 0.8), (100, 0.5, 0.9), (1000, 0.99, 0.8)]:
        k = upper_bound_rank(n, q, c)
        assert binom.cdf(k - 1, n, q) >= c > binom.cdf(k - 2, n, q), (n, q, c, k)
    assert upper_bound_rank(75, 0.95, 0.8) == 74  # a sample P95 of 75: its 2nd largest
    assert upper_bound_rank(30, 0.95, 0.8) == 30  # too few: the maximum is the best bound
    assert upper_bound_rank(0, 0.95, 0.8) == 0


def test_a_p95_met_by_the_sample_but_not_by_its_upper_bound_is_weak_evidence() -> None:
    """~85 requests in the window, 4 of them slow (600 ms): the sample P95 (type 7,
    between the 80th and 81st values) meets a 525 ms target, its 80% upper bound (one of
    the 3 largest) does not:
    the point passes but is not credited on the real engine's rule; the simulator's rule
    (no confidence asked) credits it."""
    from servetune.measure.steady import weak_evidence

    n, rate, warmup = 95, 1.0, 10
    spec = parse_workload({"count": n, "warmup_s": warmup,
                           "input_tokens": {"dist": "fixed", "value": 8},
                           "output_tokens": {"dist": "fixed", "value": 2},
                           "arrival": {"kind": "constant", "rate": rate}})  # fmt: skip
    slo = parse_slo({"ttft_ms": {"p95": 525}})
    records = []
    for i in range(n):
        send = int(i * S / rate)
        slow = i in (30, 50, 70, 90)
        first = send + (S * 6 // 10 if slow else S // 10)
        records.append(RequestRecord(index=i, scheduled_ns=send, send_ns=send,
                                     chunk_ns=[first, first + S // 20], chunk_tokens=[1, 1],
                                     end_ns=first + S // 20))  # fmt: skip
    m = compute_metrics(records, warmup_s=warmup, slo=slo)
    res = RunResult(id="x", created_utc="now", records=records, metrics=m, slo=slo)
    st = apply_steady_state(res, spec, REAL_STEADY)
    assert st is not None and st.steady and res.metrics.slo_pass  # the point passes
    (b,) = st.bounds
    assert b[:2] == ("ttft", "p95") and b[3] >= 75 and b[4] == pytest.approx(600, abs=1)
    (why,) = weak_evidence(st.signals())
    assert "P95 TTFT's 80% upper bound (rank" in why and "600 ms > 525" in why
    sim = apply_steady_state(res, spec, SIM_STEADY)
    assert sim is not None and sim.bounds == () and weak_evidence(sim.signals()) == []
