"""Assemble a report: read the runs, draw the charts, write the HTML (and images)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servetune.errors import InputError
from servetune.outfile import replaced
from servetune.report import charts as ch
from servetune.report.data import ReportData, load_report_data
from servetune.report.html import render_html
from servetune.report.sections import build_sections
from servetune.report.verdict import verdict
from servetune.results import files
from servetune.results.files import sqlite_file
from servetune.store import Store

IMAGE_FORMATS = ("png", "svg")


@dataclass
class ReportOutput:
    path: Path
    bytes: int
    charts: list[str]  # drawn
    skipped: dict[str, str]  # key -> why
    images: list[Path] = field(default_factory=list)
    headline: str = ""  # the verdict box's first line


def build_charts(data: ReportData) -> list[ch.Chart]:
    """The report's sections that apply to `data` (`report.sections.SECTIONS`)."""
    return build_sections(data)


def _need_plotly() -> None:
    try:
        import plotly  # noqa: F401
    except ImportError as exc:
        raise InputError(
            "report", "plotly is not installed", "pip install 'servetune[report]'"
        ) from exc


def check_replaceable(out: Path, db_file: str | None, flag: str = "--output") -> None:
    """The report's `-o` check (`results.files.check_replaceable` for an HTML report): the
    store's database is refused, an earlier report or an empty file replaced. `flag` is
    the option that gave `out` (`tune` calls it --report)."""
    files.check_replaceable(out, db_file, flag, "html")


def image_formats(image_format: str | None, images: Path | None) -> list[str]:
    """The `--image-format` list (png by default). It means nothing without `--images`,
    so giving it alone is refused rather than silently ignored."""
    if image_format is None:
        return ["png"]
    if images is None:
        raise InputError("--image-format", "needs --images DIR")
    formats = [f.strip().lower() for f in image_format.split(",") if f.strip()]
    if not formats or set(formats) - set(IMAGE_FORMATS):
        raise InputError("--image-format", f"{image_format!r}: use png, svg or png,svg")
    return formats


def build_report(
    store: Store,
    refs: Sequence[str],
    out: Path,
    *,
    title: str | None = None,
    images: Path | None = None,
    image_format: str | None = None,
    flag: str = "--output",
) -> ReportOutput:
    """Write the HTML report for `refs` to `out` (atomically) and, with `images`, each
    chart as PNG or SVG into that folder. `flag` names `out`'s option in errors."""
    _need_plotly()
    if not out.parent.is_dir():
        raise InputError(flag, f"folder {out.parent} does not exist")
    check_replaceable(out, sqlite_file(store), flag)
    formats = image_formats(image_format, images)
    data = load_report_data(store, refs, title)
    charts = build_charts(data)
    text = render_html(data, charts)
    with replaced(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    result = ReportOutput(
        path=out,
        bytes=out.stat().st_size,
        charts=[c.key for c in charts if c.fig is not None],
        skipped={c.key: c.note for c in charts if c.fig is None},
        headline=verdict(data).headline,
    )
    if images is not None:
        result.images = export_images(charts, images, *formats)
    return result


def export_images(charts: Sequence[ch.Chart], folder: Path, *formats: str) -> list[Path]:
    """Each drawn chart as `<key>.<fmt>` for each format (default png), in one browser
    session (kaleido + Chromium).
    kaleido finds Chrome/Chromium itself; Debian's `chromium` is pointed at explicitly."""
    try:
        import kaleido
    except ImportError as exc:
        raise InputError(
            "--images", "PNG/SVG export needs kaleido", "pip install 'servetune[report]'"
        ) from exc
    if "BROWSER_PATH" not in os.environ:
        found = shutil.which("chromium") or shutil.which("chromium-browser")
        if found:
            os.environ["BROWSER_PATH"] = found
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [
        {
            "fig": c.fig,
            "path": str(folder / f"{c.key}.{fmt}"),
            "opts": {"format": fmt, "width": 1200, "height": c.fig.layout.height or 500},
        }
        for c in charts
        if c.fig is not None
        for fmt in formats or ("png",)
    ]
    try:
        kaleido.write_fig_from_object_sync(jobs)
    except Exception as exc:  # kaleido/choreographer raise their own types
        if "Chrome" in type(exc).__name__ or "browser" in str(exc).lower():
            raise InputError(
                "--images",
                f"no usable Chrome/Chromium for the export ({type(exc).__name__})",
                "apt-get install chromium (scripts/services.sh chromium) or set BROWSER_PATH",
            ) from exc
        raise
    return [Path(j["path"]) for j in jobs]
