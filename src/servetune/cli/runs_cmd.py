"""`servetune runs ...`: the experiment store from the command line (list, show,
compare, tag, conclude, export, import, delete). sqlalchemy is imported inside the
commands so `servetune --help` stays fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.store import RunInfo, Store
    from servetune.store.compare import Comparison

runs_app = typer.Typer(
    name="runs",
    help="The experiment store: list, show, compare, tag, conclude, export, import, delete.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

DB_HELP = "Database: a file path or SQLAlchemy URL (default $SERVETUNE_DB or ./servetune.db)."
_DB = typer.Option(None, "--db", help=DB_HELP)
_JSON = typer.Option(False, "--json", help="Machine-readable output.")


def _no_blank(value: Any) -> Any:
    """An empty run id, study or tag (an unset shell variable) names nothing: refused, not
    read as a study of no runs or stored as a tag."""
    items = [value] if isinstance(value, str) else list(value or [])
    if any(not str(v).strip() for v in items):
        raise typer.BadParameter("an empty value names nothing (give a run id, study or tag)")
    return value


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")


def _open(db: str | None, create: bool = False) -> Store:
    from servetune.store import Store

    return Store.open(db, create=create)


def _console() -> Any:
    from servetune.cli.render import console

    return console(highlight=False, soft_wrap=False)


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _metric(metrics: dict[str, Any] | None, path: str) -> Any:
    cur: Any = metrics or {}
    for p in path.split("."):
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


@runs_app.command("list")
def list_runs(
    model: str | None = typer.Option(None, "--model", help="Model name contains this."),
    engine: str | None = typer.Option(None, "--engine"),
    study: str | None = typer.Option(None, "--study", help="Study name or id."),
    tag: str | None = typer.Option(None, "--tag"),
    since: str | None = typer.Option(None, "--since", help="ISO date/time (UTC)."),
    until: str | None = typer.Option(None, "--until", help="ISO date/time (UTC)."),
    status: str | None = typer.Option(None, "--status", help="completed, incomplete, ..."),
    backend: str | None = typer.Option(None, "--backend", help="real or sim."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="The newest N only."),
    studies: bool = typer.Option(False, "--studies", help="List studies instead of runs."),
    as_json: bool = _JSON,
    db: str | None = _DB,
) -> None:
    """Runs in the store, oldest first, with their headline figures."""
    from servetune.status import RunStatus

    # a filter no run can match would list nothing and look like an empty store
    _one_of("--status", status, [s.value for s in RunStatus])
    _one_of("--backend", backend, ["real", "sim"])
    if studies:  # they filter runs: a study list that ignored them would look filtered
        given = {
            "--model": model,
            "--engine": engine,
            "--study": study,
            "--tag": tag,
            "--since": since,
            "--until": until,
            "--status": status,
            "--backend": backend,
            "-n/--limit": limit,
        }
        for flag, value in given.items():
            if value is not None:
                raise InputError(
                    flag,
                    "filters runs, not --studies",
                    "drop it, or list runs (without --studies)",
                )
    with _open(db) as store:
        if studies:
            rows = store.studies()
            if as_json:
                _emit(rows)
                return
            _table(
                ["study", "kind", "runs", "created (UTC)", "id"],
                [[r["name"], r["kind"] or "-", r["runs"], r["created_utc"], r["id"]] for r in rows],
                f"{len(rows)} studies in {store.where}",
            )
            return
        if study is not None:
            store.require_study(study)
        if engine is not None:
            _known_engine(store, engine)
        infos = store.list_runs(
            model=model,
            engine=engine,
            study=study,
            tag=tag,
            since=since,
            until=until,
            status=status,
            backend=backend,
            limit=limit,
        )
        runs = [(i, store.metrics(i)) for i in infos]  # a killed run's from its records
        if as_json:
            _emit([_summary(i, m) for i, m in runs])
            return
        from servetune.metrics.pct import pct_cell
        from servetune.report.experiment import fmt

        rows = [
            [
                i.id,
                i.created_utc.replace("T", " ").rstrip("Z"),
                i.study or "-",
                i.model or "-",
                i.engine or "-",
                i.backend,
                i.load_label(),
                _status(i.status),
                fmt(n := _metric(m, "ttft_ms.count")),
                pct_cell("p99", _metric(m, "ttft_ms.p99"), n),
                pct_cell("p99", _metric(m, "tpot_ms.p99"), _metric(m, "tpot_ms.count")),
                fmt(_metric(m, "output_tok_s")),
                fmt(_metric(m, "goodput_req_s")),
                i.conclusion or "-",
                ",".join(i.tags) or "-",
            ]
            for i, m in runs
        ]
        _table(
            [
                "id",
                "created (UTC)",
                "study",
                "model",
                "engine",
                "backend",
                "load",
                "status",
                "n",
                "TTFT P99 ms",
                "TPOT P99 ms",
                "out tok/s",
                "goodput/s",
                "verdict",
                "tags",
            ],
            rows,
            f"{len(rows)} runs in {store.where}",
        )


def _known_engine(store: Store, engine: str) -> None:
    """Refuse an `--engine` that is neither an engine servetune knows nor one a stored run
    names (in any case: `vLLM` is vllm), with the closest names: a typo would list
    nothing and look like an engine without runs."""
    from servetune.engines.registry import ADAPTERS
    from servetune.errors import closest

    known = list(dict.fromkeys([*ADAPTERS, *store.engines()]))
    if engine.lower() in {k.lower() for k in known}:
        return
    near = closest(engine, known)
    fix = f"did you mean {', '.join(near)}?" if near else f"one of {', '.join(known)}"
    raise InputError("--engine", f"unknown engine {engine!r}", fix)


def _summary(i: RunInfo, metrics: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "id",
        "study",
        "created_utc",
        "backend",
        "status",
        "stop_reason",
        "model",
        "engine",
        "engine_version",
        "hardware",
        "gpu_count",
        "load_kind",
        "rate",
        "concurrency",
        "n_records",
        "conclusion",
        "conclusion_note",
        "tags",
    )
    out = {k: getattr(i, k) for k in keys}
    if i.load_kind == "closed":  # users send on completion: a closed loop offers no rate
        out["rate"] = None
    out["metrics"] = {
        p: _metric(metrics, p)
        for p in (
            "ttft_ms.p50",
            "ttft_ms.p99",
            "tpot_ms.p50",
            "tpot_ms.p99",
            "e2e_ms.p99",
            "output_tok_s",
            "req_s",
            "goodput_req_s",
            "error_rate",
        )
    }
    return out


def _status(s: str) -> str:
    from servetune.status import RunStatus

    colors = {
        RunStatus.COMPLETED: "green",
        RunStatus.RUNNING: "cyan",
        RunStatus.INCOMPLETE: "yellow",
    }
    return f"[{colors.get(s, 'red')}]{s}[/]"


def _table(headers: list[str], rows: list[list[Any]], title: str) -> None:
    from rich.table import Table

    from servetune.cli.render import print_tables

    t = Table(title=title, title_justify="left")
    for h in headers:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    print_tables(t, con=_console())


@runs_app.command("show")
def show(
    ref: str = typer.Argument(
        ..., help="Run id (or a unique prefix, or `last`).", callback=_no_blank
    ),
    as_json: bool = _JSON,
    db: str | None = _DB,
) -> None:
    """The seed 003 §16 experiment record of one run."""
    from servetune.report.experiment import experiment_record

    with _open(db) as store:
        ids = store.resolve([ref])
        if len(ids) != 1:
            raise InputError(
                "RUN",
                f"{ref!r} is a study of {len(ids)} runs; show takes one run",
                "use `runs list --study` or `runs compare`",
            )
        info = store.get(ids[0])
        metrics = _metrics(store, info)
        if as_json:
            _emit({**info.to_json(), "metrics": metrics})
            return
    from rich.table import Table

    con = _console()
    for title, rows in experiment_record(info, metrics):
        t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold", min_width=30)
        t.add_column(overflow="fold")
        for k, v in rows:
            t.add_row(k, v)
        con.print(t)
        con.print()


def _metrics(store: Store, info: RunInfo) -> dict[str, Any]:
    """Stored metrics, or for a run that never finished, computed from its records."""
    return store.metrics(info)


@runs_app.command("compare")
def compare(
    refs: list[str] = typer.Argument(
        ..., help="Two or more runs (ids, studies, A,B,C).", callback=_no_blank
    ),
    all_knobs: bool = typer.Option(False, "--all", help="Also list what does not differ."),
    as_json: bool = _JSON,
    db: str | None = _DB,
) -> None:
    """Side by side: differing knobs and context first, then metric deltas vs the first."""
    from servetune.report.experiment import fmt
    from servetune.store.compare import compare_runs

    with _open(db) as store:
        ids = store.resolve(refs)
        if len(ids) < 2:
            raise InputError("RUNS", f"compare needs two or more runs (got {len(ids)})")
        infos = [store.get(i) for i in ids]
        comp = compare_runs(infos, [_metrics(store, i) for i in infos])
    quality = {i.id: i.quality for i in infos if i.quality}
    if as_json:
        _emit({**comp.to_json(), "quality": quality})
        return
    _print_comparison(comp, all_knobs)
    if quality:
        _table(
            ["quality (seed 003 §16)", *[i.id for i in infos]],
            [
                [k, *[fmt((i.quality or {}).get(k)) for i in infos]]
                for k in dict.fromkeys(k for q in quality.values() for k in q)
            ],
            "Quality (`servetune quality`)",
        )


def _print_comparison(comp: Comparison, all_knobs: bool) -> None:
    from rich.table import Table

    from servetune.metrics.pct import QUANTILES, pct_cell
    from servetune.report.experiment import fmt

    con = _console()
    labels = [f"{chr(65 + i) if i < 26 else i} {rid}" for i, rid in enumerate(comp.run_ids)]
    t = Table(title="What differs (config first, then context)", title_justify="left")
    t.add_column("knob / context", style="bold")
    for lab in labels:
        t.add_column(lab, overflow="fold")
    for f in comp.factors:
        if f.differs:
            t.add_row(f"[bold yellow]{f.name}[/]", *[f"[yellow]{fmt(v)}[/]" for v in f.values])
    if all_knobs:
        for f in comp.factors:
            if not f.differs:
                t.add_row(f"[dim]{f.name}[/]", *[f"[dim]{fmt(v)}[/]" for v in f.values])
    if not comp.differing and not all_knobs:
        t.add_row("[dim](nothing differs)[/]", *["" for _ in labels])
    con.print(t)
    for w in comp.warnings:
        con.print(f"[bold red]warning:[/] {w}")
    m = Table(title="Metrics (delta vs A)", title_justify="left")
    m.add_column("metric", style="bold")
    for lab in labels:
        m.add_column(lab, justify="right", overflow="fold")
    for row in comp.metrics:
        cells = []
        stat = row.path.rsplit(".", 1)[-1]
        for i, v in enumerate(row.values):
            n = row.counts[i] if row.counts and stat in QUANTILES else None
            cell = fmt(v) if n is None else f"{pct_cell(stat, v, int(n))} (n={n:g})"
            if i and row.pcts[i] is not None:
                verdict = row.verdict(i)
                color = {"better": "green", "worse": "red"}.get(verdict or "", "dim")
                cell += f" [{color}]({row.pcts[i]:+.1f}%)[/]"
            cells.append(cell)
        m.add_row(row.label, *cells)
    con.print(m)


@runs_app.command("tag")
def tag(
    ref: str = typer.Argument(..., help="Run id, study or A,B,C.", callback=_no_blank),
    tags: list[str] = typer.Argument(
        ..., help="Tags to add (or remove with --remove).", callback=_no_blank
    ),
    remove: bool = typer.Option(False, "--remove", help="Remove these tags instead."),
    db: str | None = _DB,
) -> None:
    """Add or remove tags (e.g. baseline, candidate, prod)."""
    from servetune.store.models import check_tag

    if not remove:  # a tag stored with a comma or a blank could be removed, never added
        for t in tags:
            check_tag("TAGS", t)
    with _open(db) as store:
        ids = store.resolve([ref], allow_empty=False)
        changed = store.tag(ids, add=() if remove else tags, remove=tags if remove else ())
    typer.echo(_tag_line(remove, changed, len(ids), tags))


def _tag_line(remove: bool, changed: int, of: int, tags: list[str]) -> str:
    """What `runs tag` did: only the runs that changed count (removing a tag no run has
    untags none)."""
    line = f"{'untagged' if remove else 'tagged'} {changed} run(s): {', '.join(tags)}"
    if changed < of:
        line += f" ({of - changed} {'did not have' if remove else 'already had'} it)"
    return line


@runs_app.command("conclude")
def conclude(
    ref: str = typer.Argument(..., help="Run id.", callback=_no_blank),
    verdict: str = typer.Argument(..., help="keep, drop or next (take to the next round)."),
    note: str | None = typer.Option(None, "--note", help="Why."),
    db: str | None = _DB,
) -> None:
    """Record the seed 003 §16 conclusion of a run."""
    with _open(db) as store:
        ids = store.resolve([ref], allow_empty=False)
        for rid in ids:
            store.conclude(rid, verdict, note)
    typer.echo(f"{verdict}: {', '.join(ids)}")


def _one_of(flag: str, value: str | None, allowed: list[str]) -> None:
    if value is not None and value not in allowed:
        raise InputError(flag, f"unknown value {value!r}", f"one of {', '.join(allowed)}")


@runs_app.command("export")
def export(
    refs: list[str] = typer.Argument(
        None, help="Runs or studies (default: all runs).", callback=_no_blank
    ),
    fmt_: str = typer.Option("csv", "--format", "-f", help="csv, json or parquet."),
    output: Path = typer.Option(..., "--output", "-o", help="File to write."),
    records: bool = typer.Option(False, "--records", help="csv/parquet: one row per request."),
    db: str | None = _DB,
) -> None:
    """Write runs out: one row per run (or per request), or JSON that `runs import` reads."""
    from servetune.results.files import check_outputs, check_replaceable, sqlite_file
    from servetune.store.transfer import FORMATS
    from servetune.store.transfer import export as do_export

    check_outputs({"--output": output}, {})
    _one_of("--format", fmt_, list(FORMATS))
    if records and fmt_ == "json":  # the JSON export holds every record already
        raise InputError(
            "--records", "applies to csv and parquet", "drop it: the json export holds them all"
        )
    with _open(db) as store:
        # never over the store itself, a record log or another program's file
        check_replaceable(output, sqlite_file(store), "--output", fmt_)
        ids = store.resolve(refs, allow_empty=False) if refs else [i.id for i in store.list_runs()]
        n = do_export(store, ids, output, fmt_, records=records)
    typer.echo(f"wrote {n} {'runs' if fmt_ == 'json' else 'rows'} to {output}")


@runs_app.command("import")
def import_(
    files: list[Path] = typer.Argument(..., help="bench result JSON, record JSONL, export JSON."),
    study: str | None = typer.Option(None, "--study", help="Put the runs in this study."),
    tags: list[str] = typer.Option(
        [], "--tag", help="Tag the imported runs (repeatable).", callback=_no_blank
    ),
    db: str | None = _DB,
) -> None:
    """Import result files from earlier runs (or another store's export)."""
    from servetune.cli.bench_cmd import check_names
    from servetune.store.db import resolve_url
    from servetune.store.transfer import WARNED, read_import

    resolve_url(db)  # a bad --db first: it names the flag, before any file is read
    check_names(study, tags)
    parsed = [(f, list(read_import(f))) for f in files]  # every file, before the store
    if not any(items for _, items in parsed):  # an empty export: no empty store either
        typer.echo(f"no runs in {', '.join(f.name for f in files)}: nothing imported", err=True)
        return
    with _open(db, create=True) as store:
        for f, items in parsed:
            for rid, what in store.import_items(items, f.name, study=study, tags=tags):
                done, _, warning = what.partition(WARNED)
                typer.echo(f"{rid}: {done}")
                if warning:  # what was left out (a cut-off last line), where warnings go
                    typer.echo(f"warning: {rid}: {warning}", err=True)


@runs_app.command("delete")
def delete(
    refs: list[str] = typer.Argument(..., help="Runs or studies.", callback=_no_blank),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    db: str | None = _DB,
) -> None:
    """Delete runs and their records (cannot be undone). A study named here goes too,
    with its meta (a tuner's settings and summary), once it has no runs left."""
    with _open(db) as store:
        ids = store.resolve(refs)
        studies = store.studies_named(refs)
        also = f" and {_plural(len(studies), 'study', 'studies')} {', '.join(studies)}"
        also = also if studies else ""
        if not yes:
            if not sys.stdin.isatty():
                raise InputError(
                    "--yes", f"refusing to delete {len(ids)} run(s){also} without --yes"
                )
            typer.confirm(f"delete {len(ids)} run(s){also}: {', '.join(ids)}?", abort=True)
        n = store.delete(ids, studies=studies)
    typer.echo(f"deleted {n} run(s){also}")


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many
