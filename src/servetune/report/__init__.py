"""`servetune report`: one offline HTML file (plotly.js embedded once) for a run, a
study or a list of runs — the verdict first (a tune study's winner, margin, launch
command and how sure), configs named by what differs, capacity per config with its
interval, the binding SLO, latency vs load with SLO lines and goodput, the seed 000 §3.1
sweet spot, the Pareto front, percentile CDFs, server metrics over time, sim-vs-real,
the memory picture by each engine's own KV rule, and the seed 003 §16 record; every
percentile with its sample size — plus PNG/SVG export of each chart (kaleido, driving the
system's Chromium). Sections: `report.sections`. See docs/report.md.

    from servetune.report import build_report
    build_report(store, ["my-sweep"], Path("report.html"), images=Path("img"))
"""

from servetune.lazy import lazy_exports as _lazy_exports

# The builder loads on first use: `runs list/show` print the seed 003 §16 record
# (`report.experiment`) and must not pay for the charts and the planner.
_WHERE = dict.fromkeys(["ReportOutput", "build_charts", "build_report", "export_images"], "build")
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
