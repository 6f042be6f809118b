"""`servetune report`: one offline HTML file (plotly.js embedded once) for a run, a
study or a list of runs — latency vs load with SLO lines and goodput, the seed 000 §3.1
sweet spot, the Pareto front, percentile CDFs, server metrics over time, sim-vs-real,
the memory breakdown from `plan`, and the seed 003 §16 record — plus PNG/SVG export of
each chart (kaleido, driving the system's Chromium). See docs/report.md.

    from servetune.report import build_report
    build_report(store, ["my-sweep"], Path("report.html"), images=Path("img"))
"""

from servetune.lazy import lazy_exports as _lazy_exports

# The builder loads on first use: `runs list/show` print the seed 003 §16 record
# (`report.experiment`) and must not pay for the charts and the planner.
_WHERE = dict.fromkeys(["ReportOutput", "build_charts", "build_report", "export_images"], "build")
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
