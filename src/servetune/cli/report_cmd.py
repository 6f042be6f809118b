"""`servetune report RUN|STUDY|A,B,... -o report.html`: the offline HTML report (and
PNG/SVG charts). plotly and sqlalchemy are imported inside the command."""

from __future__ import annotations

from pathlib import Path

import typer

from servetune.cli.bench_cmd import DB_OPTION
from servetune.errors import InputError


def register(app: typer.Typer) -> None:
    app.command(
        "report",
        help="One offline HTML report for a run, a study or A,B,C (charts + §16 record).",
    )(report)


def report(
    refs: list[str] = typer.Argument(..., help="Run ids, study names, or A,B,C lists."),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="HTML file."),
    title: str | None = typer.Option(None, "--title"),
    images: Path | None = typer.Option(
        None, "--images", help="Also write each chart into this folder (PNG or SVG)."
    ),
    image_format: str | None = typer.Option(
        None, "--image-format", help="png (default), svg or png,svg; with --images."
    ),
    db: str | None = DB_OPTION,
) -> None:
    """Write the report and say what was drawn and what was not (and why)."""
    from servetune.report import build_report
    from servetune.results.files import check_outputs
    from servetune.store import Store

    # an unset shell variable names no run, nor `$A,$B` with both unset (`,`)
    if any(not r.replace(",", "").strip() for r in refs):
        raise InputError("RUNS", "an empty value names nothing", "give a run id, study or A,B,C")
    check_outputs({"--output": output}, {"--images": images})
    with Store.open(db, create=False) as store:
        out = build_report(
            store, refs, output, title=title, images=images, image_format=image_format
        )
    typer.echo(f"wrote {out.path} ({out.bytes / 2**20:.1f} MiB, {len(out.charts)} charts)")
    typer.echo(f"  {out.headline}")
    for key, why in out.skipped.items():
        typer.echo(f"  not drawn: {key}: {why}")
    for p in out.images:
        typer.echo(f"  image: {p}")
