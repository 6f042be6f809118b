"""`servetune bench` (load-test a real OpenAI-compatible server) and `servetune mock-server`.

Thin layer: parse the flags into `measure.BenchSettings`, call `measure.run_bench`, and
show what it reports (progress, client warnings, the summary table or JSON). Heavy
imports happen inside the commands so `servetune --help` stays fast. The store options
and the number lists are shared with `simulate`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.measure import StoreSettings

# The experiment store, as bench and simulate take it (docs/store.md).
DB_OPTION = typer.Option(
    None, "--db", help="Store: file path or SQLAlchemy URL (default $SERVETUNE_DB, ./servetune.db)."
)
NO_STORE_OPTION = typer.Option(False, "--no-store", help="Do not record the runs in the store.")
INPUT_LEN_OPTION = typer.Option(
    None, "--input-len", help="Every prompt this many tokens (the workload's lengths replaced)."
)
OUTPUT_LEN_OPTION = typer.Option(
    None, "--output-len", help="Every reply this many tokens (the workload's lengths replaced)."
)
STUDY_OPTION = typer.Option(None, "--study", help="Store the runs in this study (sweep: auto).")
TAG_OPTION = typer.Option([], "--tag", help="Tag the stored runs (repeatable).")


def numbers(value: str | None, flag: str, cast: type) -> tuple:
    """A comma-separated list of positive numbers (--rate 1,2,4); () when not given (an
    empty value, `--rate ""`, is refused below: it is not "not given")."""
    if value is None:
        return ()
    items = value.split(",")
    if value.strip() and any(not v.strip() for v in items):  # 1,,2: a value lost in typing
        raise InputError(flag, f"{value!r} has an empty item", "e.g. 1,2,4")
    try:
        out = [cast(v) for v in items if v.strip()]
    except ValueError:
        raise InputError(
            flag, f"{value!r} is not a comma-separated list of numbers", "e.g. 1,2,4"
        ) from None
    if not out or any(not math.isfinite(v) or v <= 0 for v in out):
        raise InputError(flag, f"{value!r}: values must be finite and > 0", "e.g. 1,2,4")
    return tuple(out)


def _at_least(low: float) -> Callable[[float], bool]:
    return lambda x: x >= low


def _positive(x: float) -> bool:
    return x > 0


def _share(x: float) -> bool:
    return 0 <= x <= 1


# What each numeric flag of bench (and simulate: --count, --duration) allows.
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "--count": (_at_least(1), "a request count >= 1"),
    "--duration": (_positive, "seconds > 0"),
    "--max-concurrency": (_at_least(1), "a number of requests >= 1"),
    "--workers": (_at_least(1), "a number of processes >= 1"),
    "--connect-timeout": (_positive, "seconds > 0"),
    "--ttft-timeout": (_positive, "seconds > 0"),
    "--idle-timeout": (_positive, "seconds > 0"),
    "--total-timeout": (_positive, "seconds > 0"),
    "--cancel-fraction": (_share, "a share from 0 to 1"),
    "--cancel-after": (_at_least(1), "a number of chunks >= 1"),
    "--breaker": (_share, "an error rate from 0 to 1; 0 turns it off"),
}


def check_ranges(values: dict[str, float | None]) -> None:
    """Refuse, in one line naming the flag and what it allows, a value given that is
    not finite or outside its range (`RANGES`)."""
    for flag, value in values.items():
        ok, allowed = RANGES[flag]
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise InputError(flag, f"{value:g} is not allowed", f"give {allowed}")


def store_settings(
    kind: str, db: str | None, no_store: bool, study: str | None, tags: list[str]
) -> StoreSettings | None:
    """The store options as bench and simulate take them (None: --no-store)."""
    from servetune.measure import StoreSettings

    if db is not None and not db.strip():  # `--db ""` (an unset variable) is not the default
        raise InputError("--db", "is empty", "give a file path or URL, or --no-store")
    if no_store:
        return None
    check_names(study, tags)
    return StoreSettings(db, kind, study, tuple(tags))


def check_names(study: str | None, tags: list[str]) -> None:
    """`--study` longer than the store keeps and a `--tag` that is not one word of a length
    it keeps (`store.models.check_tag`), refused before anything is measured (the store
    would refuse a long one at the first run, and store nothing)."""
    from servetune.store.models import Study, check_length, check_tag

    check_length("--study", study, Study.name)
    for t in tags:
        check_tag("--tag", t)


def bench(
    url: str = typer.Option(..., "--url", help="Server base URL, e.g. http://127.0.0.1:8000"),
    workload: Path | None = typer.Option(None, "--workload", "-w", help="Workload YAML."),
    rate: str | None = typer.Option(None, "--rate", help="Open-loop rates to sweep, req/s: 1,2,4"),
    concurrency: str | None = typer.Option(None, "--concurrency", help="Closed-loop users: 1,8,32"),
    max_concurrency: int | None = typer.Option(None, "--max-concurrency", help="Cap with --rate."),
    count: int | None = typer.Option(None, "--count", help="Requests per point."),
    input_len: int | None = INPUT_LEN_OPTION,
    output_len: int | None = OUTPUT_LEN_OPTION,
    duration: float | None = typer.Option(None, "--duration", help="Seconds per point."),
    slo_file: Path | None = typer.Option(None, "--slo", help="SLO YAML (goodput, pass/fail)."),
    model: str | None = typer.Option(None, "--model", help="Model name sent to the server."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="tokenizer.json / HF dir, `server` (/tokenize) or `word`."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="RunResult JSON (raw records)."
    ),
    csv_path: Path | None = typer.Option(None, "--csv", help="Per-request CSV."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
    workers: int | None = typer.Option(None, "--workers", help="Sender processes (auto)."),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="s"),
    ttft_timeout: float = typer.Option(120.0, "--ttft-timeout", help="s"),
    idle_timeout: float = typer.Option(60.0, "--idle-timeout", help="s between chunks"),
    total_timeout: float = typer.Option(1800.0, "--total-timeout", help="s per request"),
    cancel_fraction: float = typer.Option(0.0, "--cancel-fraction", help="Drop this share..."),
    cancel_after: int = typer.Option(4, "--cancel-after", help="...after this many chunks."),
    breaker: float = typer.Option(0.5, "--breaker", help="Stop above this error rate (0: off)."),
    scrape: bool = typer.Option(True, "--scrape/--no-scrape", help="Scrape /metrics every 1 s."),
    telemetry: bool = typer.Option(
        True, "--telemetry/--no-telemetry", help="Sample host, engine process and GPU every 1 s."
    ),
    telemetry_url: str | None = typer.Option(
        None, "--telemetry-url", help="Also read this /metrics (a DCGM exporter) every 1 s."
    ),
    engine: str | None = typer.Option(
        None, "--engine", help="vllm, llamacpp, ...: map /metrics to canonical names."
    ),
    continuous_usage: bool = typer.Option(
        False, "--continuous-usage", help="Ask vLLM for per-chunk usage (multi-token chunks)."
    ),
    save_text: bool = typer.Option(False, "--save-text", help="Keep output text in -o."),
    api_key_env: str = typer.Option(
        "OPENAI_API_KEY", "--api-key-env", help="Env var holding the API key (never stored)."
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="Knob the server runs with, recorded (not applied); needs --engine."
    ),
    launch_command: str | None = typer.Option(
        None, "--launch-command", help="The server's exact launch command, recorded."
    ),
    db: str | None = DB_OPTION,
    no_store: bool = NO_STORE_OPTION,
    study: str | None = STUDY_OPTION,
    tags: list[str] = TAG_OPTION,
) -> None:
    """Load-test an OpenAI-compatible server: exact TTFT/TPOT/ITL/E2E, goodput, sweeps."""
    import json

    from rich.console import Console

    from servetune.bench.client import Timeouts
    from servetune.bench.live import live_view
    from servetune.bench.progress import summary_table, ttft_split, ttft_split_table
    from servetune.cli.engine_cmd import parse_sets
    from servetune.engines.registry import ADAPTERS, exports_metrics
    from servetune.measure import BenchSettings, Hooks, ResultFiles, SweepLoads, run_bench
    from servetune.metrics import (
        cap_note,
        resent_note,
        schedule_note,
        token_count_note,
        tpot_note,
        window_note,
    )
    from servetune.results.files import check_outputs
    from servetune.status import RunStatus
    from servetune.telemetry import telemetry_options

    check_outputs({"--output": output, "--csv": csv_path}, {})  # before the run
    if rate and concurrency:
        raise InputError("--rate", "give --rate or --concurrency, not both", None)
    check_ranges(
        {"--count": count, "--duration": duration, "--max-concurrency": max_concurrency,
         "--workers": workers, "--connect-timeout": connect_timeout,
         "--ttft-timeout": ttft_timeout, "--idle-timeout": idle_timeout,
         "--total-timeout": total_timeout, "--cancel-fraction": cancel_fraction,
         "--cancel-after": cancel_after, "--breaker": breaker}
    )  # fmt: skip
    if sets and not engine:
        raise InputError("--set", "knobs need --engine (vllm, llamacpp, ...)", None)
    settings = BenchSettings(
        url=url,
        config=parse_sets(engine, sets) if engine and sets else None,
        loads=SweepLoads(
            numbers(rate, "--rate", float), numbers(concurrency, "--concurrency", int),
            count, duration, input_len, output_len,
        ),
        workload=workload,
        max_concurrency=max_concurrency,
        slo=slo_file,
        model=model,
        tokenizer=tokenizer,
        files=ResultFiles(output, csv_path, save_text=save_text),
        store=store_settings("bench", db, no_store, study, tags),
        workers=workers,
        timeouts=Timeouts(connect_timeout, ttft_timeout, idle_timeout, total_timeout),
        cancel_fraction=cancel_fraction,
        cancel_after_chunks=cancel_after,
        breaker_error_rate=breaker or None,
        scrape=scrape,
        telemetry=telemetry_options(telemetry, telemetry_url),
        engine=engine,
        launch_command=launch_command,
        continuous_usage=continuous_usage,
        api_key=os.environ.get(api_key_env) or None,
    )  # fmt: skip
    err = Console(stderr=True)

    def ready(_: Any) -> None:
        if tokenizer is None:
            err.print(
                "[yellow]note:[/] no --tokenizer: prompts are common English words counted "
                "one token each (most tokenizers agree; --tokenizer server counts exactly)"
            )
        if engine in ADAPTERS and not exports_metrics(engine):
            err.print(f"[yellow]note:[/] {engine} exports no /metrics: every figure is client-side")

    def point(p: Any, res: Any) -> None:
        for w in res.client.warnings:
            err.print(f"[bold red]CLIENT BOTTLENECK ({p.label}):[/] {w}")
        if res.status != RunStatus.COMPLETED:
            err.print(f"[bold red]{p.label}: {res.status}[/] {res.stop_reason or ''}")
        # usage against whitespace words (no --tokenizer) differs on every real output
        tokens = token_count_note(res.metrics) if tokenizer is not None else None
        m = res.metrics
        notes = (window_note(m), schedule_note(m, res.load), cap_note(m, res.load), tokens)
        for note in (*notes, tpot_note(m), resent_note(res.records)):
            if note is not None:
                err.print(f"[yellow]note ({p.label}):[/] {note}", highlight=False)

    live = live_view(err, url, engine) if not as_json else None  # off when piped
    try:
        results = run_bench(settings, Hooks(ready=ready, point=point, say=say_line, live=live))
    finally:
        if live is not None:
            live.shutdown()
    if as_json:
        from servetune.metrics.turns import session_fields

        payload = [
            {"id": r.id, "load": r.load.model_dump(), "status": r.status,
             "client": r.client.model_dump(), "metrics": r.metrics.model_dump(),
             "cancellation": r.cancellation,
             "server_deltas": r.server.deltas if r.server else None,
             "ttft_split_ms": ttft_split(r) or None, **session_fields(r)}
            for r in results
        ]  # fmt: skip
        typer.echo(json.dumps(payload if settings.loads.many else payload[0], indent=2))
    else:
        from servetune.cli.render import print_tables

        print_tables(summary_table(results), ttft_split_table(results))
        from servetune.bench.progress import load_label
        from servetune.metrics.turns import session_line

        for r in results:  # multi-turn workloads: follow-up TTFT and prefix-cache hit rates
            if (line := session_line(r)) is not None:
                typer.echo(f"{load_label(r)}: {line}")
    if any(r.status == RunStatus.INTERRUPTED for r in results):
        raise typer.Exit(130)
    failed = next(
        (r for r in results if r.status in (RunStatus.FAILED, RunStatus.CIRCUIT_BREAKER)), None
    )
    if failed is not None:  # nothing reached the server, or the breaker stopped the sweep:
        typer.echo(f"error: {failed.stop_reason}", err=True)  # what was measured is kept
        raise typer.Exit(1)


def say_line(line: str) -> None:
    """One line on stderr, never wrapped (store notes)."""
    typer.echo(line, err=True)


def mock_server(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    ttft_ms: float = typer.Option(5.0, "--ttft-ms"),
    itl_ms: float = typer.Option(1.0, "--itl-ms"),
    jitter_ms: float = typer.Option(0.0, "--jitter-ms", help="Normal jitter on TTFT and ITL."),
    tokens_per_chunk: int = typer.Option(1, "--tokens-per-chunk"),
    output_tokens: int | None = typer.Option(
        None, "--output-tokens", help="Own answer length; a smaller max_tokens stops it."
    ),
    fault: list[str] = typer.Option(
        [], "--fault", help="name=probability, e.g. http_500=0.1; a bare name: every request."
    ),
    close_after_response: bool = typer.Option(False, "--close-after-response"),
    buffer_stream: bool = typer.Option(
        False, "--buffer-stream", help="Send all chunks at the end (a buffering server)."
    ),
    leak_cancelled: bool = typer.Option(
        False, "--leak-cancelled", help="Never free a disconnected request (diagnose demo)."
    ),
) -> None:
    """Run the mock OpenAI server (tests, fault injection, client-ceiling measurement)."""
    from servetune.mock.server import FAULTS, MockConfig, serve_forever

    faults: dict[str, float] = {}
    for f in fault:
        name, _, p = f.partition("=")
        if name not in FAULTS:
            raise InputError("--fault", f"unknown fault {name!r}", f"one of {', '.join(FAULTS)}")
        try:
            faults[name] = float(p or 1.0)
        except ValueError:
            raise InputError("--fault", f"bad probability in {f!r}", "e.g. stall=0.05") from None
    cfg = MockConfig(
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        ttft_jitter_ms=jitter_ms,
        itl_jitter_ms=jitter_ms,
        tokens_per_chunk=tokens_per_chunk,
        output_tokens=output_tokens,
        faults=faults,
        close_after_response=close_after_response,
        buffer_stream=buffer_stream,
        leak_cancelled=leak_cancelled,
    )
    serve_forever(cfg, host, port)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("mock-server")(mock_server)
