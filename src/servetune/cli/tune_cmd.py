"""`servetune tune`: the best engine config under the SLO, proven and recorded.

Thin layer: resolve the preset and the flags into `TuneSettings`, run `tune.tuner`, print
the ranking, the winner's launch command, why it won and where the report is. Heavy
imports happen inside the command so `servetune --help` stays fast.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from servetune.cli.bench_cmd import INPUT_LEN_OPTION, OUTPUT_LEN_OPTION
from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.store import Store
    from servetune.tune.tuner import TuneOutcome


def register(app: typer.Typer) -> None:
    app.command("tune", help="Find the engine config with the best goodput under the SLO.")(tune)


def tune(
    preset: str | None = typer.Option(
        None, "--preset", help="llamacpp-cpu (default), vllm-gpu, or a preset YAML."
    ),
    engine: str | None = typer.Option(None, "--engine", help="vllm, llamacpp, ..."),
    model: str | None = typer.Option(None, "--model", "-m", help="Catalog name or config.json."),
    model_path: str | None = typer.Option(
        None, "--model-path", help="What a real engine serves (GGUF file, HF dir)."
    ),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help="Accelerator (or cpu-host)."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs per replica (sets TP)."),
    hardware_file: Path | None = typer.Option(None, "--hardware-file"),
    space: Path | None = typer.Option(None, "--space", help="Search space YAML."),
    workload: Path | None = typer.Option(None, "--workload", "-w", help="Workload YAML."),
    input_len: int | None = INPUT_LEN_OPTION,
    output_len: int | None = OUTPUT_LEN_OPTION,
    slo_file: Path | None = typer.Option(None, "--slo", help="SLO YAML."),
    backend: str | None = typer.Option(None, "--backend", help="sim, real or hybrid."),
    strategy: str | None = typer.Option(
        None, "--strategy", help="auto, grid, random, bayes, one-at-a-time."
    ),
    trials: int | None = typer.Option(None, "--trials", help="Trials of the ranking phase."),
    seed: int | None = typer.Option(None, "--seed"),
    objective: str | None = typer.Option(None, "--objective", help="goodput, cost, latency."),
    gpu_hour_usd: float | None = typer.Option(None, "--gpu-hour-usd", help="For --objective cost."),
    top_k: int | None = typer.Option(None, "--top-k", help="Hybrid: configs verified for real."),
    finalists: int | None = typer.Option(None, "--finalists", help="Configs re-run, +baseline."),
    repeats: int | None = typer.Option(None, "--repeats", help="Repetitions per finalist."),
    load: str | None = typer.Option(None, "--load", help="concurrency or rate search."),
    max_load: float | None = typer.Option(None, "--max-load", help="Highest load tried."),
    max_probes: int | None = typer.Option(None, "--max-probes", help="Load points per trial."),
    time_budget: float | None = typer.Option(
        None, "--time-budget", help="Seconds for real trials (soft)."
    ),
    executor: str = typer.Option("local", "--executor", help="local or ray."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster (auto, ray://...)."),
    ray_cpus: int | None = typer.Option(None, "--ray-cpus", help="CPUs of a local Ray."),
    profile: Path | None = typer.Option(None, "--profile", help="Calibrated sim profile."),
    recalibrate: bool = typer.Option(
        False, "--recalibrate", help="Hybrid: calibrate the simulator again (else cached)."
    ),
    executable: str | None = typer.Option(None, "--executable", help="Engine binary/python."),
    db: str | None = typer.Option(None, "--db", help="Store (path or SQLAlchemy URL)."),
    study: str | None = typer.Option(None, "--study", help="Study name (resumes if it exists)."),
    fresh: bool = typer.Option(False, "--fresh", help="Start a new study even if one exists."),
    report: Path | None = typer.Option(
        None, "--report", "-o", help="HTML report (default out/STUDY.html)."
    ),
    no_edge: bool = typer.Option(False, "--no-edge", help="Skip the OOM-edge step."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
) -> None:
    """Rank configs (simulator and/or real engine), verify, re-run finalists, step back
    from the OOM edge, explain, record (see docs/tune.md)."""
    from servetune.results.files import check_outputs
    from servetune.tune.tuner import NothingMeasured, Tuner

    check_outputs({"--report": report}, {})  # before the study, not after it
    check_report(report, db)
    settings = build_settings(locals())
    say = (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    head = (
        f"servetune tune: {settings.real.engine if settings.real else settings.space.engine} "
        f"[{settings.mode}], space {settings.space.size} combinations "
        f"({len(settings.space.valid_points())} valid), strategy {settings.strategy}, "
        f"objective {settings.objective.label}"
    )
    say(head)
    tuner = Tuner(settings, say)
    if settings.real is not None and not quiet:  # real probes show the live view
        from rich.console import Console

        from servetune.bench.live import live_view
        from servetune.measure.backends import RealBackend

        RealBackend.live = live_view(Console(stderr=True))  # None when piped
    try:
        out = tuner.run()
    except NothingMeasured as exc:  # every config skipped or infeasible: their reasons
        if as_json:
            sys.stdout.write(json.dumps(exc.outcome.to_json(), indent=2, default=str) + "\n")
        else:
            print_outcome(exc.outcome)
        raise
    finally:
        from servetune.measure.backends import RealBackend

        if RealBackend.live is not None:
            RealBackend.live.shutdown()
        RealBackend.live = None
    write_report(tuner.store, out, report)
    if as_json:
        sys.stdout.write(json.dumps(out.to_json(), indent=2, default=str) + "\n")
        return
    print_outcome(out)


def write_report(store: Store, out: TuneOutcome, path: Path | None) -> None:
    """The study's HTML report (default out/STUDY.html) of the runs the tuner picked;
    a report that cannot be built becomes a note, the study stands."""
    from servetune.report import build_report

    if not out.report_runs:
        return
    path = path or Path("out") / f"{out.study}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        build_report(
            store,
            out.report_runs,
            path,
            title=f"servetune tune: study {out.study}",
            flag="--report",
        )
    except InputError as exc:
        out.notes.append(f"report not written: {exc.one_line()}")
        return
    out.report_path = path


def check_report(report: Path | None, db: str | None) -> None:
    """A --report that the finished study could not replace (the store's database, a file
    that is no HTML report) is refused before the study runs, not noted after it."""
    from servetune.report.build import check_replaceable, sqlite_file
    from servetune.store.db import resolve_url

    if report is not None:
        check_replaceable(report, sqlite_file(resolve_url(db)), "--report")


def build_settings(o: dict[str, Any]) -> Any:
    """Preset + flags -> TuneSettings (every problem one line, exit 2)."""
    from servetune.engines.process import default_device
    from servetune.measure import BackendSpec
    from servetune.slo import load_slo, parse_slo
    from servetune.tune.executors import check_executor
    from servetune.tune.objective import Objective
    from servetune.tune.preset import load_plan, load_preset, resolve_model_path
    from servetune.tune.space import load_space, parse_space
    from servetune.tune.trial import SearchSettings
    from servetune.tune.tuner import MODES, TuneSettings
    from servetune.workload.spec import load_workload, parse_workload, with_lengths

    name = o["preset"]
    if name is None:
        gpu_given = o["gpu"] and o["gpu"] != "cpu-host"
        what_if = (o["model"] or gpu_given) and o["engine"] != "llamacpp"
        name = "vllm-gpu" if what_if else "llamacpp-cpu"
    pre = load_preset(name)
    opts = tune_options(pre.tune, o)
    if o["gpus"] is not None:
        from servetune.plan.service import check_gpus

        check_gpus(o["gpus"])
    if o["db"] is not None and not o["db"].strip():
        raise InputError("--db", "is empty", "give a file path or URL")
    mode = o["backend"] or pre.backend
    if mode not in MODES:
        raise InputError("--backend", f"unknown backend {mode!r}", "sim, real or hybrid")
    check_unread(o, opts, mode)
    check_executor(o["executor"], o["address"], o["ray_cpus"])
    engine = o["engine"] or pre.engine
    sp = load_space(o["space"]) if o["space"] else parse_space(pre.space, engine)
    if o["engine"] and sp.engine != engine:
        raise InputError("--engine", f"the space is for {sp.engine}, not {engine}")
    from servetune.hardware import get_hardware
    from servetune.model import get_model

    model = o["model"] or pre.model
    hardware = o["gpu"] or pre.hardware
    model_spec = get_model(model)  # fail fast on names (one line) before anything runs
    hw = get_hardware(hardware, o["hardware_file"])
    if o["gpus"] and o["gpus"] > 1:  # every trial would be refused: say it before any runs
        from servetune.plan.planner import check_gpus_as_tp

        split = "a --space fixing tensor_parallel_size: {tp} and pipeline_parallel_size: {pp}"
        check_gpus_as_tp(o["gpus"], sp.engine, model_spec, hw, split)
        sp = parse_space({**sp.to_json(), "fixed": {**sp.fixed, "tensor_parallel_size": o["gpus"]}})
    wl = load_workload(o["workload"]) if o["workload"] else parse_workload(pre.workload)
    wl = with_lengths(wl, o["input_len"], o["output_len"])
    slo = load_slo(o["slo_file"]) if o["slo_file"] else parse_slo(pre.slo)
    strat = opts.strategy
    if strat == "auto":
        strat = "grid" if len(sp.valid_points()) <= 24 else "bayes"
    kind, lattice, fixed = load_plan(opts, wl)
    common = dict(
        engine=sp.engine,
        model=model,
        hardware=hardware,
        workload=wl.model_dump(mode="json"),
        slo=slo.model_dump(mode="json", exclude_none=True),
        hardware_file=str(o["hardware_file"]) if o["hardware_file"] else None,
        per_user=opts.per_user,
        request_timeout_s=opts.request_timeout_s,
        launch_timeout_s=opts.launch_timeout_s,
    )
    check_servable(wl, sp, model_spec)
    sim = real = None
    if mode in ("sim", "hybrid"):
        sim = BackendSpec(
            kind="sim",
            profile=str(o["profile"]) if o["profile"] else None,
            model_path=o["model_path"] or pre.model_path,
            **common,
        )
    if mode in ("real", "hybrid"):
        from servetune.engines import install

        install.require(sp.engine, o["executable"])  # not installed: one line, exit 2
        path = resolve_model_path(o["model_path"] or pre.model_path)
        if path is None:
            raise InputError("--model-path", f"a real {sp.engine} needs the model to serve")
        real = BackendSpec(
            kind="real",
            model_path=path,
            device=default_device(),
            executable=o["executable"],
            **common,
        )
    return TuneSettings(
        space=sp,
        mode=mode,
        objective=Objective(opts.objective, opts.gpu_hour_usd),
        search=SearchSettings(
            load_kind=kind,
            lattice=lattice,
            max_probes=opts.max_probes,
            # past the first failure, for the sweet spot a concurrency trial's points give
            # (a rate search's is a separate concurrency sweep of the winner)
            extra_doublings=1 if mode == "sim" and kind == "concurrency" else 0,
            fixed_load=fixed,
        ),
        sim=sim,
        real=real,
        strategy=strat,
        budget=opts.trials,
        seed=opts.seed,
        top_k=opts.top_k,
        finalists=opts.finalists,
        repeats=opts.repeats,
        start_index=lattice.index_of(1.0) if kind == "rate" else 0,
        executor=o["executor"],
        address=o["address"],
        num_cpus=o["ray_cpus"],
        db=o["db"],
        study=o["study"],
        fresh=o["fresh"],
        time_budget_s=opts.time_budget_s,
        edge=not o["no_edge"],
        recalibrate=o["recalibrate"],
        verbose=not o["quiet"],
        host_slo=None if o["slo_file"] else pre.slo_from_host,  # --slo is used as given
    )


def check_servable(wl: Any, sp: Any, model: Any) -> None:
    """Refuse a workload whose longest request (prompt + output) no config of the space
    serves: every request answered 400 made a "best effort" that blamed TTFT and TPOT,
    which were never measured. The longest context a config may set is the space's
    largest max_model_len (knobs, fixed), else the longest the engine accepts for the
    model (`ModelSpec.context_limit`: rope scaling's derived length, else
    max_position_embeddings)."""
    from servetune.sim.engine import materialize_for_sim

    if wl.sessions is not None:  # a conversation's context grows with its turns
        return
    lens = [v for v in sp.knobs.get("max_model_len", []) if v is not None]
    lens += [sp.fixed["max_model_len"]] if sp.fixed.get("max_model_len") else []
    allowed = max(lens) if lens else model.context_limit
    cols = materialize_for_sim(wl)
    if not len(cols):
        return
    longest = int((cols.prompt_tokens + cols.output_tokens.clip(min=0)).max())
    if longest > allowed:
        raise InputError(
            "--workload",
            f"no config serves its longest request: prompt + output {longest:,} tokens "
            f"exceeds max_model_len {allowed:,} (every request over it is refused)",
            "shorter requests, or a larger max_model_len in the space",
        )


# Flags only a real engine reads: under --backend sim they would change nothing.
_REAL_ONLY = {"top_k": "--top-k", "finalists": "--finalists", "repeats": "--repeats",
              "recalibrate": "--recalibrate", "executable": "--executable"}  # fmt: skip
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # it names out/STUDY.html


def check_unread(o: dict[str, Any], opts: Any, mode: str) -> None:
    """Refuse what the study would not read: a flag of the real engine's phases (or
    --time-budget) under --backend sim, a GPU-hour price without the cost objective (from
    a flag or the preset), and a study name that is no plain file name (it names the
    report's file: `../../etc/x` wrote outside out/; an empty one fell back to a
    fingerprint)."""
    if mode == "sim":
        for key, flag in _REAL_ONLY.items():
            if o[key] is not None and o[key] is not False:  # given, 0 too (`--repeats 0`)
                raise InputError(
                    flag, "only the real engine's phases read it", "drop it under --backend sim"
                )
        if o["time_budget"] is not None:  # the flag only: a preset's budget is its default
            raise InputError(
                "--time-budget",
                "only real trials are timed (simulated ones take seconds)",
                "drop it under --backend sim",
            )
    if opts.gpu_hour_usd is not None and opts.objective != "cost":
        raise InputError(
            "--gpu-hour-usd",
            f"only --objective cost reads it, not {opts.objective}",
            "add --objective cost, or drop it",
        )
    study = o["study"]
    if study is not None and not STUDY_NAME.fullmatch(study):
        raise InputError(
            "--study",
            f"{study!r} is not a plain name (it names out/STUDY.html)",
            "use letters, digits, '.', '_', '-'",
        )


# TuneOptions fields and the flags that set them (the rest come from the preset).
_OPTION_FLAGS = {
    **{k: "--" + k.replace("_", "-") for k in (
        "strategy", "trials", "seed", "objective", "gpu_hour_usd", "top_k", "finalists",
        "repeats", "load", "max_load", "max_probes",
    )},
    "time_budget_s": "--time-budget",
}  # fmt: skip


def tune_options(preset: Any, o: dict[str, Any]) -> Any:
    """The preset's TuneOptions with the flags given, validated as a whole: a flag out of
    range (`--trials 0`, `--max-load -5`) is one line naming it, never a value ignored."""
    from pydantic import ValidationError

    from servetune.errors import from_validation_error

    given = {k: o[flag[2:].replace("-", "_")] for k, flag in _OPTION_FLAGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    try:
        return type(preset).model_validate({**preset.model_dump(), **given})
    except ValidationError as exc:
        flags = {k: f for k, f in _OPTION_FLAGS.items() if k in given}
        raise from_validation_error(exc, "preset.tune", flags) from None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _p95(v: float | None, n: int | None) -> str:
    """A P95 cell beside its `n` column, `~max` when n is too small for a P95."""
    from servetune.metrics.pct import pct_cell

    return pct_cell("p95", v, n, ",.0f")


def repeated(t: Any, obj: Any) -> str:
    """A finalist's `repeated` cell: its repetitions' mean in the objective's own unit
    (the figure the winner is picked on, `selection.pick_winner`) and how many of them
    met the SLO; `-` for a config run once."""
    if not t.ci:
        return "-"
    return f"{obj.text(t.ci['mean'])} {t.ci['passed']}/{t.ci['n']}"


def print_outcome(out: Any) -> None:
    from servetune.status import TrialStatus
    from servetune.tune.shortfall import shortfall

    obj = out.objective
    w = out.winner
    if out.host_slo is not None:
        print(out.host_slo.text())
    print(f"\n== ranking ({out.mode}; {out.counts.get('trials', 0)} trials, {out.elapsed_s:.0f} s)")
    width = max([len(t.label) for t in out.ranked[:12]] + [6])
    reps = any(t.ci for t in out.ranked[:12])
    print(
        f"{'#':>4}  {'config':{width}s} {'status':10s} {'capacity':>8s} {obj.label:>20s} "
        + (f"{'repeated':>24s} " if reps else "")
        + f"{'n':>6s} {'P95 TTFT':>11s} {'P95 TPOT':>11s}"
    )
    for i, t in enumerate(out.ranked[:12], 1):
        sf = shortfall(t) if t.best is None else None
        b = t.best or (sf.point if sf else None)  # no passing point: the closest one
        cap_t = obj.capacity_of(t)  # none for latency: its one load is the workload's own
        cap = "-" if cap_t is None else f"{'>=' if t.capacity_is_lower_bound else ''}{cap_t:.3g}"
        n = b.completed if b else None
        mark = "*" if w is not None and t.key == w.key and out.slo_met else ""
        print(
            f"{mark:1s}{i:>3}  {t.label:{width}s} {t.status:10s} {cap:>8s} "
            f"{obj.show(t.score):>20s} "
            + (f"{repeated(t, obj):>24s} " if reps else "")
            + f"{_ms(n):>6s} {_p95(b.ttft_p95_ms if b else None, n):>11s} "
            f"{_p95(b.tpot_p95_ms if b else None, n):>11s}"
        )
        if t.status in (TrialStatus.INFEASIBLE, TrialStatus.SKIPPED) and t.reason:
            print(f"     {t.reason[:150]}")
    if len(out.ranked) > 12:
        print(f"     ... {len(out.ranked) - 12} more in the study")
    if any(t.capacity_is_lower_bound and obj.capacity_of(t) for t in out.ranked[:12]):
        print("     >=: no load tried missed the SLO (the capacity is a lower bound)")
    if reps:
        print(
            "     repeated: the finalists' mean over their repetitions at their best load, "
            "and how many met the SLO;\n     the ranking is one search trial each, the "
            "winner (*) the best repeated mean"
        )
    if w is None:
        return
    if not out.slo_met:  # a result, not an error: what to run, and how far it missed
        print(f"\n== NO CONFIG MEETS THE SLO - best effort: {w.label}")
        print(f"launch command:\n  {w.launch_command}")
        print("how far it missed (value vs target at its closest load):")
        for line in out.explanation:
            print(f"  - {line}")
        _print_tail(out)
        return
    print(f"\n== winner: {w.label}")
    print(f"launch command:\n  {w.launch_command}")
    if w.ci:
        ci = w.ci
        print(
            f"repetitions: {ci['n']}, {ci['metric']} {ci['mean']:.3g} "
            f"(95% CI {ci['low']:.3g} .. {ci['high']:.3g}), {ci['passed']}/{ci['n']} met "
            "the SLO"
        )
    print("why it won:")
    for line in out.explanation:
        print(f"  - {line}")
    for e in out.edges:
        print(f"OOM edge ({e.knob}): {e.note}")
    r = out.recommended
    if r and r.get("note"):  # the step back missed the SLO: the winner is what to ship
        print(f"ship {r['note']}")
    elif r and not r.get("same_as_winner"):
        extra = ""
        if r.get("score") is not None:
            extra = f": {obj.show(r['score'])}"
            if r.get("safety_margin"):
                extra += f" (vs the winner: {r['safety_margin']})"
        elif "status" not in r:
            extra = " (not measured: the time budget ran out; the planner says it fits)"
        print(f"ship one safe step back from the OOM edge: {r['label']}{extra}")
        print(f"  {r['launch_command']}")
    elif r:
        print("safety: the winner is already at least one step below any OOM edge seen")
    _print_tail(out)


def _print_tail(out: Any) -> None:
    """The simulator's calibration and its sim-vs-real check (hybrid), notes, the report
    and the study: the end of every outcome."""
    from servetune.tune.simvsreal import line, verdict_line

    if out.calibration is not None:
        print(out.calibration.line())
    for row in out.sim_vs_real:
        print(line(row))
    if out.sim_error:
        print(verdict_line(out.sim_error))
    if out.calibration is not None and out.calibration.check is not None:
        print(out.calibration.check_line())
    for n in out.notes:
        print(f"note: {n}")
    if out.report_path:
        print(f"report: {out.report_path.resolve()}")
    print(
        f"study: {out.study} in {out.db} (the same command resumes it; "
        f"servetune runs list --study {out.study})"
    )
