"""The report's figures (plotly). Each builder returns a Chart; a chart that does not
apply (one run, no server metrics, no simulated twin) carries a note saying why instead
of a figure, so the report says what is missing rather than silently leaving it out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servetune.metrics import sweep
from servetune.metrics.compute import request_latencies_ms
from servetune.report.analysis import ecdf
from servetune.report.data import ReportData, RunData
from servetune.status import RequestStatus

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
    """Concurrency sweeps double the load each step: log x with a tick per point."""
    if data.x_kind == "concurrency":
        ticks = sorted({x for x in xs if x})
        fig.update_xaxes(
            title_text=data.x_title,
            type="log",
            tickvals=ticks,
            ticktext=[f"{t:g}" for t in ticks],
            **where,
        )
    else:
        fig.update_xaxes(title_text=data.x_title, type="linear", **where)


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
    """Series with at least two load points (a curve can be drawn)."""
    return {
        k: [r for r in v if data.x(r) is not None]
        for k, v in data.series.items()
        if len({data.x(r) for r in v if data.x(r) is not None}) >= 2
    }


def latency_vs_load(data: ReportData) -> Chart:
    """TTFT and TPOT P50/P95/P99 against load, SLO lines, and goodput vs achieved rate."""
    chart = Chart("latency-vs-load", "Latency vs load")
    sweeps = _sweeps(data)
    if not sweeps:
        chart.note = "Needs a sweep: two or more runs of one config at different loads."
        return chart
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("TTFT ms", "TPOT ms", "req/s"), horizontal_spacing=0.07
    )
    for name, members in sweeps.items():
        color, xs = _color(data, name), [data.x(r) for r in members]
        for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
            for stat, dash in PCT_DASH.items():
                fig.add_trace(
                    _go().Scatter(
                        x=xs,
                        y=[_m(r, f"{metric}.{stat}") for r in members],
                        mode="lines+markers",
                        name=f"{name} {stat.upper()}",
                        legendgroup=name,
                        line={"color": color, "dash": dash},
                        text=[r.info.id for r in members],
                        hovertemplate="%{text}<br>x=%{x}<br>%{y:.1f} ms<extra>"
                        + f"{metric[:4].upper()} {stat.upper()}</extra>",
                        showlegend=col == 1,
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
                    name=f"{name} {'goodput' if stat != 'req_s' else 'achieved'}",
                    legendgroup=name,
                    line={"color": color, "dash": dash},
                    text=[r.info.id for r in members],
                    hovertemplate="%{text}<br>%{y:.2f} req/s<extra></extra>",
                ),
                row=1,
                col=3,
            )
    slo = data.runs[0].result.slo
    if slo is not None:
        for col, metric in ((1, slo.ttft_ms), (2, slo.tpot_ms)):
            for stat, target in metric.items() if metric else []:
                fig.add_hline(
                    y=target,
                    line={"color": "#444", "dash": "dashdot", "width": 1},
                    annotation_text=f"SLO {stat.upper()} {target:g}",
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
        "Solid P50, dashed P95, dotted P99; dash-dotted lines are the SLO targets. "
        "Right: achieved and goodput (requests meeting every SLO) per second."
    )
    return chart


def sweet_spot(data: ReportData) -> Chart:
    """Throughput vs load with seed 000 §3.1's linear / saturation / over-saturation
    regions shaded and the sweet spot marked."""
    chart = Chart("sweet-spot", "Batch / concurrency sweet spot")
    sweeps = {k: v for k, v in _sweeps(data).items() if len(v) >= 3}
    if not sweeps:
        chart.note = "Needs a sweep of three or more load points of one config."
        return chart
    name, members = max(sweeps.items(), key=lambda kv: len(kv[1]))
    from plotly.subplots import make_subplots

    xs = [data.x(r) or 0.0 for r in members]
    ys = [_m(r, "output_tok_s") or 0.0 for r in members]
    regions = sweep.classify_regions(xs, ys)
    idx, why = sweep.sweet_spot(xs, ys)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    log = data.x_kind == "concurrency"
    # On a log axis plotly.js takes the range and annotation positions in log10 units but
    # shapes in data units: spans are computed in axis units and converted for shapes.
    pos = (lambda v: math.log10(v)) if log else (lambda v: v)
    back = (lambda v: 10.0**v) if log else (lambda v: v)
    bounds = _region_spans([pos(x) for x in xs], regions)
    fig.update_xaxes(range=[bounds[0][1], bounds[-1][2]])
    for region, lo, hi in bounds:
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=back(lo),
            x1=back(hi),
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
            text=[f"{r.info.id} ({reg})" for r, reg in zip(members, regions, strict=True)],
            hovertemplate="%{text}<br>%{y:.0f} tok/s<extra></extra>",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        _go().Scatter(
            x=xs,
            y=[_m(r, "ttft_ms.p99") for r in members],
            mode="lines+markers",
            name="TTFT P99 ms",
            line={"color": "#555", "dash": "dot"},
        ),
        secondary_y=True,
    )
    fig.add_trace(
        _go().Scatter(
            x=xs,
            y=[_m(r, "tpot_ms.p99") for r in members],
            mode="lines+markers",
            name="TPOT P99 ms",
            line={"color": "#999", "dash": "dash"},
        ),
        secondary_y=True,
    )
    if idx is not None:
        fig.add_trace(
            _go().Scatter(
                x=[xs[idx]],
                y=[ys[idx]],
                mode="markers+text",
                name="sweet spot",
                text=["sweet spot"],
                textposition="bottom right",
                marker={"symbol": "star", "size": 18, "color": "#000"},
            ),
            secondary_y=False,
        )
    _x_axis(fig, data, xs)
    fig.update_yaxes(title_text="output tok/s", secondary_y=False)
    fig.update_yaxes(title_text="P99 ms", type="log", dtick=1, secondary_y=True, showgrid=False)
    chart.fig = _layout(fig, 460)
    where = f"{data.x_title} = {xs[idx]:g}" if idx is not None else "-"
    chart.note = (
        f"Series {name}. Sweet spot: {where} ({why}). Regions from the throughput gain per "
        f"load step (elasticity >= {sweep.LINEAR_MIN}: linear; >= {sweep.FLAT_MAX}: "
        "saturation; below: over-saturation, where latency climbs for no throughput)."
    )
    return chart


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
    if not runs:
        chart.note = "No per-request records stored."
        return chart
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("TTFT ms", "TPOT ms", "E2E ms"), horizontal_spacing=0.06
    )
    for k, r in enumerate(runs):
        lat = [request_latencies_ms(x) for x in r.result.records if x.status == RequestStatus.OK]
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
                    hovertemplate="%{x:.1f} ms<br>P%{y:.3f}<extra>" + r.info.id + "</extra>",
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
    chart.note = f"Dotted rules at P50, P95, P99; log x{shown}."
    return chart


SERVER_PANELS = (
    ("KV cache usage", ("kv_cache_usage",)),
    ("requests", ("requests_running", "requests_waiting")),
    ("preemptions (cumulative)", ("preemptions_total",)),
)


def server_metrics(data: ReportData) -> Chart:
    """The engine's own metrics over time: KV usage, running/waiting, preemptions."""
    chart = Chart("server", "Server metrics over time")
    runs = [r for r in data.runs if r.result.server and r.result.server.values]
    if not runs:
        chart.note = (
            "No server metrics in these runs: bench scrapes the server's /metrics unless run"
            " with --no-scrape, and simulated runs have none."
        )
        return chart
    if len(runs) > MAX_SERVER_RUNS:
        step = (len(runs) - 1) / (MAX_SERVER_RUNS - 1)
        runs = [runs[round(i * step)] for i in range(MAX_SERVER_RUNS)]
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=[p[0] for p in SERVER_PANELS],
    )
    for k, r in enumerate(runs):
        s = r.result.server
        assert s is not None
        t0 = s.t_ns[0] if s.t_ns else 0
        ts = [(t - t0) / 1e9 for t in s.t_ns]
        color = PALETTE[k % len(PALETTE)]
        for row, (_, names) in enumerate(SERVER_PANELS, start=1):
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
    fig.update_xaxes(title_text="seconds since the first scrape", row=3, col=1)
    chart.fig = _layout(fig, 620)
    chart.note = "Dotted: waiting requests. Canonical names (docs/metrics.md), any engine."
    return chart


def sim_vs_real(data: ReportData) -> Chart:
    """Simulated against measured, matched by config (minus backend) and load."""
    chart = Chart("sim-vs-real", "Simulation vs real")
    real = [r for r in data.runs if r.info.backend == "real"]
    sim = [r for r in data.runs if r.info.backend == "sim"]
    if not real or not sim:
        chart.note = "Needs both real (bench) and simulated runs of the same config and load."
        return chart
    from plotly.subplots import make_subplots

    pairs = _pairs(data, real, sim)
    go = _go()
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("TTFT P50/P99 ms", "TPOT P50/P99 ms", "output tok/s")
    )
    for backend, runs, dash in (("real", real, None), ("sim", sim, "dash")):
        runs = sorted(runs, key=lambda r: data.x(r) or 0.0)
        xs = [data.x(r) for r in runs]
        color = PALETTE[0] if backend == "real" else PALETTE[1]
        for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
            for stat in ("p50", "p99"):
                fig.add_trace(
                    go.Scatter(
                        x=xs,
                        y=[_m(r, f"{metric}.{stat}") for r in runs],
                        mode="lines+markers",
                        name=f"{backend} {stat.upper()}",
                        legendgroup=backend,
                        showlegend=col == 1,
                        line={"color": color, "dash": dash or ("dot" if stat == "p99" else None)},
                    ),
                    row=1,
                    col=col,
                )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[_m(r, "output_tok_s") for r in runs],
                mode="lines+markers",
                name=f"{backend} throughput",
                legendgroup=backend,
                showlegend=False,
                line={"color": color, "dash": dash},
            ),
            row=1,
            col=3,
        )
    for col in (1, 2, 3):
        _x_axis(fig, data, [data.x(r) for r in real + sim], row=1, col=col)
    fig.update_yaxes(type="log", dtick=1, row=1, col=1)
    chart.fig = _layout(fig, 460)
    errs = []
    for a, b in pairs:
        ra, rb = _m(a, "tpot_ms.p50"), _m(b, "tpot_ms.p50")
        if ra and rb:
            errs.append(abs(rb - ra) / ra * 100)
    chart.note = f"{len(pairs)} matched pairs; sim dashed. " + (
        f"TPOT P50 error: mean {sum(errs) / len(errs):.1f}%, max {max(errs):.1f}%." if errs else ""
    )
    return chart


def _pairs(
    data: ReportData, real: list[RunData], sim: list[RunData]
) -> list[tuple[RunData, RunData]]:
    def key(r: RunData) -> tuple[str, str, float | None]:
        return (
            r.info.model or "",
            str(sorted(r.info.engine_config.items())),
            r.info.concurrency if data.x_kind == "concurrency" else r.info.rate,
        )

    by_key = {key(r): r for r in sim}
    return [(r, by_key[key(r)]) for r in real if key(r) in by_key]


MEMORY_PARTS = (
    ("weights_per_gpu_bytes", "weights", "#1f77b4"),
    ("activation_bytes", "activation", "#ff7f0e"),
    ("overhead_bytes", "overhead", "#7f7f7f"),
    ("kv_pool_bytes", "KV cache pool", "#2ca02c"),
)


def memory(data: ReportData, plans: dict[str, dict[str, Any]], notes: list[str]) -> Chart:
    """Per-GPU memory budget from `plan` (weights, activation, overheads, KV pool, free)."""
    chart = Chart("memory", "Memory breakdown (from plan)")
    if not plans:
        chart.note = "No plan: " + ("; ".join(notes) or "model/GPU not recorded with the runs.")
        return chart
    go = _go()
    labels = list(plans)
    gib = 2**30
    fig = go.Figure()
    for key, name, color in MEMORY_PARTS:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[plans[k].get(key, 0) / gib for k in labels],
                name=name,
                marker_color=color,
                hovertemplate="%{y:.2f} GiB<extra>" + name + "</extra>",
            )
        )
    free = [
        max(0.0, (p["device_bytes"] - sum(p.get(k, 0) for k, _, _ in MEMORY_PARTS)) / gib)
        for p in plans.values()
    ]
    fig.add_trace(go.Bar(x=labels, y=free, name="unused (headroom)", marker_color="#dddddd"))
    fig.update_layout(barmode="stack", bargap=0.45)
    fig.update_yaxes(title_text="GiB per GPU")
    chart.fig = _layout(fig, 440)
    p0 = next(iter(plans.values()))
    chart.note = (
        f"{p0.get('model')} on {p0.get('hardware')}: KV capacity "
        f"{p0.get('kv_capacity_tokens'):,} tokens, max concurrency "
        f"{p0.get('max_concurrency')}. " + "; ".join(notes)
    )
    return chart
