"""`servetune report`: one offline HTML file (plotly.js embedded once) for a run, a
study or a list of runs — latency vs load with SLO lines and goodput, the seed 000 §3.1
sweet spot, the Pareto front, percentile CDFs, server metrics over time, sim-vs-real,
the memory breakdown from `plan`, and the seed 003 §16 record — plus PNG/SVG export of
each chart (kaleido, driving the system's Chromium). See docs/report.md.

    from servetune.report import build_report
    build_report(store, ["my-sweep"], Path("report.html"), images=Path("img"))
"""

from __future__ import annotations

from servetune.report.build import ReportOutput, build_charts, build_report, export_images

__all__ = ["ReportOutput", "build_charts", "build_report", "export_images"]
