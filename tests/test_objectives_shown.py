"""Every objective's figures are shown in its own unit, never as the tuner's internal score
(higher is better: -$ for cost, -ms for latency), and its margins say which way is better.

The bug hunt's cost study (Llama-3.1-8B on an H100, simulator, $2/GPU-hour, max_num_seqs 8
baseline against 16, 64, 256): the report plotted bars of -0.089 .. -0.804 on an inverted
axis and its verdict and the CLI said the winner, 89% cheaper, was "+89%". Its latency study
(`--preset vllm-gpu --objective latency`) plotted -85.5 and named a "capacity" of 1 req/s,
the workload's own load: the latency objective searches no capacity."""

from __future__ import annotations

import pytest

from servetune.measure.result import PointResult
from servetune.report.data import ReportData
from servetune.report.tuning import capacity, sim_vs_measured
from servetune.report.verdict import verdict
from servetune.tune.explain import explain
from servetune.tune.objective import Objective, ObjectiveMetric
from servetune.tune.trial import TrialResult, TrialStatus

# the cost study's $ per 1M output tokens, its capacities (req/s) and max_num_seqs
COST = {8: (0.804, 4.0), 16: (0.419, 8.0), 64: (0.131, 26.7), 256: (0.0885, 38.1)}


def _trial(seqs: int, score: float, load: float, capacity: float | None) -> TrialResult:
    p = PointResult("rate", load, True, ttft_p95_ms=150.0, completed=300)
    return TrialResult(
        key=f"s{seqs}", config={"max_num_seqs": seqs}, label=f"max_num_seqs={seqs}",
        backend="sim", status=TrialStatus.OK, points=[p], capacity=capacity, score=score,
        best=p, first_fail=None if capacity is None else 2 * capacity,  # a bracketed search
    )  # fmt: skip


def _cost_trials() -> list[TrialResult]:
    """Ranked as the tuner ranks them: the highest score (the lowest $) first."""
    ts = [_trial(s, -usd, cap, cap) for s, (usd, cap) in COST.items()]
    return sorted(ts, key=lambda t: -(t.score or 0.0))


def _latency_trials() -> list[TrialResult]:
    """One load each, the workload's own 1 req/s; trial.py sets `capacity` to it."""
    return [_trial(s, -ms, 1.0, 1.0) for s, ms in ((32, 70.0), (8, 85.5))]


def _report(objective: str, ranked: list[TrialResult], **extra: object) -> ReportData:
    base = next(t for t in ranked if t.config["max_num_seqs"] == 8)
    summary = {
        "study": "s", "mode": "sim", "objective": objective, "slo_met": True,
        "slo": {"ttft_ms": {"p95": 800.0}}, "winner": ranked[0].to_json(),
        "baseline": base.to_json(), "ranked": [t.to_json() for t in ranked], **extra,
    }  # fmt: skip
    return ReportData("t", "w", [], "rate", knobs=["max_num_seqs"], tune=summary)


def test_the_margin_says_which_way_is_better_for_each_objective() -> None:
    cost, latency, goodput = (ObjectiveMetric(k) for k in ("cost", "latency", "goodput"))
    assert cost.margin(0.0885, 0.804) == "89% cheaper"
    assert cost.margin(0.9, 0.804) == "12% more expensive"
    assert latency.margin(300.0, 500.0) == "40% lower P95 TTFT"
    assert latency.margin(330.0, 300.0) == "10% higher P95 TTFT"
    assert goodput.margin(2.0, 1.0) == "100% more goodput per GPU"  # winner / other - 1
    assert goodput.margin(0.163, 0.167) == "2% less goodput per GPU"
    assert latency.margin(85.5, 85.5) == "the same P95 TTFT to within 0.5%"
    assert goodput.margin(1.0, 0.0) == "n/a" and cost.margin(float("inf"), 0.8) == "n/a"
    # scores turn back into the metric's own values, each with its unit
    assert cost.value(-0.0885) == 0.0885 and latency.value(-85.5) == 85.5
    assert goodput.value(1.5) == 1.5 and cost.value(None) is None
    assert cost.show(-0.0885) == "$0.0885/1M tok" and latency.show(-85.5) == "P95 TTFT 86 ms"


def test_the_cli_explanation_of_a_cost_study_says_cheaper() -> None:
    ranked = _cost_trials()
    base = ranked[-1]
    lines = explain(ranked[0], ranked, base, Objective("cost", 2.0), ["max_num_seqs"])
    assert lines[0].startswith("best cost per 1M tokens: $0.0885/1M tok at a capacity of 38.1")
    assert lines[1].startswith(
        "runner-up max_num_seqs=64: $0.131/1M tok (the winner: 32% cheaper);"
    )
    assert lines[2].startswith(
        "vs the baseline (max_num_seqs=8): $0.804/1M tok (the winner: 89% cheaper);"
    )
    assert "+89%" not in " ".join(lines) and "+32%" not in " ".join(lines)


def test_a_repeated_cost_winner_is_compared_in_dollars() -> None:
    """Repetitions keep dollars; the baseline's one trial is a score (-$). Both are compared
    as dollars: $0.09 (CI 0.085 .. 0.095) against $0.804 is 89% cheaper, and proven."""
    ranked = _cost_trials()
    ranked[0].ci = {"n": 3, "mean": 0.09, "low": 0.085, "high": 0.095, "passed": 3}
    lines = explain(ranked[0], ranked, ranked[-1], Objective("cost", 2.0), ["max_num_seqs"])
    assert lines[0].startswith(
        "best cost per 1M tokens on the finalists' repetitions: $0.09/1M tok over 3 "
        "(95% CI 0.085 .. 0.095); its search trial: "
    ), lines[0]
    assert "$0.804/1M tok (the winner: 89% cheaper on its repetitions)" in lines[2], lines[2]


def test_the_latency_explanation_names_the_workloads_load_not_a_capacity() -> None:
    ranked = _latency_trials()
    lines = explain(ranked[0], ranked, ranked[1], Objective("latency"), ["max_num_seqs"])
    assert lines[0] == (
        "best P95 TTFT: P95 TTFT 70 ms at the workload's own load, 1 req/s (no capacity search)"
    )
    assert "P95 TTFT 86 ms (the winner: 18% lower P95 TTFT)" in lines[1], lines[1]
    assert not any("capacity is a lower bound" in line for line in lines), lines


def test_a_cost_report_plots_and_says_dollars() -> None:
    rows_ = [
        {"label": "max_num_seqs=256", "sim_score": -0.0885, "real_score": -0.1,
         "score_error": -0.115, "req_s_error": 0.1},
    ]  # fmt: skip
    data = _report("cost", _cost_trials(), sim_vs_real=rows_)
    rows = dict(verdict(data).rows)
    assert rows["vs baseline"] == (
        "89% cheaper in the search ($0.0885/1M tok vs $0.804/1M tok, baseline max_num_seqs=8)"
    )
    assert rows["capacity"].startswith("38.1 req/s within the SLO")
    # the simulator's $0.0885 against a measured $0.10: 11.5% low, not +11.5%
    assert rows["sim vs real"].endswith(", -12% on the cost per 1M tokens"), rows["sim vs real"]
    chart = capacity(data)
    bars = chart.fig.data[0]
    assert list(bars.x) == pytest.approx([0.0885, 0.131, 0.419, 0.804])
    assert chart.fig.layout.xaxis.title.text == "cost ($ per 1M output tokens), lower is better"
    lo, hi = chart.fig.layout.xaxis.range
    assert lo == 0 and hi > 0.804
    assert bars.customdata[0].startswith("$0.0885/1M tok<br>sim; capacity 38.1 req/s")
    sim = sim_vs_measured(data).fig
    assert [list(t.x) for t in sim.data] == [[0.0885], [0.1]]
    assert sim.layout.xaxis.title.text.startswith("cost ($ per 1M output tokens)")


def test_a_latency_report_plots_milliseconds_and_invents_no_capacity() -> None:
    data = _report("latency", _latency_trials())
    rows = dict(verdict(data).rows)
    assert "capacity" not in rows and "capacity point" not in rows
    assert rows["load"].startswith("1 req/s, the workload's own: no capacity search")
    assert rows["vs baseline"].startswith(
        "18% lower P95 TTFT in the search (P95 TTFT 70 ms vs P95 TTFT 86 ms"
    )
    chart = capacity(data)
    bars = chart.fig.data[0]
    assert list(bars.x) == pytest.approx([70.0, 85.5])
    assert chart.title == "P95 TTFT per config at the workload's own load"
    assert chart.fig.layout.xaxis.title.text == "P95 TTFT (ms), lower is better"
    assert list(bars.text) == ["winner at 1 req/s", "baseline at 1 req/s"]
    assert not any("capacity" in t for t in (*bars.text, *bars.customdata))
