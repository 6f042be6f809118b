"""`servetune quality --baseline URL --candidate URL`: does the candidate build answer like
the baseline (perplexity, greedy agreement, exact match), and does seed 003 §2 accept it?"""

from __future__ import annotations

import json

import typer

from servetune.cli.bench_cmd import DB_OPTION
from servetune.errors import InputError


def register(app: typer.Typer) -> None:
    app.command(
        "quality",
        help="Compare a candidate build (e.g. a lower quant) with its baseline; §2 verdict.",
    )(quality)


def quality(
    baseline: str = typer.Option(..., "--baseline", help="URL of the reference build."),
    candidate: str = typer.Option(..., "--candidate", help="URL of the build to prove."),
    threshold: float = typer.Option(
        0.05, "--threshold", help="Business threshold: largest perplexity increase (0.05 = 5%)."
    ),
    baseline_run: str | None = typer.Option(
        None, "--baseline-run", help="Stored bench run of the baseline (throughput, P99)."
    ),
    candidate_run: str | None = typer.Option(
        None, "--candidate-run", help="Stored bench run of the candidate; gets the result."
    ),
    min_gain: float = typer.Option(
        0.15, "--min-gain", help="Throughput rise §2 asks for (seed: 15-20%)."
    ),
    corpus: str | None = typer.Option(None, "--corpus", help="Own corpus (YAML, same shape)."),
    passages: int | None = typer.Option(None, "--passages", min=2, help="Use the first N."),
    tasks: int | None = typer.Option(None, "--tasks", min=0, help="Use the first N tasks."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=2, help="Tokens scored per passage."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    db: str | None = DB_OPTION,
) -> None:
    """Score both endpoints on the corpus, print the figures with their noise bounds and
    the verdict, and store them in --candidate-run's quality field."""
    from servetune.quality.corpus import load_corpus
    from servetune.quality.endpoint import connect
    from servetune.quality.run import Settings, compare

    if not 0 <= threshold < 10:
        raise InputError("--threshold", f"{threshold} is not a relative increase", "e.g. 0.05")
    if not 0 <= min_gain < 10:
        raise InputError("--min-gain", f"{min_gain} is not a relative rise", "e.g. 0.15")
    if baseline_run and not candidate_run:
        raise InputError("--baseline-run", "needs --candidate-run too", "give both runs")
    text = load_corpus(corpus).limit(passages, tasks)
    settings = Settings(max_tokens=max_tokens, threshold=threshold, min_gain=min_gain)
    # The runs are checked before the endpoints are scored (minutes), so a wrong id fails now.
    perfs, run_id = None, None
    if candidate_run:
        from servetune.quality.stored import check_comparable, perf, resolve_one
        from servetune.store import Store

        with Store.open(db, create=False) as store:
            run_id = resolve_one(store, candidate_run, "--candidate-run")
            if baseline_run:
                check_comparable(store, baseline_run, candidate_run)
                perfs = (
                    perf(store, baseline_run, "--baseline-run"),
                    perf(store, candidate_run, "--candidate-run"),
                )
    base, cand = connect(baseline, "--baseline"), connect(candidate, "--candidate")
    try:
        result = compare(base, cand, text, settings)
    finally:
        base.close()
        cand.close()
    if perfs:
        result.base_perf, result.cand_perf = perfs
    table = result.table()
    if run_id:
        from servetune.store import Store

        with Store.open(db, create=False) as store:
            store.set_quality(run_id, table)
    if as_json:
        typer.echo(json.dumps({**table, "stored_in": run_id}, indent=2, default=str))
        return
    for k, v in table.items():
        if k != "checks":
            typer.echo(f"{k:27} {'not measured' if v is None else v}")
    for c in table["checks"]:
        typer.echo(f"  {c}")
    typer.echo(
        f"stored in run {run_id}'s quality field" if run_id else "not stored: give --candidate-run"
    )
