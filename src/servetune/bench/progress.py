"""The summary tables printed after bench points (the live view is bench.live)."""

from __future__ import annotations

from rich.table import Table

from servetune.bench.server_metrics import ttft_breakdown
from servetune.metrics.pct import pct_cell
from servetune.results.schema import Dist, RunResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _p99(d: Dist) -> str:
    """A P99 cell: `~max` when its sample (`d.count`) is too small for a P99."""
    return pct_cell("p99", d.p99, d.count, ".1f")


def load_label(r: RunResult) -> str:
    """`rate 4.0`, `conc 8`, or `trace` (a replayed trace sets no rate)."""
    if r.load.kind == "closed":
        return f"conc {r.load.concurrency}"
    return "trace" if r.load.rate is None else f"rate {r.load.rate}"


def _columns(t: Table, headers: tuple[str, ...]) -> None:
    """Right-justified columns that fold rather than cut a cell when squeezed; the first
    (the load, the row's label) never breaks. The CLI prints wide tables in blocks of
    columns (`cli.render.print_tables`), so numbers keep their full width."""
    for i, h in enumerate(headers):
        t.add_column(h, justify="right", overflow="fold", no_wrap=i == 0)


def summary_table(results: list[RunResult]) -> Table:
    """One row per load point: the headline figures, client flags and SLO verdict."""
    t = Table(title="servetune bench", show_lines=False)
    _columns(t, (
        "load", "ok/err", "req/s", "out tok/s", "n", "TTFT p50", "TTFT p99", "TPOT p50",
        "TPOT p99", "ITL p99", "E2E p99", "lag p99", "goodput", "SLO",
    ))  # fmt: skip
    t.caption = "percentiles over n requests; ~max: too few for a P99 (n < 100), the maximum"
    if any(r.metrics.stream_buffered for r in results):
        t.caption += (
            "\n[red]BUFFERED: the server sent every chunk at the end of the answer; "
            "TTFT, TPOT and ITL are not measurable (-), E2E is the latency a user sees[/]"
        )
    for r in results:
        m = r.metrics
        load = load_label(r)
        slo = "-" if m.slo_pass is None else ("[green]pass[/]" if m.slo_pass else "[red]fail[/]")
        if r.client.bottleneck:
            load += " [red]![/]"
        if m.stream_buffered:
            load += " [red]BUFFERED[/]"
        t.add_row(
            load,
            f"{m.completed}/{m.failed}",
            f"{m.req_s:.2f}",
            f"{m.output_tok_s:.1f}",
            # not streamed, no TTFT: the n of the E2E figures (it read 0 beside them)
            str(m.ttft_ms.count or m.e2e_ms.count),
            _ms(m.ttft_ms.p50),
            _p99(m.ttft_ms),
            _ms(m.tpot_ms.p50),
            _p99(m.tpot_ms),
            _p99(m.itl_ms),
            _p99(m.e2e_ms),
            _p99(m.send_lag_ms),
            "-" if m.goodput_req_s is None else f"{m.goodput_req_s:.2f}",
            slo,
        )
    return t


def ttft_split(r: RunResult) -> dict[str, float | None]:
    """The run's mean TTFT split into connect / engine queue / prefill / rest
    (`server_metrics.ttft_breakdown`); {} when no request completed."""
    return ttft_breakdown(r.records, r.server.deltas if r.server else None)


def ttft_split_table(results: list[RunResult]) -> Table | None:
    """Where each point's mean TTFT went, when the engine said (bench --engine: vLLM's
    queue and prefill histograms, llama.cpp's per-request prompt_ms); None when no point
    has the engine's side (then TTFT is only the client's one number)."""
    rows = [(r, ttft_split(r)) for r in results]
    rows = [(r, s) for r, s in rows if s.get("queue_ms") is not None or s.get("prefill_ms")]
    if not rows:
        return None
    t = Table(title="TTFT split, mean ms", caption="connect + queue + prefill + rest = TTFT")
    _columns(t, ("load", "TTFT", "connect", "queue", "prefill", "rest"))
    for r, s in rows:
        parts = ("ttft_ms", "connect_ms", "queue_ms", "prefill_ms", "rest_ms")
        t.add_row(load_label(r), *(_ms(s.get(k)) for k in parts))
    return t
