"""Pure maths of the tuner: capacity bisection, sweet-spot regions, OOM edge, intervals,
space validation."""

from __future__ import annotations

import pytest

from servetune.errors import InputError
from servetune.tune.capacity import Probe, concurrency_lattice, rate_lattice, search_capacity
from servetune.tune.oomedge import find_edge, step_back
from servetune.tune.space import check_constraint, parse_space
from servetune.tune.stats import mean_ci
from servetune.tune.sweetspot import analyse, doubling
from servetune.tune.trial import TrialResult, TrialStatus
from servetune.tune.tuner import held_in_repeats, pick_winner


def _threshold(cap: float, calls: list[float]):
    def measure(load: float) -> Probe:
        calls.append(load)
        ok = load <= cap
        return Probe(load, ok, load, load if ok else None)

    return measure


@pytest.mark.parametrize("cap", [1, 3, 5, 8, 12, 31, 64])
def test_concurrency_capacity_is_exact_and_starts_by_doubling(cap: int) -> None:
    calls: list[float] = []
    res = search_capacity(_threshold(cap, calls), concurrency_lattice(64), max_probes=20)
    assert res.capacity == cap
    assert res.first_fail == (cap + 1 if cap < 64 else None)
    doubled = [c for c in calls if c in (1, 2, 4, 8, 16, 32, 64)]
    assert calls[: len(doubled)] == doubled  # 1, 2, 4, ... before any bisection
    assert len(calls) <= 2 * 7


@pytest.mark.parametrize("start", [0, 5, 12, 30])
def test_rate_capacity_does_not_depend_on_the_start(start: int) -> None:
    lat = rate_lattice(0.25, 1024)
    answers = set()
    for cap in (0.9, 7.3, 100.0):
        res = search_capacity(_threshold(cap, []), lat, start_index=start, max_probes=30)
        answers.add((cap, res.capacity))
        assert res.capacity is not None and res.capacity <= cap < res.first_fail
        assert res.first_fail / res.capacity == pytest.approx(2**0.25)
    assert len(answers) == 3


def test_capacity_none_when_the_lowest_load_fails() -> None:
    res = search_capacity(_threshold(0.5, []), concurrency_lattice(16))
    assert res.capacity is None and "lowest load" in res.reason


def test_sweet_spot_regions_on_synthetic_curves() -> None:
    loads = doubling(128)
    assert loads == [1, 2, 4, 8, 16, 32, 64, 128]
    # Michaelis-Menten: T = 1000 c / (c + 16): linear, then saturating, then flat.
    mm = analyse([(c, 1000 * c / (c + 16)) for c in loads])
    assert mm.regions == (
        "linear", "linear", "linear", "saturation", "saturation", "saturation",
        "saturation", "over-saturation",
    )  # fmt: skip
    assert mm.knee == 8
    # Hard ceiling at 16 then a drop: linear up to 16, over-saturation after.
    cliff = analyse([(c, 100 * min(c, 16) - (5 * c if c > 32 else 0)) for c in loads])
    assert cliff.regions[:5] == ("linear",) * 5
    assert set(cliff.regions[5:]) == {"over-saturation"}
    assert cliff.knee == 16 and "before over-saturation" in cliff.reason
    # Still linear at the top: the sweep must be extended.
    lin = analyse([(c, 10.0 * c) for c in loads])
    assert set(lin.regions) == {"linear"} and lin.knee == 128 and "extend" in lin.reason


def test_oom_edge_and_one_step_back() -> None:
    values = [8, 16, 32, 64, 128, 256]
    probed: list[int] = []

    def runs(v: int) -> bool:
        probed.append(v)
        return v <= 64

    edge = find_edge("max_num_seqs", values, 16, runs)
    assert (edge.largest_ok, edge.first_fail, edge.safe) == (64, 128, 32)
    assert len(probed) <= 3  # bisection, not a scan
    assert step_back(edge, 64) == 32 and step_back(edge, 16) == 16
    none = find_edge("max_num_seqs", values, 16, lambda v: True)
    assert none.first_fail is None and none.safe == 16 and "no OOM" in none.note


def test_confidence_interval_uses_student_t() -> None:
    ci = mean_ci([1.0, 2.0, 3.0])
    assert ci.mean == 2.0
    assert ci.half_width == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-3)
    assert mean_ci([5.0]).low == 5.0


def test_space_validation_errors_name_the_field() -> None:
    with pytest.raises(InputError, match="no knobs"):
        parse_space({"engine": "vllm", "knobs": {}})
    with pytest.raises(InputError, match="empty"):
        parse_space(None)
    with pytest.raises(InputError, match="did you mean max_num_seqs"):
        parse_space({"knobs": {"max_num_seq": [8]}})
    with pytest.raises(InputError, match="has no values"):
        parse_space({"knobs": {"max_num_seqs": []}})
    with pytest.raises(InputError, match="contradictory"):
        parse_space({"knobs": {"max_num_seqs": [64, 128]}, "constraints": ["max_num_seqs < 8"]})
    # the engine's own reason rides along, as --set gives it (LaunchSpec.why_unsupported)
    with pytest.raises(
        InputError, match="no flag for gpu_memory_utilization: llama.cpp sizes KV by -c"
    ):
        parse_space({"engine": "llamacpp", "knobs": {"gpu_memory_utilization": [0.8, 0.9]}})
    with pytest.raises(InputError, match="not allowed"):
        parse_space({"knobs": {"max_num_seqs": [8]}, "constraints": ["__import__('os')"]})
    # a knob the space leaves unset is None in every config: the constraint never bound
    with pytest.raises(InputError, match="max_num_batched_tokens is neither a knob nor fixed"):
        parse_space({"knobs": {"max_num_seqs": [8, 64]},
                     "constraints": ["max_num_batched_tokens >= max_num_seqs"]})  # fmt: skip
    fixed = parse_space({"knobs": {"max_num_seqs": [8, 64]},
                         "fixed": {"max_num_batched_tokens": 32},
                         "constraints": ["max_num_batched_tokens >= max_num_seqs"]})  # fmt: skip
    assert [p["max_num_seqs"] for p in fixed.valid_points()] == [8]
    s = parse_space({"knobs": {"max_num_seqs": {"min": 8, "max": 64, "mult": 2},
                               "max_num_batched_tokens": [16, 4096]},
                     "constraints": ["max_num_batched_tokens >= max_num_seqs"]})  # fmt: skip
    assert s.knobs["max_num_seqs"] == (8, 16, 32, 64)
    assert len(s.valid_points()) == 6  # (8|16, 16) and all four with 4096
    assert check_constraint("max_num_seqs <= 4 or max_model_len == None", {"max_num_seqs": 8})


def _drive(strategy, score) -> list[dict]:
    asked: list[dict] = []
    while batch := strategy.ask(2):
        for p in batch:
            assert p not in asked, "asked twice"
            asked.append(p)
            strategy.tell(p, score(p))
    return asked


def test_one_at_a_time_changes_one_knob_per_step_and_keeps_what_helps() -> None:
    from servetune.tune.strategies import make_strategy

    space = parse_space({"knobs": {"max_num_seqs": [8, 16, 32], "block_size": [16, 32]}})
    start = {"max_num_seqs": 8, "block_size": 16}

    def score(p: dict) -> float | None:
        if p["max_num_seqs"] == 32 and p["block_size"] == 32:
            return None  # infeasible: never kept
        return p["max_num_seqs"] + (5.0 if p["block_size"] == 32 else 0.0)

    oat = make_strategy("one-at-a-time", space, None, 0, start)
    asked = _drive(oat, score)
    assert asked[0] == start
    for a, b in zip(asked, asked[1:], strict=False):
        assert sum(a[k] != b[k] for k in a) <= 2  # neighbours of the current point
    assert oat.current == {"max_num_seqs": 32, "block_size": 16}
    assert [s["kept"] for s in oat.steps][:2] == [32, 16]
    assert len(asked) < space.size


def test_random_and_bayes_never_repeat_and_respect_the_budget() -> None:
    from servetune.tune.strategies import make_strategy

    space = parse_space({"knobs": {"max_num_seqs": [8, 16, 32, 64], "block_size": [16, 32]}})
    for name in ("random", "bayes"):
        s = make_strategy(name, space, 5, 3, {})
        asked = _drive(s, lambda p: float(p["max_num_seqs"]))
        assert len(asked) == 5


def test_one_at_a_time_runs_its_budget_beside_the_baseline_as_the_others_do() -> None:
    """`--trials 1` ran the baseline alone under one-at-a-time (its start counted in the
    budget) and the baseline and one more under grid, random and bayes."""
    from servetune.tune.strategies import make_strategy

    space = parse_space({"knobs": {"max_num_seqs": [8, 16, 32, 64], "block_size": [16, 32]}})
    start = {"max_num_seqs": 8, "block_size": 16}
    oat = make_strategy("one-at-a-time", space, 2, 0, start)
    asked = _drive(oat, lambda p: float(p["max_num_seqs"]))
    assert asked[0] == start and len(asked) == 1 + 2, asked


def _fcfs_run(rate: float, service_rate: float, seconds: float, warmup_s: float):
    """A single FCFS server with a fixed service time, fed at a fixed rate: the queue is
    flat when service_rate > rate and grows at (rate - service_rate) otherwise. Returns
    the run (records + metrics with an SLO) and the workload it measured."""
    from servetune.metrics.compute import compute_metrics
    from servetune.results.schema import RequestRecord, RunResult
    from servetune.slo import parse_slo
    from servetune.workload.spec import parse_workload

    s = 1_000_000_000
    spec = parse_workload({"count": int(rate * seconds), "warmup_s": warmup_s,
                           "input_tokens": {"dist": "fixed", "value": 8},
                           "output_tokens": {"dist": "fixed", "value": 2},
                           "arrival": {"kind": "constant", "rate": rate}})  # fmt: skip
    free, records = 0, []
    for i in range(spec.count):
        arrive = int(i * s / rate)
        start = max(arrive, free)
        free = start + int(s / service_rate)
        chunks = [start + 1_000_000, free]
        records.append(
            RequestRecord(index=i, scheduled_ns=arrive, send_ns=arrive, chunk_ns=chunks,
                          chunk_tokens=[1, 1], end_ns=free)
        )  # fmt: skip
    slo = parse_slo({"ttft_ms": {"p95": 1e9}})  # percentiles never bind: only steady state
    m = compute_metrics(records, warmup_s=warmup_s, slo=slo)
    return RunResult(id="x", created_utc="now", records=records, metrics=m), spec


def test_a_growing_queue_fails_whatever_its_percentiles() -> None:
    from servetune.measure.steady import REAL_STEADY, SIM_STEADY, apply_steady_state

    for rule in (SIM_STEADY, REAL_STEADY):
        res, spec = _fcfs_run(rate=10.0, service_rate=8.0, seconds=60, warmup_s=10)
        assert res.metrics.slo_pass  # the percentiles alone would pass it
        st = apply_steady_state(res, spec, rule)
        assert st is not None and not st.steady and not res.metrics.slo_pass
        # a queue fed at 10 req/s and served at 8: 80% achieved; the wait grows at
        # (10 - 8) / 8 = 0.25 s per s (each arrival waits 1/8 - 1/10 s more)
        assert st.achieved_ratio == pytest.approx(0.8, abs=0.02)
        assert st.queue_slope == pytest.approx(0.25, rel=0.02)
        failed = {c.stat for c in res.metrics.slo_checks if not c.ok}
        assert failed == {"shortfall", "queue_slope"}
        assert st.signals()["steady"] is False
    res, spec = _fcfs_run(rate=8.0, service_rate=10.0, seconds=60, warmup_s=10)
    st = apply_steady_state(res, spec, SIM_STEADY)
    assert st is not None and st.steady and res.metrics.slo_pass
    assert st.achieved_ratio == pytest.approx(1.0, abs=0.02) and st.queue_slope == 0


def test_steady_rule_scales_the_count_with_the_rate() -> None:
    from servetune.measure.loads import load_spec
    from servetune.measure.steady import SteadyRule
    from servetune.workload.spec import parse_workload

    rule = SteadyRule(warmup_s=10, window_s=50, max_requests=5000)
    wl = parse_workload({"count": 300, "input_tokens": {"dist": "fixed", "value": 8},
                         "output_tokens": {"dist": "fixed", "value": 8},
                         "arrival": {"kind": "poisson", "rate": 1}})  # fmt: skip
    counts = {r: load_spec(wl, "rate", r, 4, rule).count for r in (1, 10, 40, 1000)}
    # 60 s of arrivals, never fewer than the workload's 300, at most the cap
    assert counts == {1: 300, 10: 600, 40: 2400, 1000: 5000}
    spec = load_spec(wl, "rate", 40, 4, rule)
    assert spec.warmup_s == 10 and spec.arrival.rate == 40 and spec.arrival.open_loop
    by_time = parse_workload({**wl.model_dump(), "count": None, "duration_s": 120})
    assert load_spec(by_time, "rate", 10, 4, rule).count == 1200  # 120 s at 10 req/s
    closed = load_spec(wl, "concurrency", 8, 4, rule)  # closed loop: per user, unchanged
    assert (closed.count, closed.warmup_s) == (300, 0) and not closed.arrival.open_loop
    with pytest.raises(ValueError, match="window_s"):
        SteadyRule(window_s=0)


def _finalist(label: str, mean: float, passed: int, n: int = 3) -> TrialResult:
    return TrialResult(
        key=label,
        config={"engine": "vllm"},
        label=label,
        backend="real",
        status=TrialStatus.OK,
        ci={"mean": mean, "low": mean, "high": mean, "n": n, "passed": passed},
    )


def test_winner_is_a_finalist_whose_capacity_held_in_its_repeats() -> None:
    fast_but_failing = _finalist("fast", 9.0, passed=0)
    held = _finalist("held", 5.0, passed=3)
    half = _finalist("half", 7.0, passed=1)
    assert pick_winner([fast_but_failing, held, half], higher_is_better=True) is held
    assert held_in_repeats(held) and not held_in_repeats(half)
    # nothing held: the best mean, flagged by the caller (held_in_repeats is False)
    w = pick_winner([half, fast_but_failing], higher_is_better=True)
    assert w is fast_but_failing and not held_in_repeats(w)
    # lower is better (TTFT objective): the lowest mean among those that held
    low = _finalist("low", 2.0, passed=2)
    assert pick_winner([held, low, half], higher_is_better=False) is low


def test_without_repetitions_the_ranking_decides() -> None:
    first = TrialResult("a", {"engine": "vllm"}, "a", "sim", TrialStatus.OK, score=3.0)
    second = TrialResult("b", {"engine": "vllm"}, "b", "sim", TrialStatus.OK, score=4.0)
    assert pick_winner([first, second], higher_is_better=True) is first


def _missing(slots: int, threads: int, ttft_ms: float) -> TrialResult:
    """A simulator trial whose one point misses P95 TTFT 1,000 ms by `ttft_ms`."""
    from servetune.measure.result import PointResult

    check = {"metric": "ttft_ms", "stat": "p95", "value": ttft_ms, "target": 1000.0, "ok": False}
    p = PointResult("concurrency", 1.0, False, req_s=1.0, ttft_p95_ms=ttft_ms, checks=[check])
    cfg = {"engine": "llamacpp", "parallel_slots": slots, "threads": threads}
    return TrialResult(key=f"s{slots}t{threads}", config=cfg, label=f"s{slots}t{threads}",
                       backend="sim", status=TrialStatus.NO_SLO, points=[p])  # fmt: skip


def test_when_no_simulated_config_meets_the_slo_the_closest_still_rank() -> None:
    # On a busy host the SLO derived from a quick idle probe was beyond every simulated
    # config: all scores None. Closeness to the SLO still tells the configs apart, so the
    # real engine verifies the closest ones, and a knob that changes it is not "blind".
    from servetune.tune.selection import diverse_top, merit, sim_blind_knobs

    trials = [_missing(1, 1, 4000), _missing(2, 1, 2000), _missing(1, 2, 4000),
              _missing(2, 2, 2000), _missing(4, 1, 1500)]  # fmt: skip
    assert merit(trials[0]) == pytest.approx(-4.0)
    top = diverse_top(trials, 2, skip="s1t1")
    assert [t.key for t in top] == ["s4t1", "s2t1"]  # closest first; s2t2 ties s2t1: once
    assert sim_blind_knobs(trials, ["parallel_slots", "threads"]) == ["threads"]
