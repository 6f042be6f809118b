"""`servetune accept`: seed 003 §15's go-live checklist against a running deployment,
and `servetune accept-shedder`, the small load-shedding front (docs/accept.md). The
work is `servetune.accept`'s; heavy imports inside the commands."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

from servetune.cli.bench_cmd import DB_OPTION
from servetune.errors import InputError
from servetune.outfile import replaced


def register(app: typer.Typer) -> None:
    app.command("accept", help="Seed 003 §15 go-live checklist, run live against a deployment.")(
        accept
    )
    app.command("accept-shedder", help="A load-shedding front: 429 beyond N in flight.")(shedder)


def _load(value: str | None) -> tuple[str | None, float | None]:
    """`--load rate=2.5` / `--load concurrency=8`: a finite rate > 0 or a whole number of
    users >= 1, checked before any probe runs (a NaN rate would run every probe first)."""
    if not value:
        return None, None
    kind, _, num = value.partition("=")
    fix = "e.g. --load rate=2.5 (req/s) or --load concurrency=8 (users)"
    if kind not in ("rate", "concurrency"):
        raise InputError("--load", f"expected rate=R or concurrency=N, got {value!r}", fix)
    try:
        load = int(num) if kind == "concurrency" else float(num)
    except ValueError:
        what = "a whole number of users" if kind == "concurrency" else "a number"
        raise InputError("--load", f"{kind} must be {what}, got {num!r}", fix) from None
    if not math.isfinite(load) or load <= 0:
        raise InputError("--load", f"{kind} must be finite and > 0, got {num!r}", fix)
    return kind, float(load)


def accept(
    urls: list[str] = typer.Option(..., "--url", help="A replica or gateway (repeatable)."),
    engine: str = typer.Option(..., "--engine", help="vllm, llamacpp, sglang, tgi or trtllm."),
    config: str = typer.Option(None, "--config", help="The deployment's knobs (YAML)."),
    from_study: str = typer.Option(None, "--from-study", help="Use what `tune` recommended."),
    slo: str = typer.Option(None, "--slo", help="SLO file (default: the study's)."),
    workload: str = typer.Option(None, "--workload", help="The real request distribution."),
    workload_run: str = typer.Option(None, "--workload-run", help="...or a stored run's."),
    load: str = typer.Option(None, "--load", help="Tuned load: rate=R or concurrency=N."),
    max_new_tokens: int = typer.Option(
        None, "--max-new-tokens", min=1, help="The output cap the deployment promises."
    ),
    model_path: str = typer.Option(None, "--model-path", help="Served files, to hash."),
    api_keys: list[str] = typer.Option([], "--api-key", help="Repeat for per-user checks."),
    dcgm_url: str = typer.Option(None, "--dcgm-url", help="A DCGM exporter's /metrics."),
    autoscaling: str = typer.Option(None, "--autoscaling", help="HPA/KEDA/rules YAML."),
    pools: str = typer.Option(None, "--pools", help="Long/short pooling decided: shared|split."),
    fault_cmd: str = typer.Option(
        None, "--fault-cmd", help="Shell command that stops one replica (fault test)."
    ),
    gpu: bool = typer.Option(False, "--gpu", help="The deployment serves on GPUs."),
    requests: int = typer.Option(120, "--requests", min=4, help="Requests per stability stage."),
    quick: bool = typer.Option(False, "--quick", help="Small probes (minutes -> ~1 min)."),
    db: str | None = DB_OPTION,
    study: str = typer.Option(None, "--study", help="Name of the accept study its runs go in."),
    output: Path = typer.Option(None, "-o", "--output", help="Write the checklist JSON here."),
    html_out: Path = typer.Option(None, "--html", help="Write the HTML page here."),
    as_json: bool = typer.Option(False, "--json", help="Print the checklist as JSON."),
) -> None:
    """Exit code 0 only when no item fails (unchecked items are listed, not failures)."""
    from servetune.accept import Acceptance, AcceptSettings, ProbeFailed, Sizes, static
    from servetune.accept import inputs as ai
    from servetune.measure import server_software
    from servetune.results.files import check_outputs
    from servetune.store import software_info

    ai.check_engine(engine)
    check_outputs({"--output": output, "--html": html_out}, {})  # before the live checks
    if html_out is not None:  # an HTML page: not over measured data, nor named .md
        from servetune.results.files import check_replaceable

        check_replaceable(html_out, None, "--html", "html")
    if pools not in (None, "shared", "split"):
        raise InputError("--pools", f"expected shared or split, got {pools!r}")
    if config and from_study:
        raise InputError("--config", "give --config or --from-study, not both")
    load_kind, load_value = _load(load)
    model_files = ai.check_model_path(model_path)
    autoscaling_file = Path(autoscaling) if autoscaling else None
    if autoscaling_file is not None:
        static.autoscaling_docs(autoscaling_file)  # unreadable: exit 2 before any probe
    summary = ai.study_summary(db, from_study) if from_study else {}
    cfg, s_kind, s_load = ai.from_study(summary) if summary else (None, None, None)
    if config:
        cfg = ai.load_engine_config(config, engine)
    if cfg is not None and cfg.engine != engine:
        raise InputError("--engine", f"the config is for {cfg.engine}, not {engine}")
    key = api_keys[0] if api_keys else None
    seen = [ai.reach(u, key) for u in urls]  # every replica must answer
    ai.check_answering(engine, seen[0]["looks_like"], urls[0])
    spec = ai.resolve_workload(workload, workload_run, db)
    dep = ai.Deployment(
        urls=list(urls),
        engine=engine,
        served_model=seen[0].get("served_model"),
        config=cfg,
        slo=ai.resolve_slo(slo, summary),
        workload=spec,
        load_kind=load_kind or s_kind,
        load=load_value or s_load,
        study=from_study,
        study_summary=summary,
        model_path=model_files,
        api_keys=list(api_keys),
        max_new_tokens=max_new_tokens,
        dcgm_url=dcgm_url,
        autoscaling=autoscaling_file,
        pools=pools,
        fault_cmd=fault_cmd,
    )
    sizes = Sizes(stage_requests=requests)
    if quick:
        sizes = Sizes(
            warm_requests=6,
            capacity_requests=12,
            queue_seconds=6.0,
            min_queue_requests=24,
            stage_requests=min(requests, 20),
        )
    software = {"engine": engine, **software_info(), **server_software(urls[0], key)}
    settings = AcceptSettings(
        db=db, study=study, output=output, sizes=sizes, on_gpu=gpu, software=software
    )
    say = (lambda m: print(m, file=sys.stderr)) if as_json else (lambda m: print(m))
    run = Acceptance(dep, settings, say)
    if seen[0].get("max_model_len"):
        run.checklist.context["server_max_model_len"] = seen[0]["max_model_len"]
    if cfg is None:
        run.checklist.context["config_note"] = "no --config: knobs unknown"
    try:
        checklist = run.run()
    except ProbeFailed as exc:
        _write(exc.checklist.to_json(), html_out)
        where = f" and {output}" if output else ""
        print(
            f"error: accept: probe {exc.item} broke off ({exc.reason}); the partial checklist "
            f"is saved in study {run.study}{where}",
            file=sys.stderr,
        )
        raise typer.Exit(1) from None
    data = checklist.to_json()
    _write(data, html_out)
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        _print_table(data)
    raise typer.Exit(0 if checklist.ok else 1)


def _write(data: dict, html_out: Path | None) -> None:
    if html_out is not None:
        from servetune.report.accept_page import render_checklist

        with replaced(html_out, "--html") as tmp:
            tmp.write_text(render_checklist(data))


def _print_table(data: dict) -> None:
    for n, it in enumerate(data["items"], 1):
        print(f"{n:2d}. [{it['status']:>17}] {it['title']}")
        for e in it["evidence"]:
            print(f"      {e}")
        if it.get("fix"):
            print(f"      -> {it['fix']}")
        if it["runs"]:
            print(f"      runs: {', '.join(it['runs'])}")
    print(data["verdict"])


def shedder(
    upstreams: list[str] = typer.Option(..., "--upstream", help="An engine's URL (repeatable)."),
    max_in_flight: int = typer.Option(..., "--max-in-flight", min=1),
    per_key: int = typer.Option(None, "--per-key", min=1, help="In flight per API key."),
    port: int = typer.Option(8088, "--port", min=1, max=65535),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1, help="Cap every request's output."),
) -> None:
    from servetune.accept.shedder import serve

    serve(upstreams, max_in_flight, per_key, port, max_tokens)
