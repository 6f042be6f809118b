"""`servetune simulate` and `servetune calibrate`: the engine simulator's commands.

Thin layer: `simulate` parses its flags into `measure.SimulateSettings` and calls
`measure.run_simulate` (the same sweep, files and store as bench); `calibrate` fits a
profile with `sim.calibrate`. Heavy imports inside commands.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from servetune.cli.bench_cmd import (
    DB_OPTION,
    INPUT_LEN_OPTION,
    NO_STORE_OPTION,
    OUTPUT_LEN_OPTION,
    STUDY_OPTION,
    TAG_OPTION,
    check_ranges,
    numbers,
    say_line,
    store_settings,
)
from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.engines.base import Device
    from servetune.results.schema import RunResult

_SET_HELP = "Canonical knob, repeatable: --set max_num_seqs=64 --set enable_prefix_caching=false"


def register(app: typer.Typer) -> None:
    app.command("simulate", help="Predict an engine config under a workload, without the engine.")(
        simulate
    )
    app.command("calibrate", help="Fit a simulator profile from bench result files.")(calibrate)


def _summary(res: RunResult) -> dict[str, Any]:
    m, t = res.metrics, res.target
    sim = t.sim
    assert sim is not None  # every simulated run carries its counters
    return {
        "id": res.id,
        "tier": t.tier,
        "load": res.load.model_dump(),
        "completed": m.completed,
        "rejected": sim.rejected,
        "output_tok_s": round(m.output_tok_s, 2),
        "req_s": round(m.req_s, 3),
        # the mean too: what benchmarks (AIPerf, vllm bench serve) publish first
        "ttft_ms": {k: getattr(m.ttft_ms, k) for k in ("mean", "p50", "p95", "p99")},
        "tpot_ms": {k: getattr(m.tpot_ms, k) for k in ("mean", "p50", "p95", "p99")},
        "e2e_ms_p50": m.e2e_ms.p50,
        "preemptions": sim.preemptions,
        "prefix_hit_tokens": sim.prefix_hit_tokens,
        "max_kv_blocks_used": sim.max_kv_blocks_used,
        "kv_blocks": t.kv_blocks,
        "goodput_req_s": m.goodput_req_s,
        "slo_pass": m.slo_pass,
        "steps": sim.steps,
        "wall_s": round(sim.wall_s, 3),
        "expected_error": sim.expected_error,
        # a GPU point at its KV pool's edge, again on a pool servetune may overstate
        "smaller_pool": sim.pool_doubt.model_dump() if sim.pool_doubt else None,
    }


def simulate(
    model: str = typer.Option("llama-3.1-8b", "--model", "-m", help="Catalog name or config.json."),
    gpu: str = typer.Option("h100-sxm", "--gpu", "-g", help="Accelerator (or cpu-host)."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs of one replica (sets TP when --set omits)."),
    engine: str = typer.Option(
        "vllm", "--engine", help="vllm (paged), sglang (radix) or llamacpp (slots)."
    ),
    sets: list[str] = typer.Option([], "--set", help=_SET_HELP),
    extra: str | None = typer.Option(
        None,
        "--extra",
        help="Engine flags the model reads, e.g. --extra '--swa-full-tokens-ratio 0.5'",
    ),
    workload: Path | None = typer.Option(None, "--workload", "-w", help="Workload YAML."),
    replay: Path | None = typer.Option(
        None, "--replay", help="A bench result JSON: simulate its exact requests and load."
    ),
    rate: str | None = typer.Option(None, "--rate", help="Open-loop rates, req/s: 1,2,4"),
    concurrency: str | None = typer.Option(None, "--concurrency", help="Closed-loop users: 1,8"),
    count: int | None = typer.Option(None, "--count", help="Requests per point."),
    input_len: int | None = INPUT_LEN_OPTION,
    output_len: int | None = OUTPUT_LEN_OPTION,
    duration: float | None = typer.Option(None, "--duration", help="Seconds per point."),
    profile: Path | None = typer.Option(None, "--profile", help="Calibrated profile JSON."),
    slo_file: Path | None = typer.Option(None, "--slo", help="SLO YAML (goodput, pass/fail)."),
    hardware_file: Path | None = typer.Option(None, "--hardware-file", help="Extra hardware."),
    output: Path | None = typer.Option(None, "--output", "-o", help="RunResult JSON."),
    trace_path: Path | None = typer.Option(None, "--trace", help="Per-step trace CSV."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
    db: str | None = DB_OPTION,
    no_store: bool = NO_STORE_OPTION,
    study: str | None = STUDY_OPTION,
    tags: list[str] = TAG_OPTION,
) -> None:
    """Replay the workload through a scheduler model of the engine (see docs/simulate.md)."""
    from servetune.cli.engine_cmd import parse_sets
    from servetune.cli.sim_report import print_lines, sim_header, sim_point
    from servetune.measure import Hooks, ResultFiles, SimulateSettings, SweepLoads, run_simulate
    from servetune.results.files import check_outputs
    from servetune.store.writer import STORE_OFF

    check_ranges({"--count": count, "--duration": duration})
    if replay is not None and workload is not None:  # the replay's requests would win unseen
        raise InputError("--replay", "replays a bench run's own requests", "drop --workload")
    from servetune.plan.service import check_gpus

    check_gpus(gpus)
    check_outputs({"--output": output, "--trace": trace_path}, {})  # before the run
    if extra and engine != "sglang":  # only SGLang's model reads flags without a knob
        raise InputError(
            "--extra", f"the {engine} simulator reads no extra flags", "use --set with a knob"
        )
    from servetune.hardware import get_hardware

    hw = get_hardware(gpu, hardware_file)
    # the device's own rules (vLLM CPU's block sizes) name the fix the run would need
    cfg = parse_sets(engine, sets, extra, device=hw.kind)
    from servetune.engines.extra import knob_in_extra

    if (knob := knob_in_extra(cfg, hw.kind)) is not None:  # named as typed, as plan does
        raise InputError(
            "--extra", f"{knob[0]} is the {knob[1]} knob's flag", f"use --set {knob[1]}=N"
        )
    if gpus > 1 and not any(s.startswith("tensor_parallel_size") for s in sets):
        from servetune.model import get_model
        from servetune.plan.planner import check_gpus_as_tp

        split = "--set tensor_parallel_size={tp} --set pipeline_parallel_size={pp}"
        check_gpus_as_tp(gpus, engine, get_model(model), hw, split)
        cfg = cfg.with_(tensor_parallel_size=gpus)
    settings = SimulateSettings(
        config=cfg,
        model=model,
        gpu=gpu,
        hardware_file=hardware_file,
        workload=workload,
        replay=replay,
        loads=SweepLoads(
            numbers(rate, "--rate", float), numbers(concurrency, "--concurrency", int),
            count, duration, input_len, output_len,
        ),
        profile=profile,
        slo=slo_file,
        # the simulator makes no text: its results are written whole
        files=ResultFiles(output, trace=trace_path, save_text=True),
        store=store_settings("sim", db, no_store, study, tags),
    )  # fmt: skip

    def ready(session: Any) -> None:  # the report goes to stdout, store notes to stderr
        if not as_json:
            print_lines(sim_header(session))

    def point(_: Any, res: RunResult) -> None:
        if not as_json:
            print_lines(sim_point(res))

    store_off: list[str] = []  # the store's one warning line, when it could not store

    def say(line: str) -> None:
        if line.startswith(STORE_OFF):
            store_off.append(line)
        say_line(line)

    if profile is not None:
        from servetune.sim.profile import load_profile

        if warn := load_profile(profile).warning():
            say_line(warn)
    results = run_simulate(settings, Hooks(ready=ready, point=point, say=say))
    if as_json:
        from servetune.metrics.turns import session_fields

        stored = None if settings.store is None else not store_off  # null: --no-store
        summaries = [{**_summary(r), **session_fields(r), "stored": stored} for r in results]
        sys.stdout.write(json.dumps(summaries if settings.loads.many else summaries[0], indent=2))
        sys.stdout.write("\n")
    refused_all(results)


def refused_all(results: list[RunResult]) -> None:
    """InputError when the engine refused every request of a point (all longer than the
    context, say): a result of zero completions would read as a prediction."""
    for res in results:
        if res.records and all(r.http_status == 400 for r in res.records):
            why = res.records[0].error_detail or "refused"
            raise InputError(
                "workload",
                f"the engine refuses all {len(res.records)} requests ({why})",
                "shorter requests, or a larger max_model_len / KV cache",
            )


def calibrate(
    results: list[Path] = typer.Argument(None, help="Bench result JSON files (RunResult)."),
    engine: str = typer.Option("vllm", "--engine"),
    engine_version: str = typer.Option("unknown", "--engine-version"),
    model: str = typer.Option(..., "--model", "-m", help="Catalog name (or HF dir) served."),
    gpu: str = typer.Option(..., "--gpu", "-g", help="Hardware the runs used (e.g. cpu-host)."),
    output: Path = typer.Option(..., "--output", "-o", help="Profile JSON to write."),
    url: str | None = typer.Option(
        None, "--url", help="A running engine: run the profiling sweep against it instead."
    ),
    served_model: str | None = typer.Option(
        None, "--served-model", help="--url: model name to request (default: the first listed)."
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="The engine's knobs, key=value: the replay fit needs them."
    ),
    repeats: int = typer.Option(
        2, "--repeats", min=1, help="--url: runs of each sweep workload; the fastest is fitted."
    ),
    runs_dir: Path | None = typer.Option(
        None, "--runs-dir", help="--url: where the sweep's runs are kept (default <output>-runs)."
    ),
    from_store: list[str] = typer.Option(
        [], "--from-store", help="Stored runs to fit on: run ids, study names, last."
    ),
    db: str | None = DB_OPTION,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Fit the calibrated step-time tier by least squares on measured runs (result files,
    stored runs, or --url: a short profiling sweep against a live engine), then refine it
    by replaying those runs when the engine's knobs are known (--set, the stored runs' own
    config, or the sweep's)."""
    from servetune.cli.engine_cmd import parse_sets
    from servetune.engines.registry import adapter
    from servetune.engines.rules import check_model_config
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.results.files import check_outputs
    from servetune.sim.calibrate import fit_profile
    from servetune.sim.profile import load_results, save_profile

    if sum(map(bool, (results, url, from_store))) != 1:
        raise InputError(
            "calibrate", "give exactly one source", "result files, --url or --from-store"
        )
    keep_in = runs_dir or output.with_name(output.stem + "-runs")
    # before the sweep or the fit: neither is lost to a bad path
    check_outputs({"--output": output}, {"--runs-dir": keep_in if url else None})
    m, hw = get_model(model), get_hardware(gpu, file_hint=False)
    adapter(engine)  # an unknown engine is refused in one line, not fitted under its name
    if sets:  # the engine's start-up rules, before a sweep or a fit (as simulate checks)
        check_model_config(parse_sets(engine, sets, device=hw.kind), m, device=hw.kind)
    if url:
        from servetune.bench.reach import check_server

        check_server(url)  # fail fast with the cause, as bench does
        runs, measured = _sweep(url, served_model, repeats, keep_in, engine)
        known: list[dict | None] = [None]
        names = {r.id: r.workload_name for r in runs}
    else:
        if results:
            runs = load_results(results)
            _simulated_files(results, runs, m.name, hw.name)
            _refuse_foreign(engine, [r.target.engine for r in runs], "calibrate")
            known, field = [r.target.config for r in runs], "calibrate"
            names = {r.id: str(p) for p, r in zip(results, runs, strict=True)}
        else:
            runs, known, served = _stored_runs(from_store, db)
            _refuse_foreign(engine, served, "--from-store")
            field, names = "--from-store", {}
        _refuse_mixed_models([r.target.model for r in runs], field)
        kept = _served(runs, names, field)
        runs, known = [runs[i] for i in kept], [known[i] for i in kept]
    if not url:
        measured = runs
    # The sweep is ours, run against one engine: its knobs default when not given.
    cfg = (
        parse_sets(engine, sets, device=hw.kind)
        if url
        else _replay_config(engine, sets, known, hw.kind)
    )
    prof = fit_profile(
        runs, engine=engine, model=m.name, hardware=hw.name, engine_version=engine_version
    )
    if cfg is None:
        print("least squares only: --set the engine's knobs to refine by replay", file=sys.stderr)
    elif not all(r.requests for r in runs):
        print("least squares only: the runs keep no requests to replay", file=sys.stderr)
    else:
        from servetune.sim.calibrate import fit_by_replay, repeat_spread, replay_note

        for run in runs:  # a replay of a run its engine did not serve whole, said
            if note := replay_note(run, names.get(run.id)):
                print(note, file=sys.stderr)
        spread = repeat_spread(measured)
        prof = fit_by_replay(runs, prof, model, cfg, hardware=hw.name, spread=spread)
    save_profile(prof, output, "--output")
    _say_confidence(prof, output)
    if as_json:
        sys.stdout.write(prof.model_dump_json(indent=2) + "\n")
        return
    fit = prof.fit
    assert fit is not None
    print(f"profile {prof.key} -> {output}")
    for k, v in prof.coefficients.items():
        print(f"  {k:15s} {v * 1e3:12.6f} ms  (+/- {prof.stderr.get(k, 0) * 1e3:.6f})")
    print(f"  api_overhead    {prof.api_overhead_s * 1e3:12.3f} ms")
    if prof.ingress_s or prof.new_shape_s:
        print(
            f"  ingress {prof.ingress_s * 1e3:.3f} ms + {prof.ingress_per_token_s * 1e6:.3f} "
            f"us/token; new step size {prof.new_shape_s * 1e3:.3f} ms + "
            f"{prof.new_shape_per_token_s * 1e3:.4f} ms/token"
        )
    err = "relative RMSE" if fit.method == "least squares" else "RMS log error of the replays"
    print(
        f"  fit ({fit.method}): {fit.samples} steps, R^2 {fit.r2:.3f}, {err} "
        f"{fit.rel_rmse:.1%}, confidence {fit.confidence}"
        + (f", repeats differ by {fit.repeat_spread:.1%}" if fit.repeat_spread is not None else "")
        + (f", dropped {fit.dropped}" if fit.dropped else "")
    )


def _say_confidence(prof: Any, output: Path) -> None:
    """On stderr, loudly: a profile that is not fit for use, why, and the runs that would
    fix it (`sim.confidence`); a medium one's gaps in one line."""
    fit = prof.fit
    if fit is None or fit.confidence == "high":
        return
    err = sys.stderr
    if fit.confidence == "low":
        print(f"NOT FIT FOR USE: {output} is written, marked confidence low, and no", file=err)
        print("default picks it up (the tuner's calibration cache refuses it). Why:", file=err)
    else:
        print(f"confidence medium: usable, but the runs left gaps ({output}):", file=err)
    for why in fit.problems:
        print(f"  - {why}", file=err)
    for fix in fit.fixes:
        print(f"  fix: {fix}", file=err)


def _sweep(url: str, served_model: str | None, repeats: int, runs_dir: Path, engine: str):
    """The fidelity harness's calibration sweep against a running engine: (the runs to fit
    on, every run measured). Every run is saved as it completes, before any fitting, so
    nothing measured is lost if the fit or the process fails."""
    from servetune import validate as fd
    from servetune.engines.process import served_model_at

    err = sys.stderr
    runs = fd.run_blocks(
        url,
        served_model or served_model_at(url) or "",
        repeats=0,
        cal_repeats=repeats,
        engine=engine,
        say=lambda s: print(s, file=err, flush=True),
        keep=lambda r: fd.save_run(r, runs_dir),
    )
    print(f"{len(runs)} sweep runs kept in {runs_dir}", file=err)
    # before the pick: a run of fast errors must not pass for the least disturbed
    runs = [runs[i] for i in _served(runs, {r.id: r.workload_name for r in runs}, "--url")]
    if repeats == 1:
        return runs, runs
    print(f"fitting on the least disturbed of each workload's {repeats} runs", file=err)
    return fd.least_disturbed_per_case(runs), runs


def _replay_config(
    engine: str, sets: list[str], known: list[dict | None], device: Device = "gpu"
) -> Any:
    """The engine's knobs for the replay fit: --set, else the one config every stored run
    recorded (bench --set, tune); None when they are unknown (least squares only)."""
    from servetune.cli.engine_cmd import parse_sets
    from servetune.engines.config import EngineConfig

    if sets:
        return parse_sets(engine, sets, device=device)
    first = known[0]
    if not first or any(k != first for k in known):
        return None
    cfg = EngineConfig.model_validate(first)
    if cfg.engine != engine:
        raise InputError(
            "--engine", f"the stored runs were served by {cfg.engine}", f"--engine {cfg.engine}"
        )
    return cfg


def _simulated_files(paths: list[Path], runs: list[Any], model: str, hardware: str) -> None:
    """Simulated result files fit only as what they are: a check of the fit against the
    simulator's own known timing (the tests' self-replays). One of another model or
    hardware than the profile's is refused (a simulated Llama-3.1-8B on an H100 was fitted
    into a CPU profile of Llama-3.2-1B), and any is said on stderr: it measures nothing."""
    sims = [(p, r) for p, r in zip(paths, runs, strict=True) if r.target.sim]
    for path, run in sims:
        if (run.target.model, run.target.hardware) != (model, hardware):
            raise InputError(
                "calibrate",
                f"{path} is a simulated run of {run.target.model} on {run.target.hardware}, "
                f"not of --model {model} --gpu {hardware}",
                "give bench results of the engine you calibrate",
            )
    if sims:
        print(
            f"note: {len(sims)} of the {len(runs)} runs are simulated: the fit checks the "
            "simulator against itself, it measures no engine",
            file=sys.stderr,
        )


def _refuse_mixed_models(models: list[str | None], field: str) -> None:
    """Refuse runs of more than one served model: one profile holds one model's step
    times. A run that names none (an old result) goes with the others."""
    named = Counter(m for m in models if m)
    if len(named) > 1:
        each = ", ".join(f"{m} ({k} run{'s' * (k > 1)})" for m, k in sorted(named.items()))
        raise InputError(
            field,
            f"the {len(models)} runs served {len(named)} models: {each}",
            "fit one model at a time: give only the runs of the model --model names",
        )


def _served(runs: list[Any], names: dict[str, str], field: str) -> list[int]:
    """The indices of the runs that served a request (`sim.calibrate.served`): a run in
    which every request failed holds no step to fit, and its replay would be a load the
    engine never served; each is left out with one line on stderr, none left is refused."""
    from servetune.sim.calibrate import served

    return served(runs, lambda line: print(f"calibrate: {line}", file=sys.stderr), names, field)


def _refuse_foreign(engine: str, served: list[str | None], field: str) -> None:
    """Refuse runs another engine served: one profile holds one engine's step times. A run
    that names no engine (bench without --engine) is taken as `engine`'s."""
    others = sorted({e for e in served if e and e != engine})
    if others:
        n = sum(1 for e in served if e in others)
        raise InputError(
            field,
            f"{n} of the {len(served)} runs were served by {', '.join(others)}, not {engine}",
            f"fit one engine at a time: --engine {others[0]} for those runs alone",
        )


def _stored_runs(
    refs: list[str], db: str | None
) -> tuple[list[Any], list[dict | None], list[str | None]]:
    """Measured (bench) runs from the store, with the engine config each recorded (None
    when bench had no --set) and the engine that served it; simulated ones are skipped,
    since fitting the simulator on its own output would prove nothing."""
    from servetune.store import Store

    with Store.open(db, create=False) as store:
        infos = [store.get(rid) for rid in store.resolve(refs)]
        real = [i for i in infos if i.backend == "real"]
        runs = [store.load_result(i.id) for i in real]
    if not real:
        raise InputError("--from-store", f"no measured runs in {', '.join(refs)}", "bench first")
    return runs, [i.engine_config or None for i in real], [i.engine for i in real]
