"""The charts a tuning user reads first, from the summary `tune` stores with its study:
capacity under the SLO per config (with the repetitions' 95% interval, winner and
baseline marked), the simulator's prediction next to the measured capacity per verified
config, and the SLO that binds each config. Reports that are not of a tune study have no
ranking: these sections are left out of them (None)."""

from __future__ import annotations

import math
from typing import Any

from servetune.report.charts import Chart, _go, _layout
from servetune.report.data import ReportData
from servetune.report.labels import knob_label
from servetune.status import TrialStatus
from servetune.tune.explain import check_with_n, failing_point
from servetune.tune.objective import ObjectiveMetric
from servetune.tune.trial import TrialResult

MAX_BARS = 12
WINNER, BASELINE, OTHER = "#2ca02c", "#555555", "#9ecae1"


def trials(data: ReportData, key: str = "ranked") -> list[TrialResult]:
    """The study's ranked trials (or `sim_ranked`), as the tuner saw them."""
    return [TrialResult.from_json(t) for t in (data.tune or {}).get(key) or []]


def name(data: ReportData, t: TrialResult | dict[str, Any]) -> str:
    """A trial's name in this report: its values of the knobs the study varied."""
    cfg = t.config if isinstance(t, TrialResult) else t.get("config") or {}
    return knob_label(cfg, data.knobs) or "config"


def role(data: ReportData, key: str) -> str:
    """winner | baseline | winner = baseline | '' for a config key."""
    s = data.tune or {}
    w, b = (s.get("winner") or {}).get("key"), (s.get("baseline") or {}).get("key")
    if key == w and key == b:
        return "winner = baseline"
    return "winner" if key == w else "baseline" if key == b else ""


def shown(data: ReportData) -> list[TrialResult]:
    """The ranked configs that ran, best first (at most MAX_BARS, the baseline kept)."""
    ok = [t for t in trials(data) if t.status in (TrialStatus.OK, TrialStatus.NO_SLO)]
    top = ok[:MAX_BARS]
    base = next((t for t in ok if role(data, t.key).endswith("baseline")), None)
    if base is not None and base not in top:
        top = top[: MAX_BARS - 1] + [base]
    return top


def metric(data: ReportData) -> ObjectiveMetric:
    """How the study's objective reads: its figures in their own unit, never as scores."""
    return ObjectiveMetric((data.tune or {}).get("objective", "goodput"))


def where(m: ObjectiveMetric, t: TrialResult) -> str:
    """Where a config's figure was measured: `capacity 38.1 req/s` (`≥38.1` when no load
    tried broke the SLO: a lower bound); the latency objective searches no capacity, so
    its one load, the workload's own (`at 1 req/s`)."""
    capacity = m.capacity_of(t)
    if capacity is not None:
        at_least = "≥" if t.capacity_is_lower_bound else ""
        return f"capacity {at_least}{capacity:.3g} {unit(t)}"
    if not m.searches_capacity and t.best is not None:
        return f"at {t.best.load:.3g} {unit(t)}"
    return "no pass"


def _bar(m: ObjectiveMetric, t: TrialResult) -> float | None:
    """A config's bar in the metric's own unit: its repetitions' mean (`ci` keeps the
    metric's values) where it was re-run, else its trial's score turned back to a value."""
    return t.ci["mean"] if t.ci else m.value(t.score)


def _whisker(t: TrialResult, y: float | None, end: str) -> float:
    """How far the repetitions' 95% interval reaches from the bar to its `end` (high |
    low); 0 for a config not re-run."""
    return abs(t.ci[end] - y) if t.ci and y is not None else 0.0


def _color(r: str) -> str:
    return WINNER if r.startswith("winner") else BASELINE if r else OTHER


def unit(t: TrialResult) -> str:
    """The unit of a trial's loads: users (concurrency), req/s or sessions/s (rate)."""
    p = t.best or (t.points[0] if t.points else None)
    return p.unit if p else "req/s"


def capacity(data: ReportData) -> Chart | None:
    """Each config's objective at its capacity (its highest load meeting the SLO; for the
    latency objective, at the workload's own load), in the objective's own unit, with the
    95% t-interval of its repetitions (`tune.stats.mean_ci`) where it was re-run."""
    if not data.is_tune:
        return None
    m = metric(data)
    title = "Capacity under the SLO per config"
    if not m.searches_capacity:
        title = "P95 TTFT per config at the workload's own load"
    chart = Chart("capacity", title)
    rows = shown(data)
    if not rows:
        chart.note = "No config of the study met the SLO at any load it tried."
        return chart
    go = _go()
    ys = [_bar(m, t) for t in rows]  # None: no figure, no bar (never a $0 or 0 ms one)
    err_hi = [_whisker(t, y, "high") for t, y in zip(rows, ys, strict=True)]
    err_lo = [_whisker(t, y, "low") for t, y in zip(rows, ys, strict=True)]
    colors = [_color(role(data, t.key)) for t in rows]
    texts = [" ".join(x for x in (role(data, t.key), where(m, t)) if x) for t in rows]
    hover = [  # the figure in its unit: `%{x}` alone would drop the $ or ms
        f"{m.text(y)}<br>{t.backend}; {where(m, t)}"
        + (
            f"<br>{t.ci['n']} repetitions: 95% CI {t.ci['low']:.3g} .. {t.ci['high']:.3g}, "
            f"{t.ci['passed']}/{t.ci['n']} met the SLO"
            if t.ci
            else "<br>not repeated"
        )
        for t, y in zip(rows, ys, strict=True)
    ]
    fig = go.Figure(
        go.Bar(
            y=[name(data, t) for t in rows],
            x=ys,
            orientation="h",
            marker_color=colors,
            text=texts,
            textposition="auto",
            error_x={"type": "data", "array": err_hi, "arrayminus": err_lo, "visible": True},
            customdata=hover,
            hovertemplate="%{y}<br>%{customdata}<extra></extra>",
            showlegend=False,
        )
    )
    top = max((y + e for y, e in zip(ys, err_hi, strict=True) if y is not None), default=0.0) or 1.0
    # no objective's figure is below zero: a wide interval of 3 repetitions is cut at 0
    fig.update_xaxes(title_text=m.axis_title, range=[0, 1.05 * top])
    fig.update_yaxes(autorange="reversed", automargin=True)
    chart.fig = _layout(fig, 120 + 34 * len(rows))
    reps = [t for t in rows if t.ci]
    at = "capacity" if m.searches_capacity else "one load, the workload's own"
    chart.note = (
        f"Green: the winner; dark grey: the baseline. Bars: {m.axis_title}, at each "
        f"config's {at}, ranked as the study ranked them: the repetitions' mean where "
        "a config was re-run, with their 95% t-interval as whiskers ("
        + (f"{len(reps)} config(s), {reps[0].ci['n']} repetitions" if reps else "none was")
        + "), else its one search run."
    )
    return chart


def sim_vs_measured(data: ReportData) -> Chart | None:
    """Per verified config: the simulator's predicted score next to the measured one
    (hybrid studies: `tune.simvsreal` rows)."""
    if not data.is_tune:
        return None
    chart = Chart("sim-capacity", "Simulator's prediction vs measured, per verified config")
    rows = [r for r in (data.tune or {}).get("sim_vs_real") or [] if r.get("real_score")]
    if not rows:
        chart.note = (
            f"Only for a hybrid study (this one is {data.tune.get('mode')}): the simulator "
            "ranks, the real engine verifies (`tune --backend hybrid`)."
        )
        return chart
    go = _go()
    m = metric(data)
    by_label = {t.label: t for t in trials(data)}
    xs = [name(data, by_label[r["label"]]) if r["label"] in by_label else r["label"] for r in rows]
    fig = go.Figure()
    for key, label, color in (
        ("sim_score", "simulator", "#ff7f0e"),
        ("real_score", "measured", "#1f77b4"),
    ):
        values = [m.value(r.get(key)) for r in rows]
        fig.add_trace(
            go.Bar(
                y=xs,
                x=values,
                orientation="h",
                name=label,
                marker_color=color,
                text=["-" if v is None else f"{v:.3g}" for v in values],
                textposition="outside",
                cliponaxis=False,
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text=m.axis_title, rangemode="tozero")
    fig.update_yaxes(autorange="reversed", automargin=True)
    chart.fig = _layout(fig, 140 + 60 * len(rows))
    errs = [
        f"{x}: {r['score_error']:+.0%}"
        for x, r in zip(xs, rows, strict=True)
        if r.get("score_error") is not None
    ]
    chart.note = "Error (sim - real) / real: " + ("; ".join(errs) or "n/a") + "."
    return chart


NOT_REACHED = "not reached (capacity is a lower bound)"


def _binding_row(data: ReportData, t: TrialResult) -> tuple[str, float | None, str] | None:
    """(config, value / target, text) of its worst missed check above its capacity; no
    ratio (`NOT_REACHED`) for a config whose search never broke the SLO, so it is not
    silently missing; None for one with nothing to show (it met the SLO at its one load)."""
    p = failing_point(t)
    missed = p.missed() if p else []
    if p is not None and missed:
        c = missed[0]
        ratio = (c.get("value") or 0) / (c.get("target") or 1)
        return name(data, t), ratio, f"{check_with_n(c, p)} at {p.load:.3g} {unit(t)}"
    if metric(data).searches_capacity and t.capacity_is_lower_bound:
        return name(data, t), None, NOT_REACHED
    return None


def binding(data: ReportData) -> Chart | None:
    """The SLO check that broke first above each config's capacity, as value / target."""
    if not data.is_tune:
        return None
    chart = Chart("binding", "The SLO that binds each config")
    rows = [row for t in shown(data) if (row := _binding_row(data, t)) is not None]
    bars = [(n, ratio, text) for n, ratio, text in rows if ratio is not None]
    if not bars:
        chart.note = (
            "No config broke an SLO target within the loads tried (lower bounds)."
            if metric(data).searches_capacity
            else "Every config met the SLO at the workload's own load (no capacity search)."
        )
        return chart
    go = _go()
    fig = go.Figure(
        go.Bar(
            y=[r[0] for r in bars],
            x=[r[1] for r in bars],
            orientation="h",
            text=[r[2] for r in bars],
            textposition="outside",
            cliponaxis=False,
            marker_color="#d62728",
            hovertemplate="%{y}<br>%{text}<br>%{x:.2f} x the target<extra></extra>",
            showlegend=False,
        )
    )
    unbound = [r for r in rows if r[1] is None]
    if unbound:  # said in their row, right of the target line: no ratio to draw
        fig.add_trace(
            go.Scatter(
                y=[r[0] for r in unbound],
                x=[1.0] * len(unbound),
                mode="text",
                text=[r[2] for r in unbound],
                textposition="middle right",
                textfont={"color": "#555"},
                cliponaxis=False,
                hovertemplate="%{y}<br>%{text}<extra></extra>",
                showlegend=False,
            )
        )
    fig.add_vline(x=1.0, line={"color": "#444", "dash": "dash"})
    # a log axis (ratios from 1.01 to 100x) with room right of the longest bar for its text
    top = math.log10(max(max(r[1] for r in bars), 1.0))
    fig.update_xaxes(
        title_text="value / target at the first load above capacity",
        type="log",
        range=[min(0.0, math.log10(min(r[1] for r in bars) or 1.0)) - 0.05, top + 1.4],
    )
    fig.update_yaxes(  # the study's ranking, top down, whichever trace a row is in
        autorange="reversed",
        automargin=True,
        categoryorder="array",
        categoryarray=[r[0] for r in rows],
    )
    chart.fig = _layout(fig, 120 + 34 * len(rows))
    chart.note = (
        "Each config's worst missed check at the load just above its capacity"
        + (f"; {len(unbound)} never broke it within the loads tried." if unbound else ".")
        if metric(data).searches_capacity
        else "Each config's worst missed check at the workload's own load."
    )
    return chart
