"""`servetune bench` (load-test a real OpenAI-compatible server) and `servetune mock-server`.

Thin layer: parse flags, load the workload and SLO, call `bench.runner`, print, write
the files and the experiment store. Heavy imports happen inside the commands so
`servetune --help` stays fast. The store options are shared with `simulate`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.engines.config import EngineConfig
    from servetune.slo import SLO
    from servetune.store import RunMeta

# The experiment store, as bench and simulate take it (docs/store.md).
DB_OPTION = typer.Option(
    None, "--db", help="Store: file path or SQLAlchemy URL (default $SERVETUNE_DB, ./servetune.db)."
)
NO_STORE_OPTION = typer.Option(False, "--no-store", help="Do not record the runs in the store.")
STUDY_OPTION = typer.Option(None, "--study", help="Store the runs in this study (sweep: auto).")
TAG_OPTION = typer.Option([], "--tag", help="Tag the stored runs (repeatable).")

DEFAULT_WORKLOAD = {
    "name": "default-chat",
    "count": 200,
    "arrival": {"kind": "poisson", "rate": 1.0},
    "input_tokens": {"dist": "lognormal", "mean": 512, "sigma": 0.5, "min": 16, "max": 4096},
    "output_tokens": {"dist": "lognormal", "mean": 128, "sigma": 0.5, "min": 8, "max": 1024},
}


def _numbers(value: str | None, flag: str, cast: type) -> list:
    if not value:
        return []
    try:
        out = [cast(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InputError(
            flag, f"{value!r} is not a comma-separated list of numbers", "e.g. 1,2,4"
        ) from None
    if not out or any(v <= 0 for v in out):
        raise InputError(flag, "values must be > 0", "e.g. 1,2,4")
    return out


def _point_path(base: Path, label: str, many: bool) -> Path:
    return base if not many else base.with_name(f"{base.stem}-{label}{base.suffix or '.json'}")


def bench(
    url: str = typer.Option(..., "--url", help="Server base URL, e.g. http://127.0.0.1:8000"),
    workload: Path | None = typer.Option(None, "--workload", "-w", help="Workload YAML."),
    rate: str | None = typer.Option(None, "--rate", help="Open-loop rates to sweep, req/s: 1,2,4"),
    concurrency: str | None = typer.Option(None, "--concurrency", help="Closed-loop users: 1,8,32"),
    max_concurrency: int | None = typer.Option(None, "--max-concurrency", help="Cap with --rate."),
    count: int | None = typer.Option(None, "--count", help="Requests per point."),
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
    from servetune.bench.output import ResultStore, write_csv, write_result
    from servetune.bench.progress import LiveProgress, summary_table, ttft_split, ttft_split_table
    from servetune.bench.runner import BenchInterrupted, BenchOptions, run_point
    from servetune.bench.server_metrics import engine_adapter, http_fetcher
    from servetune.cli.engine_cmd import parse_sets
    from servetune.slo import load_slo
    from servetune.workload.materialize import materialize
    from servetune.workload.spec import load_workload, parse_workload
    from servetune.workload.tokenizer import WordTokenizer, load_tokenizer

    if rate and concurrency:
        raise InputError("--rate", "give --rate or --concurrency, not both", None)
    if sets and not engine:
        raise InputError("--set", "knobs need --engine (vllm, llamacpp, ...)", None)
    config = parse_sets(engine, sets) if engine and sets else None
    rates = _numbers(rate, "--rate", float)
    users = _numbers(concurrency, "--concurrency", int)
    swept = bool(rates or users)
    spec = (
        load_workload(workload, swept=swept)
        if workload
        else parse_workload(DEFAULT_WORKLOAD, swept=swept)
    )
    slo = load_slo(slo_file) if slo_file else None
    tok = load_tokenizer(tokenizer, url)
    err = Console(stderr=True)
    if isinstance(tok, WordTokenizer) and tokenizer is None:
        err.print(
            "[yellow]note:[/] no --tokenizer: prompt lengths use whitespace words, not tokens"
        )
    points: list[tuple[str, dict]] = [(f"rate{r:g}", {"rate": r}) for r in rates]
    points += [(f"conc{u}", {"concurrency": u}) for u in users]
    if not points:
        points = [("point", {})]
    if max_concurrency is not None:
        points = [
            (lbl, {**kw, "concurrency": kw.get("concurrency", max_concurrency)})
            for lbl, kw in points
        ]

    fetch = http_fetcher(url, engine_adapter(engine) if engine else None) if scrape else None
    results = []
    progress = LiveProgress(err) if not as_json else None
    many = len(points) > 1
    api_key = os.environ.get(api_key_env) or None
    store = None
    if not no_store:
        store = ResultStore.open(
            db, kind="bench", study=study, tags=tags, sweep=many, files=bool(output), say=_say
        )
    if store is not None:
        store.meta = _bench_meta(url, api_key, engine, config, launch_command, slo)
    try:
        for label, kw in points:
            try:
                pspec = spec.with_load(count=count, duration_s=duration, **kw)
            except ValueError as exc:
                raise InputError("--concurrency", str(exc), None) from None
            requests = materialize(pspec, tok)
            out_path = _point_path(output, label, many) if output else None
            opts = BenchOptions(
                url=url,
                api_key=api_key,
                model=model,
                timeouts=Timeouts(connect_timeout, ttft_timeout, idle_timeout, total_timeout),
                workers=workers,
                save_text=save_text,
                continuous_usage=continuous_usage,
                cancel_fraction=cancel_fraction,
                cancel_after_chunks=cancel_after,
                breaker_error_rate=breaker or None,
                records_path=out_path.with_suffix(".records.jsonl") if out_path else None,
                metrics_fetch=fetch,
                tokenizer=tok,
                progress=progress,
                store=store,
            )
            try:
                res = run_point(pspec, requests, opts, slo, label)
            except BenchInterrupted as exc:
                res = exc.result
            finally:
                if progress is not None:
                    progress.close()
            results.append(res)
            if out_path:
                write_result(res, out_path, save_text)
            for w in res.client.warnings:
                err.print(f"[bold red]CLIENT BOTTLENECK ({label}):[/] {w}")
            if res.status != "completed":
                err.print(f"[bold red]{label}: {res.status}[/] {res.stop_reason or ''}")
                break
    finally:
        if csv_path and results:
            write_csv(results, csv_path)
        if store is not None:
            store.close(sys.exc_info()[1])  # the error or Ctrl-C under way, if any
    if as_json:
        payload = [
            {"id": r.id, "load": r.load, "status": r.status, "client": r.client.model_dump(),
             "metrics": r.metrics.model_dump(), "cancellation": r.cancellation,
             "server_deltas": r.server.deltas if r.server else None,
             "ttft_split_ms": ttft_split(r) or None}
            for r in results
        ]  # fmt: skip
        typer.echo(json.dumps(payload if many else payload[0], indent=2))
    else:
        Console().print(summary_table(results))
        split = ttft_split_table(results)
        if split is not None:
            Console().print(split)
    if any(r.status == "interrupted" for r in results):
        raise typer.Exit(130)


def _say(line: str) -> None:
    """One line on stderr, never wrapped (store notes)."""
    typer.echo(line, err=True)


def server_software(url: str, api_key: str | None = None) -> dict[str, Any]:
    """The engine's version as the server reports it: vLLM's /version, llama.cpp's /props
    `build_info`. Best effort, 2 s: {} when the server says neither."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    for path, key in (("/version", "version"), ("/props", "build_info")):
        try:
            r = httpx.get(base + path, headers=headers, timeout=2.0)
            version = r.json().get(key) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        if version:
            return {"engine_version": str(version)}
    return {}


def _bench_meta(
    url: str,
    api_key: str | None,
    engine: str | None,
    config: EngineConfig | None,
    launch_command: str | None,
    slo: SLO | None,
) -> RunMeta:
    """What bench knows about every run: this host, the engine (and its config only when
    given with --set: never guessed), the launch command when given, the SLO."""
    from servetune.store import RunMeta, host_info, software_info

    software = software_info() | server_software(url, api_key)
    if engine:
        software["engine"] = engine
    return RunMeta(
        backend="real",
        engine_config=config.model_dump(mode="json") if config is not None else None,
        launch_command=launch_command,
        hardware=host_info(),
        software=software,
        slo=slo.model_dump(mode="json") if slo is not None else None,
    )


def mock_server(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    ttft_ms: float = typer.Option(5.0, "--ttft-ms"),
    itl_ms: float = typer.Option(1.0, "--itl-ms"),
    jitter_ms: float = typer.Option(0.0, "--jitter-ms", help="Normal jitter on TTFT and ITL."),
    tokens_per_chunk: int = typer.Option(1, "--tokens-per-chunk"),
    output_tokens: int | None = typer.Option(None, "--output-tokens", help="Default: max_tokens."),
    fault: list[str] = typer.Option([], "--fault", help="name=probability, e.g. http_500=0.1"),
    close_after_response: bool = typer.Option(False, "--close-after-response"),
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
    )
    serve_forever(cfg, host, port)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("mock-server")(mock_server)
