"""What `servetune bench` and `servetune simulate` measure, from their parsed settings:
resolve the nouns (workload, SLO, tokenizer or model/hardware/profile), open the session,
build the load points, and sweep them (`measure.sweep`). The CLI only parses flags into
these settings and shows what the hooks report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from servetune.bench.client import Timeouts
from servetune.bench.reach import check_server
from servetune.bench.runner import BenchOptions
from servetune.bench.server_metrics import engine_adapter, http_fetcher
from servetune.engines.config import EngineConfig
from servetune.engines.registry import exports_metrics
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.measure.loads import SweepLoads, sweep_points
from servetune.measure.real import (
    ServerSession,
    engine_sampling,
    server_engine,
    server_software,
)
from servetune.measure.simulated import SimSession
from servetune.measure.sweep import Hooks, ResultFiles, StoreSettings, sweep
from servetune.model import get_model
from servetune.results.files import load_result
from servetune.results.schema import RunResult
from servetune.sim.profile import load_profile
from servetune.slo import SLO, load_slo
from servetune.store import RunMeta, host_info, software_info
from servetune.telemetry import DEFAULT_TELEMETRY, TelemetryOptions
from servetune.workload.materialize import Request
from servetune.workload.spec import WorkloadSpec, load_workload, parse_workload, with_lengths
from servetune.workload.tokenizer import load_tokenizer

# What bench sends, and simulate draws, when no workload file is given.
DEFAULT_WORKLOAD = {
    "name": "default-chat",
    "count": 200,
    "arrival": {"kind": "poisson", "rate": 1.0},
    "input_tokens": {"dist": "lognormal", "mean": 512, "sigma": 0.5, "min": 16, "max": 4096},
    "output_tokens": {"dist": "lognormal", "mean": 128, "sigma": 0.5, "min": 8, "max": 1024},
}


@dataclass(frozen=True)
class BenchSettings:
    """`servetune bench`: a server already running at `url`, measured at each load.
    `engine`/`config`/`launch_command` are recorded, never applied."""

    url: str
    workload: Path | None = None
    loads: SweepLoads = SweepLoads()
    max_concurrency: int | None = None  # cap on in-flight requests of open-loop points
    slo: Path | None = None
    model: str | None = None  # the name sent to the server
    tokenizer: str | None = None  # --tokenizer (None: whitespace words)
    files: ResultFiles = ResultFiles()
    store: StoreSettings | None = None  # None: --no-store
    workers: int | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    cancel_fraction: float = 0.0
    cancel_after_chunks: int = 4
    breaker_error_rate: float | None = 0.5
    scrape: bool = True
    telemetry: TelemetryOptions = DEFAULT_TELEMETRY
    engine: str | None = None
    config: EngineConfig | None = None
    launch_command: str | None = None
    continuous_usage: bool = False
    api_key: str | None = field(default=None, repr=False)  # never stored


def default_said(loads: SweepLoads) -> str:
    """The default workload as this command line runs it: the flags that replace its
    lengths, load and size are what is said (it had described the defaults under
    --input-len 200 --output-len 24 --count 16 --concurrency 1,2,4)."""
    d = DEFAULT_WORKLOAD  # its own figures, read from it
    ins, outs, arrival = d["input_tokens"], d["output_tokens"], d["arrival"]
    prompts = (
        f"prompts of {loads.input_len} tokens"
        if loads.input_len
        else f"{ins['dist']} prompts of mean {ins['mean']} tokens"
    )
    replies = f"replies of {loads.output_len or outs['mean']}"
    load = "at the loads given" if loads.swept else f"Poisson {arrival['rate']:g} req/s"
    if loads.count is not None:
        size = f"{loads.count:,} requests a point"
    elif loads.duration_s is not None:
        size = f"{loads.duration_s:g} s a point"
    else:
        size = f"{d['count']} requests"
    return f"{prompts} and {replies}, {load}, {size}"


def workload_or_default(
    path: Path | None, loads: SweepLoads, say: Callable[[str], None] | None = None
) -> WorkloadSpec:
    """The workload file at `path`, else the built-in DEFAULT_WORKLOAD (said through `say`
    when given), sized, swept and (--input-len / --output-len) fixed in length by the
    command line's loads: bench and simulate read the same one."""
    if path is not None:
        spec = load_workload(path, swept=loads.swept, sized=loads.sized)
    else:
        if say is not None:
            said = default_said(loads)
            say(f"workload: the built-in default-chat ({said}; --workload gives your own)")
        spec = parse_workload(DEFAULT_WORKLOAD, swept=loads.swept, sized=loads.sized)
    return with_lengths(spec, loads.input_len, loads.output_len)


def run_bench(s: BenchSettings, hooks: Hooks | None = None) -> list[RunResult]:
    """Measure the server at every load point (see `sweep`)."""

    hooks = hooks or Hooks()
    spec = workload_or_default(s.workload, s.loads)  # bench's docs name its default
    slo = load_slo(s.slo) if s.slo else None
    # fail fast with the cause when nothing answers at the URL (bench.reach)
    check_server(s.url, api_key=s.api_key, timeout_s=s.timeouts.connect_s or 10.0)
    if s.engine is None and s.scrape and (found := server_engine(s.url, s.api_key)):
        hooks.say(f"engine: {found}, named by its /metrics (--engine names it)")
        s = replace(s, engine=found)
    spec = engine_sampling(spec, s.engine)
    tok = load_tokenizer(s.tokenizer, s.url)
    points = sweep_points(spec, s.loads, s.max_concurrency)
    adapter = engine_adapter(s.engine) if s.engine else None
    opts = BenchOptions(
        url=s.url,
        api_key=s.api_key,
        model=s.model,
        engine=s.engine,
        config=s.config.model_dump(mode="json") if s.config is not None else None,
        timeouts=s.timeouts,
        workers=s.workers,
        save_text=s.files.save_text,
        continuous_usage=s.continuous_usage,
        cancel_fraction=s.cancel_fraction,
        cancel_after_chunks=s.cancel_after_chunks,
        breaker_error_rate=s.breaker_error_rate,
        metrics_fetch=http_fetcher(s.url, adapter) if _scrape(s) else None,
        tokenizer=tok,
    )
    session = ServerSession(opts, tok, slo, launch_command=s.launch_command, telemetry=s.telemetry)
    hooks.ready(session)
    store = replace(s.store, meta=lambda: bench_meta(s, slo)) if s.store else None
    return sweep(session, points, files=s.files, store=store, hooks=hooks)


def _scrape(s: BenchSettings) -> bool:
    """Scrape /metrics unless told not to or the named engine has none (MLX, transformers:
    their runs are client-side only, without a scrape error a second)."""
    return s.scrape and (s.engine is None or exports_metrics(s.engine))


def bench_meta(s: BenchSettings, slo: SLO | None) -> RunMeta:
    """What bench knows about every run: this host, the engine (and its config only when
    given with --set: never guessed), the launch command when given, the SLO."""

    software = software_info() | server_software(s.url, s.api_key)
    if s.engine:
        software["engine"] = s.engine
    return RunMeta(
        backend="real",
        engine_config=s.config.model_dump(mode="json") if s.config is not None else None,
        launch_command=s.launch_command,
        hardware=host_info(),
        software=software,
        slo=slo.model_dump(mode="json") if slo is not None else None,
    )


@dataclass(frozen=True)
class SimulateSettings:
    """`servetune simulate`: `config` on `model` x `gpu` under a workload file, or
    `replay`: a bench result's exact requests and load."""

    config: EngineConfig
    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm"
    hardware_file: Path | None = None
    workload: Path | None = None
    replay: Path | None = None
    loads: SweepLoads = SweepLoads()
    profile: Path | None = None
    slo: Path | None = None
    files: ResultFiles = ResultFiles()
    store: StoreSettings | None = None  # None: --no-store


def run_simulate(s: SimulateSettings, hooks: Hooks | None = None) -> list[RunResult]:
    """Simulate every load point (see `sweep`). A sweep's points are named as bench's are
    (their files `<output>-rate5.json`, `<output>-conc8.json`: a simulated run's file beside
    the bench run it predicts reads as its twin); a replay without --rate, --concurrency or
    --count sends the bench run's own requests."""

    m = get_model(s.model)
    hw = get_hardware(s.gpu, s.hardware_file)
    prof = load_profile(s.profile) if s.profile else None
    slo = load_slo(s.slo) if s.slo else None
    session = SimSession(m, hw, s.config, profile=prof, slo=slo)
    session.setup  # noqa: B018 - fail fast, one line, before any work
    hooks = hooks or Hooks()
    spec, fixed = _sim_workload(s, hooks.say)
    points = sweep_points(spec, s.loads)
    if fixed is not None and _own_requests(s):
        points = [replace(points[0], requests=fixed)]
    hooks.ready(session)
    store = replace(s.store, meta=session.run_meta) if s.store else None
    return sweep(session, points, files=s.files, store=store, hooks=hooks)


def _own_requests(s: SimulateSettings) -> bool:
    """A replay without --rate, --concurrency, --count or --duration sends the run's own
    requests; any of them asks for the workload drawn again at that load or size (with
    --duration the run's requests were sent, and the duration asked was ignored)."""
    return not s.loads.swept and not s.loads.sized


def sized_to(spec: WorkloadSpec, sent: list[Request]) -> WorkloadSpec:
    """`spec` sized to the requests a run sent: their count, no duration. A run that ended
    at its --duration kept its `duration_s`, and its replay ran a closed loop for that
    long at simulated speed: a 1 s bench of 148 requests replayed 18, saying it sent 148.
    A sessions workload is re-planned from its spec (its turns chain on simulated
    answers), so it is left as it is."""
    if spec.sessions is not None:
        return spec
    return spec.model_copy(update={"count": len(sent), "duration_s": None})


def _sim_workload(
    s: SimulateSettings, say: Callable[[str], None] | None = None
) -> tuple[WorkloadSpec, list[Request] | None]:
    """The workload to simulate, and the replayed run's requests (None: draw them): those
    it sent (`sim.calibrate.sent_requests`); `say` gets one line when that is not the
    load its engine served (`sim.calibrate.replay_note`)."""

    if s.replay is not None:
        from servetune.sim.calibrate import replay_note, sent_requests

        if s.loads.lengths:
            flag = "--input-len" if s.loads.input_len is not None else "--output-len"
            raise InputError(flag, "a replay sends its bench run's own lengths", "drop it")

        base = load_result(s.replay, "--replay")
        if not base.requests:
            raise InputError("--replay", f"{s.replay} holds no requests", "bench with -o")
        if say is not None and _own_requests(s) and (note := replay_note(base, str(s.replay))):
            say(note)
        spec, sent = WorkloadSpec.model_validate(base.workload), sent_requests(base)
        if _own_requests(s):  # those requests, not the run's --duration again
            spec = sized_to(spec, sent)
        return spec, sent
    return workload_or_default(s.workload, s.loads, say), None
