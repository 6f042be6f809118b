"""The report's telemetry section: what the host, the engine's processes and the GPU did
while each run went, drawn on the run's own clock beside its throughput and latency
(records and telemetry share the anchor, so second 12 is the same second in every panel).
Without telemetry (simulated runs, runs stored before it existed) the section is one line.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from servetune.report.charts import MAX_SERVER_RUNS, PALETTE, Chart, _go, _layout
from servetune.report.data import ReportData, RunData
from servetune.results.schema import RequestRecord
from servetune.status import RequestStatus

# (panel title, [(series name, label, scale)]); a panel with no data in any run is dropped.
PANELS: tuple[tuple[str, tuple[tuple[str, str, float], ...]], ...] = (
    ("output tokens/s (per 1 s)", (("_tok_s", "tok/s", 1.0),)),
    ("TTFT by send time (ms)", (("_ttft", "TTFT", 1.0),)),
    (
        "CPU cores in use",
        (
            ("engine_cpu_cores", "engine", 1.0),
            ("client_cpu_cores", "client", 1.0),
            ("other_cpu_cores", "others", 1.0),
        ),
    ),
    ("engine waited for a CPU (share)", (("engine_runq_wait_share", "run-queue wait", 1.0),)),
    (
        "memory (GiB)",
        (("engine_rss_bytes", "engine RSS", 2**-30), ("gpu_memory_used", "GPU", 2**-30)),
    ),
    ("GPU utilisation", (("gpu_util", "util", 1.0),)),
)


NS = 1_000_000_000


def _chunk_tokens(x: RequestRecord) -> Iterator[tuple[int, float]]:
    """(arrival ns, tokens) of each chunk, scaled so they add up to the request's output
    tokens (the server's count, as the run's tok/s): a token counts when it arrived."""
    counts = x.chunk_tokens if len(x.chunk_tokens) == len(x.chunk_ns) else [1] * len(x.chunk_ns)
    scale = x.output_tokens / (sum(counts) or 1)
    return ((t, n * scale) for t, n in zip(x.chunk_ns, counts, strict=True))


def tokens_per_second(records: Sequence[RequestRecord]) -> tuple[list[float], list[float]]:
    """Output tokens/s in 1 s bins of the run's clock, each chunk in the second it
    arrived; the last bin, cut by the run's end, divided by its real width (merged into
    the one before when under half a second, so a sliver reads as no spike)."""
    ok = [x for x in records if x.status == RequestStatus.OK and x.chunk_ns]
    if not ok:
        return [], []
    end = max(max(x.end_ns for x in records), max(x.chunk_ns[-1] for x in ok), 1) / NS
    edges = [float(s) for s in range(math.ceil(end))] + [end]
    if len(edges) > 2 and edges[-1] - edges[-2] < 0.5:
        del edges[-2]
    sums = [0.0] * (len(edges) - 1)
    for x in ok:
        for t, n in _chunk_tokens(x):
            sums[min(int(t // NS), len(sums) - 1)] += n
    bins = list(itertools.pairwise(edges))
    rates = [v / (b - a) for v, (a, b) in zip(sums, bins, strict=True)]
    return [(a + b) / 2 for a, b in bins], rates


def _client_series(r: RunData) -> dict[str, tuple[list[float], list[float]]]:
    """Throughput per second and each request's TTFT at its send time (seconds on the
    run's clock), from the raw records."""
    ok = [x for x in r.result.records if x.status == RequestStatus.OK and x.chunk_ns]
    return {
        "_tok_s": tokens_per_second(r.result.records),
        "_ttft": ([x.send_ns / 1e9 for x in ok], [(x.chunk_ns[0] - x.send_ns) / 1e6 for x in ok]),
    }


def _series(r: RunData, name: str) -> tuple[list[float], list[Any]]:
    t = r.result.telemetry
    assert t is not None
    pts = [(ts / 1e9, v.get(name)) for ts, v in zip(t.t_ns, t.values, strict=False)]
    pts = [(x, y) for x, y in pts if y is not None]
    return [x for x, _ in pts], [y for _, y in pts]


def telemetry(data: ReportData) -> Chart:
    chart = Chart("telemetry", "Host, engine process and GPU over time")
    runs = [r for r in data.runs if r.result.telemetry and r.result.telemetry.values]
    if not runs:
        chart.note = (
            "No telemetry in these runs (measured with bench --no-telemetry, simulated, or "
            "stored before telemetry existed)."
        )
        return chart
    if len(runs) > MAX_SERVER_RUNS:
        step = (len(runs) - 1) / (MAX_SERVER_RUNS - 1)
        runs = [runs[round(i * step)] for i in range(MAX_SERVER_RUNS)]
    data_by_run = []
    for r in runs:
        got = _client_series(r)
        for _, lines in PANELS:
            for name, _, _ in lines:
                if not name.startswith("_"):
                    got[name] = _series(r, name)
        data_by_run.append(got)
    panels = [
        p for p in PANELS if any(d.get(n, ([], []))[1] for d in data_by_run for n, _, _ in p[1])
    ]
    if not panels:  # samples of nothing drawn here, and no request answered: no empty chart
        chart.note = (
            "Nothing to draw: the telemetry holds none of the series drawn here "
            "(CPU, memory, GPU) and no request was answered (docs/telemetry.md)."
        )
        return chart
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=[p[0] for p in panels],
    )
    dashes = (None, "dot", "dash")
    for k, (r, got) in enumerate(zip(runs, data_by_run, strict=True)):
        color = PALETTE[k % len(PALETTE)]
        for row, (_, lines) in enumerate(panels, start=1):
            for j, (name, label, scale) in enumerate(lines):
                xs, ys = got.get(name, ([], []))
                if not ys:
                    continue
                fig.add_trace(
                    go.Scatter(
                        x=xs,
                        y=[y * scale for y in ys],
                        mode="markers" if name == "_ttft" else "lines",
                        marker={"size": 4},
                        name=f"{r.letter} {r.info.load_label()} {label}",
                        legendgroup=r.letter,
                        line={"color": color, "dash": dashes[j % len(dashes)]},
                    ),
                    row=row,
                    col=1,
                )
    fig.update_xaxes(title_text="seconds since the run's start", row=len(panels), col=1)
    chart.fig = _layout(fig, 180 * len(panels) + 120)
    notes = sorted({n for r in runs for n in r.result.telemetry.notes})  # type: ignore[union-attr]
    chart.note = "Names and sources: docs/telemetry.md." + (
        " Not sampled: " + "; ".join(notes) if notes else ""
    )
    return chart
