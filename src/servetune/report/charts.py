"""The report's figures (plotly). Each builder returns a Chart; a chart that does not
apply (one run, no server metrics, no simulated twin) carries a note saying why instead
of a figure, so the report says what is missing rather than silently leaving it out."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servetune.engines.registry import ADAPTERS, exports_metrics
from servetune.metrics import sweep
from servetune.metrics.compute import request_latencies_ms
from servetune.metrics.pct import is_max_only, sample_note
from servetune.report.analysis import ecdf
from servetune.report.data import X_TITLES, ReportData, RunData, closed_loop, traffic
from servetune.report.labels import knobs_of
from servetune.report.sweetspot import SeriesSweetSpot, report_sweet_spot
from servetune.status import RequestStatus
from servetune.store.runinfo import RunInfo

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
PCT_DASH = {"p50": "solid", "p95": "dash", "p99": "dot"}
REGION_COLORS = {
    sweep.LINEAR: "rgba(44,160,44,0.10)",
    sweep.SATURATION: "rgba(255,127,14,0.13)",
    sweep.OVER: "rgba(214,39,40,0.12)",
}
SIM_DASHES = ("dash", "longdash", "dashdot")  # a real series' simulated twins, in turn
MAX_CDF_RUNS = 8
MAX_SERVER_RUNS = 6


@dataclass
class Chart:
    key: str
    title: str
    fig: Any | None = None
    note: str = ""


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _layout(fig: Any, height: int = 460, **kw: Any) -> Any:
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 30, "t": 60, "b": 50},
        legend={"orientation": "h", "y": -0.18},
        hovermode="closest",
        **kw,
    )
    return fig


def _x_axis(fig: Any, data: ReportData, xs: Sequence[float | None], **where: Any) -> None:
    """The report's load axis (`ReportData.x_kind`)."""
    _load_axis(fig, data.x_kind, xs, **where)


def _load_axis(fig: Any, kind: str, xs: Sequence[float | None], **where: Any) -> None:
    """Concurrency sweeps double the load each step: log x with a tick per point."""
    if kind == "concurrency":
        ticks = sorted({x for x in xs if x})
        fig.update_xaxes(
            title_text=X_TITLES[kind],
            type="log",
            tickvals=ticks,
            ticktext=[f"{t:g}" for t in ticks],
            **where,
        )
    else:
        fig.update_xaxes(title_text=X_TITLES[kind], type="linear", **where)


def _color(data: ReportData, series: str) -> str:
    return PALETTE[list(data.series).index(series) % len(PALETTE)]


def _dash_for(members: Sequence[RunData]) -> str | None:
    return "dash" if members and members[0].info.backend == "sim" else None


def _m(r: RunData, path: str) -> float | None:
    cur: Any = r.metrics
    for p in path.split("."):
        cur = cur.get(p) if isinstance(cur, dict) else None
    return float(cur) if isinstance(cur, (int, float)) else None


def _sweeps(data: ReportData) -> dict[str, list[RunData]]:
    """Series with at least two load points (a curve can be drawn), as `_curve`s."""
    curves = {k: _curve(data, k) for k in data.series}
    return {k: v for k, v in curves.items() if len({data.x(r) for r in v}) >= 2}


def _repeats(data: ReportData, name: str, curve: Sequence[RunData]) -> list[RunData]:
    """The runs of a series at a load its curve already has (repetitions)."""
    on_curve = {id(r) for r in curve}
    return [r for r in data.series[name] if id(r) not in on_curve and data.x(r) is not None]


def latency_vs_load(data: ReportData) -> Chart:
    """TTFT and TPOT P50/P95/P99 against load, SLO lines, and goodput vs achieved rate."""
    chart = Chart("latency-vs-load", "Latency vs load")
    sweeps = _sweeps(data)
    if not sweeps:
        chart.note = "Needs a sweep: two or more runs of one config at different loads."
        chart.note += off_axis_note(data)
        return chart
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("TTFT ms", "TPOT ms", "req/s"), horizontal_spacing=0.07
    )
    for name, members in sweeps.items():
        color, xs = _color(data, name), [data.x(r) for r in members]
        hover = "<br>".join(f"{k}: {v}" for k, v in data.context.get(name, {}).items())
        for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
            for stat, dash in PCT_DASH.items():
                counts = [_count(r, metric) for r in members]
                fig.add_trace(
                    _go().Scatter(
                        x=xs,
                        y=[_m(r, f"{metric}.{stat}") for r in members],
                        mode="lines+markers",
                        name=name,
                        legendgroup=name,
                        line={"color": color, "dash": dash},
                        marker={"symbol": [_symbol(stat, n) for n in counts], "size": 8},
                        text=[r.info.id for r in members],
                        customdata=[sample_note(stat, n) for n in counts],
                        hovertemplate=f"<b>{name}</b><br>{hover}<br>%{{text}}<br>x=%{{x}}<br>"
                        f"{metric[:4].upper()} {stat.upper()} %{{y:.1f}} ms (%{{customdata}})"
                        "<extra></extra>",
                        showlegend=col == 1 and stat == "p50",
                    ),
                    row=1,
                    col=col,
                )
        reps = _repeats(data, name, members)
        if reps:  # repeated loads: markers over the curve, not a vertical zig-zag
            for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
                fig.add_trace(
                    _go().Scatter(
                        x=[data.x(r) for r in reps],
                        y=[_m(r, f"{metric}.p95") for r in reps],
                        mode="markers",
                        name=name,
                        legendgroup=name,
                        showlegend=False,
                        marker={"color": color, "symbol": "x", "size": 8},
                        text=[r.info.id for r in reps],
                        customdata=[sample_note("p95", _count(r, metric)) for r in reps],
                        hovertemplate=f"<b>{name}</b> repetition<br>%{{text}}<br>"
                        f"{metric[:4].upper()} P95 %{{y:.1f}} ms (%{{customdata}})<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
        for stat, dash in (("req_s", _dash_for(members)), ("goodput_req_s", "dot")):
            fig.add_trace(
                _go().Scatter(
                    x=xs,
                    y=[_m(r, stat) for r in members],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=False,
                    line={"color": color, "dash": dash},
                    text=[r.info.id for r in members],
                    hovertemplate=f"<b>{name}</b><br>%{{text}}<br>%{{y:.2f}} req/s "
                    f"{'goodput' if stat != 'req_s' else 'achieved'}<extra></extra>",
                ),
                row=1,
                col=3,
            )
    slo, slo_note = shared_slo([r for name in sweeps for r in data.series[name]])
    if slo is not None:
        for col, metric in ((1, slo.ttft_ms), (2, slo.tpot_ms)):
            for stat, target in metric.items() if metric else []:
                fig.add_hline(
                    y=target,
                    line={"color": "#444", "dash": "dashdot", "width": 1},
                    annotation_text=f"SLO {stat.upper()} <= {target:g}",
                    annotation_position="top left",
                    row=1,
                    col=col,
                )
    all_x = [data.x(r) for v in sweeps.values() for r in v]
    for col in (1, 2, 3):
        _x_axis(fig, data, all_x, row=1, col=col)
    fig.update_yaxes(type="log", dtick=1, row=1, col=1)
    chart.fig = _layout(fig, 480)
    chart.note = (
        "One colour per config. Solid P50, dashed P95, dotted P99, over each point's "
        "measured requests (warm-up excluded; each point's n in its hover); an open marker "
        "is a tail percentile resting on too few requests, the maximum. Dash-dotted: the "
        "SLO targets; x: a repetition's P95. Right: achieved (solid) and goodput (dotted) "
        "requests per second." + slo_note + off_axis_note(data)
    )
    return chart


def shared_slo(runs: Sequence[RunData]) -> tuple[Any, str]:
    """The SLO the runs judged by one share, drawn as lines; when they differ, none (one
    set of lines would misjudge the other runs), and a sentence saying so."""
    slos = {
        json.dumps(r.result.slo.model_dump(mode="json"), sort_keys=True): r.result.slo
        for r in runs
        if r.result.slo is not None
    }
    if len(slos) > 1:
        return None, f" No SLO lines: these runs were judged by {len(slos)} different SLOs."
    return next(iter(slos.values()), None), ""


def off_axis_note(data: ReportData) -> str:
    """Why some runs are not on the load axis: they ran the other loop kind (users in
    flight against an offered rate), and the two are never drawn on one axis."""
    off = [r for r in data.runs if closed_loop(r.info) != (data.x_kind == "concurrency")]
    if not off:
        return ""
    if data.x_kind == "rate":
        return (
            f" {len(off)} closed-loop run(s) left off this rate axis (their load is users in "
            "flight): the sweet-spot chart draws them against concurrency."
        )
    return (
        f" {len(off)} open-loop run(s) left off this concurrency axis (their load is an "
        "offered rate): their figures are in the §16 record"
        + (" and the capacity chart." if data.is_tune else ".")
    )


def _count(r: RunData, metric: str) -> int | None:
    """Requests a run's percentile of `metric` rests on (its Dist's count)."""
    d = r.metrics.get(metric)
    return d.get("count") if isinstance(d, dict) else None


def _symbol(stat: str, n: int | None) -> str:
    return "circle-open" if is_max_only(stat, n) else "circle"


def sweet_spot(data: ReportData) -> Chart:
    """Output tok/s against users in flight (closed-loop runs only) with seed 000 §3.1's
    linear / saturation / over-saturation regions shaded and the sweet spot starred: the
    tuner's own (`report.sweetspot`), so the report and `tune` name the same point."""
    chart = Chart("sweet-spot", "Batch / concurrency sweet spot")
    found = report_sweet_spot(data)
    if found is None:
        chart.note = (
            "Needs a closed-loop sweep: three or more concurrency levels of one config "
            "(an open-loop run's achieved req/s is not a load on this curve)."
        )
        return chart
    from plotly.subplots import make_subplots

    spot, name = found.spot, found.series
    xs, ys, regions = list(spot.loads), list(spot.throughput), list(spot.regions)
    members = [found.runs.get(x) for x in xs]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    # On a log axis plotly.js takes the range and annotation positions in log10 units but
    # shapes in data units: spans are computed in axis units and converted for shapes.
    bounds = _region_spans([math.log10(x) for x in xs], regions)
    fig.update_xaxes(range=[bounds[0][1], bounds[-1][2]])
    for region, lo, hi in bounds:
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=10.0**lo,
            x1=10.0**hi,
            y0=0,
            y1=1,
            fillcolor=REGION_COLORS[region],
            line_width=0,
            layer="below",
        )
        fig.add_annotation(
            x=(lo + hi) / 2,
            xref="x",
            yref="paper",
            y=1.0,
            yanchor="bottom",
            text=region,
            showarrow=False,
            font={"size": 12, "color": "#555"},
        )
    fig.add_trace(
        _go().Scatter(
            x=xs,
            y=ys,
            mode="lines+markers",
            name="output tok/s",
            line={"color": _color(data, name), "width": 3},
            text=[
                f"{r.info.id if r else 'c=' + format(x, 'g')} ({reg})"
                for x, r, reg in zip(xs, members, regions, strict=True)
            ],
            hovertemplate="%{text}<br>%{y:.0f} tok/s<extra></extra>",
        ),
        secondary_y=False,
    )
    for metric, color, dash in (("ttft_ms", "#555", "dot"), ("tpot_ms", "#999", "dash")):
        label = f"{metric[:4].upper()} P99 ms"
        counts = [_count(r, metric) if r else None for r in members]
        fig.add_trace(
            _go().Scatter(
                x=xs,
                y=[_m(r, f"{metric}.p99") if r else None for r in members],
                mode="lines+markers",
                name=label,
                line={"color": color, "dash": dash},
                marker={"symbol": [_symbol("p99", n) for n in counts]},
                customdata=[sample_note("p99", n) for n in counts],
                hovertemplate=f"{label} %{{y:.1f}} (%{{customdata}})<extra></extra>",
            ),
            secondary_y=True,
        )
    if spot.knee is not None:
        fig.add_trace(
            _go().Scatter(
                x=[spot.knee],
                y=[ys[xs.index(spot.knee)]],
                mode="markers+text",
                name="sweet spot",
                text=["sweet spot"],
                textposition="bottom right",
                marker={"symbol": "star", "size": 18, "color": "#000"},
            ),
            secondary_y=False,
        )
    _load_axis(fig, "concurrency", xs)
    fig.update_yaxes(title_text="output tok/s", secondary_y=False)
    fig.update_yaxes(title_text="P99 ms", type="log", dtick=1, secondary_y=True, showgrid=False)
    chart.fig = _layout(fig, 460)
    chart.note = sweet_spot_note(found)
    return chart


def sweet_spot_note(found: SeriesSweetSpot) -> str:
    """The chart's caption, in the tune CLI's words ("sweet spot 32 in flight (...)")."""
    spot = found.spot
    where = f"{spot.knee:g} in flight" if spot.knee is not None else "-"
    source = " as `tune` named it" if found.from_tune else ""
    return (
        f"Series {found.series}, closed-loop runs. Sweet spot: {where} ({spot.reason}){source}. "
        f"Regions from the throughput gain per load step (elasticity >= {sweep.LINEAR_MIN}: "
        f"linear; >= {sweep.FLAT_MAX}: saturation; below: over-saturation, where latency "
        "climbs for no throughput)."
    )


def _region_spans(xs: Sequence[float], regions: Sequence[str]) -> list[tuple[str, float, float]]:
    """Contiguous x spans per region, boundaries halfway between points; the first and
    last spans reach half a step beyond the end points."""
    if len(xs) == 1:
        return [(regions[0], xs[0] - 0.5, xs[0] + 0.5)]

    def mid(a: float, b: float) -> float:
        return (a + b) / 2

    spans: list[tuple[str, float, float]] = []
    start = xs[0] - (xs[1] - xs[0]) / 2
    for i in range(1, len(xs) + 1):
        if i == len(xs) or regions[i] != regions[i - 1]:
            end = xs[-1] + (xs[-1] - xs[-2]) / 2 if i == len(xs) else mid(xs[i - 1], xs[i])
            spans.append((regions[i - 1], start, end))
            start = end
    return spans


def pareto(data: ReportData) -> Chart:
    """Per-GPU output throughput vs per-user decode speed (1000 / TPOT P50) for every run;
    the front is the set of runs no other run beats on both."""
    chart = Chart("pareto", "Pareto front: per-GPU throughput vs per-user speed")
    pts = [
        (r, 1000.0 / t, (_m(r, "output_tok_s") or 0.0) / r.gpus)
        for r in data.runs
        if (t := _m(r, "tpot_ms.p50"))
    ]
    if len(pts) < 2:
        chart.note = "Needs two or more runs with streamed output (TPOT)."
        return chart
    go = _go()
    fig = go.Figure()
    for name in data.series:
        mine = [p for p in pts if p[0].series == name]
        if mine:
            fig.add_trace(
                go.Scatter(
                    x=[p[1] for p in mine],
                    y=[p[2] for p in mine],
                    mode="markers",
                    name=name,
                    marker={
                        "size": 10,
                        "color": _color(data, name),
                        "symbol": "diamond" if mine[0][0].info.backend == "sim" else "circle",
                    },
                    text=[f"{p[0].info.id} ({p[0].info.load_label()})" for p in mine],
                    hovertemplate="%{text}<br>%{x:.1f} tok/s/user<br>%{y:.0f} tok/s/GPU"
                    "<extra></extra>",
                )
            )
    front = sweep.pareto_front([p[1] for p in pts], [p[2] for p in pts])
    fig.add_trace(
        go.Scatter(
            x=[pts[i][1] for i in front],
            y=[pts[i][2] for i in front],
            mode="lines",
            name="Pareto front",
            line={"color": "#000", "dash": "dash", "shape": "hv"},
        )
    )
    fig.update_xaxes(title_text="per-user tok/s (1000 / TPOT P50)")
    fig.update_yaxes(title_text="output tok/s per GPU")
    chart.fig = _layout(fig, 460)
    chart.note = f"{len(front)} of {len(pts)} runs are on the front: " + ", ".join(
        pts[i][0].info.id for i in front
    )
    return chart


def _cdf_runs(data: ReportData) -> list[RunData]:
    runs = [r for r in data.runs if r.result.records]
    if len(runs) <= MAX_CDF_RUNS:
        return runs
    step = (len(runs) - 1) / (MAX_CDF_RUNS - 1)
    return [runs[round(i * step)] for i in range(MAX_CDF_RUNS)]


def cdfs(data: ReportData) -> Chart:
    """Empirical CDFs of TTFT, TPOT and E2E per run, from the raw records."""
    chart = Chart("cdf", "Latency percentile CDFs")
    runs = _cdf_runs(data)
    if not runs or not any(r.measured_records() for r in runs):
        chart.note = "No per-request records stored."
        return chart
    failed = [r for r in runs if not _answered(r)]  # a latency only an answer has
    runs = [r for r in runs if r not in failed]
    if not runs:
        chart.note = (
            "No request succeeded in the measurement window of these runs: no latency to draw."
        )
        return chart
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("TTFT ms", "TPOT ms", "E2E ms"), horizontal_spacing=0.06
    )
    for k, r in enumerate(runs):
        lat = [
            request_latencies_ms(x) for x in r.measured_records() if x.status == RequestStatus.OK
        ]
        color = PALETTE[k % len(PALETTE)]
        for col in range(3):
            xs, ps = ecdf([v[col] for v in lat if v[col] is not None])
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ps,
                    mode="lines",
                    name=f"{r.letter} {r.info.load_label()} ({r.series})",
                    legendgroup=r.letter,
                    showlegend=col == 0,
                    line={"color": color, "dash": "dash" if r.info.backend == "sim" else None},
                    hovertemplate="%{x:.1f} ms<br>fraction %{y:.3f}<extra>"
                    + f"{r.info.id} (n={len(lat)})</extra>",
                ),
                row=1,
                col=col + 1,
            )
    for col in (1, 2, 3):
        fig.update_xaxes(type="log", row=1, col=col)
        for p in (0.5, 0.95, 0.99):
            fig.add_hline(y=p, line={"color": "#bbb", "width": 1, "dash": "dot"}, row=1, col=col)
    fig.update_yaxes(title_text="fraction of requests", range=[0, 1.01], row=1, col=1)
    chart.fig = _layout(fig, 460)
    shown = "" if len(runs) == len(data.runs) else f" ({len(runs)} of {len(data.runs)} runs)"
    chart.note = (
        f"Dotted rules at P50, P95, P99; log x{shown}. Requests sent in each run's "
        "measurement window (warm-up excluded), as its percentiles."
    )
    if failed:
        chart.note += " Left out, no request succeeded: " + ", ".join(r.info.id for r in failed)
    return chart


def _answered(r: RunData) -> bool:
    """Whether a request of the run's measurement window succeeded (the CDFs draw those)."""
    return any(x.status == RequestStatus.OK for x in r.measured_records())


SERVER_PANELS = (
    ("KV cache usage", ("kv_cache_usage",)),
    ("requests", ("requests_running", "requests_waiting")),
    ("preemptions (cumulative)", ("preemptions_total",)),
)


def client_only_engines(runs: Sequence[RunData]) -> list[str]:
    """The engines of these runs that export no metrics servetune reads (a launched
    engine's `target.engine`, or bench's `--engine`)."""
    names = {
        r.result.target.engine or (r.info.meta.get("software") or {}).get("engine") for r in runs
    }
    return sorted(n for n in names if n in ADAPTERS and not exports_metrics(n))


def server_metrics(data: ReportData) -> Chart:
    """The engine's own metrics over time: KV usage, running/waiting, preemptions."""
    chart = Chart("server", "Server metrics over time")
    runs = [r for r in data.runs if r.result.server and r.result.server.values]
    if not runs:
        chart.note = (
            "No server metrics in these runs: bench scrapes the server's /metrics unless run"
            " with --no-scrape, and simulated runs have none."
        )
        if client_only := client_only_engines(data.runs):
            chart.note = (
                f"No server metrics: {', '.join(client_only)} exports no /metrics, so every"
                " figure of its runs is client-side (the load client's clocks and token"
                " counts)."
            )
        return chart
    if len(runs) > MAX_SERVER_RUNS:
        step = (len(runs) - 1) / (MAX_SERVER_RUNS - 1)
        runs = [runs[round(i * step)] for i in range(MAX_SERVER_RUNS)]
    panels, empty = _server_panels(runs)
    if not panels:
        chart.note = "The engine exported none of " + ", ".join(empty) + "."
        return chart
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07 if len(panels) > 1 else 0.0,
        subplot_titles=[p[0] for p in panels],
    )
    for k, r in enumerate(runs):
        s = r.result.server
        assert s is not None
        t0 = s.t_ns[0] if s.t_ns else 0
        ts = [(t - t0) / 1e9 for t in s.t_ns]
        color = PALETTE[k % len(PALETTE)]
        for row, (_, names) in enumerate(panels, start=1):
            for j, metric in enumerate(names):
                ys = [v.get(metric) for v in s.values]
                if all(y is None for y in ys):
                    continue
                if metric.endswith("_total"):
                    base = next((y for y in ys if y is not None), 0.0)
                    ys = [None if y is None else y - base for y in ys]
                fig.add_trace(
                    go.Scatter(
                        x=ts,
                        y=ys,
                        mode="lines",
                        name=f"{r.letter} {r.info.load_label()} {metric}",
                        legendgroup=r.letter,
                        line={"color": color, "dash": "dot" if j else None},
                    ),
                    row=row,
                    col=1,
                )
    fig.update_xaxes(title_text="seconds since the first scrape", row=len(panels), col=1)
    chart.fig = _layout(fig, 140 + 160 * len(panels))
    chart.note = "Dotted: waiting requests. Canonical names (docs/metrics.md), any engine."
    if empty:
        engines = sorted({r.info.engine or "the engine" for r in runs})
        chart.note += f" Not drawn: {', '.join(empty)} ({'/'.join(engines)} exports none)."
    return chart


def _server_panels(
    runs: Sequence[RunData],
) -> tuple[list[tuple[str, tuple[str, ...]]], list[str]]:
    """The panels some run has a value for, and the titles of those none has (left out:
    llama.cpp exports no KV-cache usage, for one)."""
    panels: list[tuple[str, tuple[str, ...]]] = []
    empty: list[str] = []
    for title, names in SERVER_PANELS:
        values = (v for r in runs for v in (r.result.server.values if r.result.server else []))
        if any(v.get(m) is not None for v in values for m in names):
            panels.append((title, names))
        else:
            empty.append(title)
    return panels, empty


def sim_vs_real(data: ReportData) -> Chart:
    """Each config that has both real and simulated runs: its measured curve (solid) and
    its simulated twins (dashed, `twin_key`: same model, knobs, traffic and GPU) in one
    colour; the TPOT P50 error at the loads both ran."""
    chart = Chart("sim-vs-real", "Simulation vs real")
    twins = _twins(data)
    if not twins:
        chart.note = (
            "Needs both real (bench) and simulated runs of the same config, workload and GPU."
        )
        return chart
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("TTFT P50/P99 ms", "TPOT P50/P99 ms", "output tok/s")
    )
    all_x: list[float | None] = []
    errs: list[float] = []
    for real_name, sim_names in twins:
        color = _color(data, real_name)
        dashes = [(real_name, None)] + [
            (s, SIM_DASHES[k % len(SIM_DASHES)]) for k, s in enumerate(sim_names)
        ]
        for name, dash in dashes:
            runs = _curve(data, name)
            xs = [data.x(r) for r in runs]
            all_x += xs
            group = name  # the series names say real or simulated
            for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
                for stat in ("p50", "p99"):
                    counts = [_count(r, metric) for r in runs]
                    fig.add_trace(
                        go.Scatter(
                            x=xs,
                            y=[_m(r, f"{metric}.{stat}") for r in runs],
                            mode="lines+markers",
                            name=group,
                            legendgroup=group,
                            showlegend=col == 1 and stat == "p50",
                            line={
                                "color": color,
                                "dash": dash or ("dot" if stat == "p99" else None),
                            },
                            marker={"symbol": [_symbol(stat, n) for n in counts]},
                            customdata=[sample_note(stat, n) for n in counts],
                            hovertemplate=f"{group}<br>{stat.upper()} %{{y:.1f}} ms "
                            "(%{customdata})<extra></extra>",
                        ),
                        row=1,
                        col=col,
                    )
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=[_m(r, "output_tok_s") for r in runs],
                    mode="lines+markers",
                    name=group,
                    legendgroup=group,
                    showlegend=False,
                    line={"color": color, "dash": dash},
                ),
                row=1,
                col=3,
            )
        for sim_name in sim_names:
            errs += _tpot_errors(data, _curve(data, real_name), _curve(data, sim_name))
    for col in (1, 2, 3):
        _x_axis(fig, data, all_x, row=1, col=col)
    fig.update_yaxes(type="log", dtick=1, row=1, col=1)
    chart.fig = _layout(fig, 460)
    chart.note = f"{len(twins)} config(s) with both; simulated dashed, P99 dotted. " + (
        f"TPOT P50 error at the same load: mean {sum(errs) / len(errs):.1f}%, max {max(errs):.1f}%."
        if errs
        else ""
    )
    return chart


def _curve(data: ReportData, name: str) -> list[RunData]:
    """A series' runs, one per load on a concurrency axis (the first: a tune study's
    search run; repetitions are left to `_repeats`), every run on a rate axis."""
    firsts: dict[object, RunData] = {}
    for r in (r for r in data.series[name] if data.x(r) is not None):
        firsts.setdefault(data.x(r) if data.x_kind == "concurrency" else id(r), r)
    return list(firsts.values())


def gpu_model(name: str | None) -> str | None:
    """The GPU's model as every source names it: nvidia-smi's "NVIDIA H100 80GB HBM3",
    the catalog's "NVIDIA H100 80GB SXM5" and "h100-sxm" are all H100 (the first word
    with a digit); None for a CPU host."""
    words = (name or "").replace("-", " ").split()
    return next((w.upper() for w in words if any(c.isdigit() for c in w)), name)


def twin_key(info: RunInfo) -> str:
    """What a simulated run must share with a real one to be its twin: the model, the
    knobs, the traffic (sizing fields aside) and the GPU model. The GPU count is left
    out: a real run records the host's GPUs, a simulated one its config's."""
    hw = info.meta.get("hardware") or {}
    parts = [info.model, knobs_of(info), traffic(info), gpu_model(hw.get("gpu"))]
    return json.dumps(parts, sort_keys=True, default=str)


def _twins(data: ReportData) -> list[tuple[str, list[str]]]:
    """Each real series with its simulated twins (`twin_key`), when it has any."""

    def key(name: str) -> str:
        return twin_key(data.series[name][0].info)

    sims = [n for n, m in data.series.items() if m[0].info.backend == "sim"]
    pairs = [
        (n, [s for s in sims if key(s) == key(n)])
        for n, m in data.series.items()
        if m[0].info.backend == "real"
    ]
    return [(n, twins) for n, twins in pairs if twins]


def _tpot_errors(data: ReportData, real: list[RunData], sim: list[RunData]) -> list[float]:
    """|sim - real| / real of TPOT P50, %, at each load both ran (users, or offered rate)."""

    def load(r: RunData) -> float | None:
        return r.info.concurrency if data.x_kind == "concurrency" else r.info.rate

    by_load = {load(r): r for r in sim}
    out = []
    for a in real:
        b = by_load.get(load(a))
        ra, rb = _m(a, "tpot_ms.p50"), _m(b, "tpot_ms.p50") if b else None
        if ra and rb:
            out.append(abs(rb - ra) / ra * 100)
    return out
