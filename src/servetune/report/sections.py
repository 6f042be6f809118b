"""The report's sections, in the order they appear: each a function of the report's data
that returns a Chart (drawn, or a note saying why not) or None when the section does not
apply to this kind of report (the tuning charts on a bench report). A new section is one
more builder in SECTIONS (`register`), e.g. host telemetry over time."""

from __future__ import annotations

from collections.abc import Callable

from servetune.report import charts, memory, telemetry_section, tuning
from servetune.report.charts import Chart
from servetune.report.data import ReportData

SectionBuilder = Callable[[ReportData], Chart | None]

SECTIONS: list[SectionBuilder] = [
    tuning.capacity,
    tuning.sim_vs_measured,
    tuning.binding,
    charts.latency_vs_load,
    charts.sweet_spot,
    charts.pareto,
    charts.cdfs,
    charts.server_metrics,
    telemetry_section.telemetry,
    charts.sim_vs_real,
    memory.memory,
]


def register(builder: SectionBuilder, before: SectionBuilder | None = None) -> None:
    """Add a section (once), before `before` or at the end."""
    if builder in SECTIONS:
        return
    SECTIONS.insert(SECTIONS.index(before) if before in SECTIONS else len(SECTIONS), builder)


def build_sections(data: ReportData) -> list[Chart]:
    """Every section that applies to `data`, in order."""
    return [c for c in (b(data) for b in SECTIONS) if c is not None]
