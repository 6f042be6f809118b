"""`servetune monitor export`: Prometheus rules, a Grafana dashboard and KEDA / HPA
manifests from a tuned study (its measured capacity) or a deployment described by hand."""

from __future__ import annotations

import typer

from servetune.cli.bench_cmd import DB_OPTION
from servetune.errors import InputError

monitor_app = typer.Typer(help="Monitoring and autoscaling for a tuned deployment.")


def register(app: typer.Typer) -> None:
    app.add_typer(monitor_app, name="monitor")


def _replicas(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        return int(lo), int(hi if sep else lo)
    except ValueError:
        raise InputError("--replicas", f"{text!r} is not MIN:MAX", "e.g. --replicas 1:4") from None


@monitor_app.command("export")
def export_cmd(
    out: str = typer.Option("monitoring", "-o", "--out", help="Folder to write into."),
    from_study: str | None = typer.Option(
        None, "--from-study", help="A tuned study: engine, SLO and limits from its winner."
    ),
    engine: str | None = typer.Option(
        None, "--engine", help="vllm, sglang, tgi, llamacpp, onnx (needed without --from-study)."
    ),
    slo: str | None = typer.Option(None, "--slo", help="SLO file (default: the study's)."),
    replicas: str = typer.Option("1:4", "--replicas", help="MIN:MAX replicas."),
    queue_target: float | None = typer.Option(
        None, "--queue-target", help="Pending requests per replica (default: measured)."
    ),
    kv_threshold: float | None = typer.Option(
        None, "--kv-threshold", help="KV usage 0..1 that scales out (default: measured)."
    ),
    name: str = typer.Option("llm", "--name", help="Kubernetes Deployment name."),
    namespace: str = typer.Option("default", "--namespace"),
    job: str = typer.Option("servetune-engine", "--job", help="Prometheus scrape job."),
    scrape_interval: str = typer.Option(
        "1m",
        "--scrape-interval",
        help="How often Prometheus scrapes the replicas (its default: 1m).",
    ),
    rate_window: str | None = typer.Option(
        None,
        "--rate-window",
        help="PromQL rate() window (default: 4x --scrape-interval, the least that survives "
        "a missed scrape).",
    ),
    prometheus_url: str = typer.Option(
        "http://prometheus.monitoring.svc:9090",
        "--prometheus-url",
        help="The Prometheus KEDA queries: http(s)://HOST[:PORT].",
    ),
    db: str | None = DB_OPTION,
) -> None:
    """Write prometheus-rules.yaml, grafana-dashboard.json, keda-scaledobject.yaml, hpa.yaml."""
    from pathlib import Path

    from servetune.monitor import export, from_description
    from servetune.monitor import from_study as study_deployment
    from servetune.monitor.deployment import (
        check_limits,
        check_prometheus_url,
        check_rate_window,
        rate_note,
        rate_window_for,
    )
    from servetune.results.files import check_folder
    from servetune.slo import load_slo

    check_folder(Path(out), "--out")  # before the study is read or a file written
    lo, hi = _replicas(replicas)
    check_limits(queue_target, kv_threshold)  # before the study is read
    check_prometheus_url(prometheus_url)
    window = rate_window or rate_window_for(scrape_interval)
    check_rate_window(window, scrape_interval)
    kw = {
        "slo": load_slo(slo) if slo else None,
        "queue_target": queue_target,
        "kv_threshold": kv_threshold,
        "name": name,
        "namespace": namespace,
        "job": job,
        "min_replicas": lo,
        "max_replicas": hi,
        "prometheus_url": prometheus_url,
        "scrape_interval": scrape_interval,
        "rate_window": window,
    }
    if from_study:
        d = study_deployment(from_study, db, engine=engine, **kw)
    elif engine:
        d = from_description(engine, **kw)
    else:
        raise InputError("--from-study", "give a tuned study or --engine", "see --help")
    for kind, path in export(d, out).items():
        typer.echo(f"{kind:10s} {path}")
    for note in (*d.notes, rate_note(d)):
        typer.echo(f"  {note}")
