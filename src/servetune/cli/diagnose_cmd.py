"""`servetune diagnose RUN|FILE|--url URL`: seed 003 §13's symptoms and the seeds' ordered
actions for a stored run, a RunResult file, or a live deployment watched for a window."""

from __future__ import annotations

import typer

from servetune.cli.bench_cmd import DB_OPTION
from servetune.errors import InputError


def register(app: typer.Typer) -> None:
    app.command(
        "diagnose",
        help="What is wrong with a run (or a live server) and what to change first.",
    )(diagnose)


def diagnose(
    run: str | None = typer.Argument(None, help="Run id, or a RunResult JSON file."),
    url: str | None = typer.Option(
        None, "--url", help="Watch a live server's /metrics for --window seconds instead."
    ),
    window: float | None = typer.Option(
        None, "--window", help="Seconds to watch with --url (default 30)."
    ),
    engine: str | None = typer.Option(
        None, "--engine", help="With --url: vllm, llamacpp, ... (canonical metric names)."
    ),
    telemetry_url: str | None = typer.Option(
        None, "--telemetry-url", help="With --url: a DCGM exporter or other /metrics to read."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
    db: str | None = DB_OPTION,
) -> None:
    """Print the findings, worst first, each with its trigger and ordered actions."""
    import json

    from servetune.diagnose import diagnose_result, load_run, render, watch

    if (run is None) == (url is None):
        raise InputError("RUN", "give a run id or file, or --url", "servetune diagnose --help")
    live_only = {"--window": window, "--engine": engine, "--telemetry-url": telemetry_url}
    given = [flag for flag, v in live_only.items() if v is not None]
    if url is None and given:
        raise InputError(given[0], "only applies with --url", "drop it for a stored run or file")
    if url is not None:
        d = watch(url, 30.0 if window is None else window, engine, telemetry_url)
    else:
        res, source = load_run(run or "", db)
        d = diagnose_result(res, source)
    if as_json:
        typer.echo(json.dumps(d.to_json(), indent=2, default=str))
    else:
        typer.echo("\n".join(render(d)))
