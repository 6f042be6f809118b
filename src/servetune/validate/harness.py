"""The harness's runs: one engine per harness, real runs of the cases, their replays.

Real runs and their simulated twins (the real run's exact requests replayed) are both
measured through the `measure` seam. The real runs of a harness are interleaved blocks
(`run_blocks`) and are saved one by one as they finish (`save_run`), so nothing measured
is lost.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from servetune.bench.runner import BenchOptions
from servetune.bench.server_metrics import engine_adapter, http_fetcher
from servetune.engines import testmodel
from servetune.engines.config import EngineConfig
from servetune.engines.process import EngineServer, launch
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.measure import Point, ServerSession, SimSession
from servetune.model import get_model
from servetune.results.files import write_result
from servetune.results.schema import RunResult, by_workload
from servetune.sim.calibrate import replay_inputs
from servetune.sim.profile import Profile
from servetune.validate.cases import calibration_cases, heldout_cases, is_calibration
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import ServerTokenizer

HARNESS_ENGINES = ("vllm", "llamacpp")


@dataclass(frozen=True)
class Harness:
    """What the harness runs for one engine: the config, what the engine loads, and the
    model and hardware names the simulator uses for the same thing."""

    cfg: EngineConfig
    weights: str
    model: str
    hardware: str


def check_harness_engine(engine: str) -> None:
    """One-line error for an engine the harness has no setup for (before any download)."""
    if engine not in HARNESS_ENGINES:
        raise InputError("--engine", f"no fidelity harness for {engine}", "use vllm or llamacpp")


def harness_for(engine: str) -> Harness:
    """vLLM-CPU on the generated test Llama (dummy weights, the test suite's settings), or
    llama-server on Gemma 3 270M Q4_K_M with 4 slots; the model is made/fetched once."""
    check_harness_engine(engine)
    if engine == "llamacpp":
        gguf = str(testmodel.gemma_gguf())
        return Harness(testmodel.LLAMACPP_FIDELITY_CONFIG, gguf, "gemma-3-270m", "local")
    model_dir = str(testmodel.make_llama_dir())
    return Harness(testmodel.VLLM_TEST_CONFIG, model_dir, model_dir, "cpu-host")


def run_seed(case: WorkloadSpec, repeat: int) -> int:
    """The seed of one (case, repeat) real run (`bench_real`)."""
    return (zlib.crc32(case.name.encode()) + 7919 * repeat) % 2**31


def bench_real(
    url: str,
    served_model: str,
    case: WorkloadSpec,
    engine: str = "vllm",
    scrape: bool = True,
    repeat: int = 0,
) -> RunResult:
    """One real run of `case`, measured like `bench` measures a server (`measure`),
    with the server's tokenizer for exact counts.
    Each (case, repeat) gets its own seed: prompts drawn from one seed start with the same
    tokens, and the engine's prefix cache would serve a repeat (or another case of the
    same seed) from cache, which the simulator, rightly, does not assume."""

    spec = case.model_copy(update={"api": "completions", "seed": run_seed(case, repeat)})
    opts = BenchOptions(
        url=url,
        model=served_model,
        workers=1,
        keep_text=False,
        metrics_fetch=http_fetcher(url, engine_adapter(engine)) if scrape else None,
        scrape_interval_s=0.5,
    )
    session = ServerSession(opts, ServerTokenizer(url, served_model))
    return session.measure(Point(case.name, spec))


def simulate_like(
    real: RunResult,
    model_path: str,
    cfg: EngineConfig,
    profile: Profile | None,
    hardware: str = "cpu-host",
    shapes: set[int] | None = None,
) -> RunResult:
    """Simulate the real run's exact requests (server-counted prompt tokens: BOS included)
    under its workload and the engine's config. `shapes`: the simulated engine's history
    (step sizes already run), shared across runs made against one real engine in order."""

    spec, reqs = replay_inputs(real)
    model, hw = get_model(model_path), get_hardware(hardware)
    session = SimSession(model, hw, cfg, profile=profile, shapes=shapes)
    return session.measure(Point(spec.name, spec, reqs))


def preemptions_of(res: RunResult) -> float | None:
    """Preemptions during a run: the simulator's count, or what the real engine counted
    (scraped /metrics delta); None when the run does not say."""
    if res.backend == "sim":
        return res.target.sim.preemptions if res.target.sim else None
    if res.server is None:
        return None
    return res.server.deltas.get("preemptions_total")


def run_blocks(
    url: str,
    served_model: str,
    *,
    repeats: int,
    cal_repeats: int,
    engine: str = "vllm",
    say: Callable[[str], None] = lambda s: None,
    keep: Callable[[RunResult], None] = lambda r: None,
    heldout: Sequence[WorkloadSpec] | None = None,
) -> list[RunResult]:
    """All real runs of the harness against one engine, as interleaved blocks
    (calibration r0, held-out r0, calibration r1, ...): the host drifts over minutes, and
    a profile fitted on the first minutes only would carry that drift into every held-out
    error (measured: calibration in two blocks at 15:58-16:00 ran up to 1.8x faster than
    the held-out repeats of 16:01-16:04, and every held-out figure came out 20-35% off;
    so the callers calibrate in every block, cal_repeats = repeats). `cal_repeats=0`
    runs the held-out workloads only (a profile is given);
    `repeats=0` the calibration sweep only. `keep` sees each run as soon as it is done.
    `heldout` replaces the held-out workloads (`heldout_cases()`): a test runs only those
    its assertions read."""
    held = list(heldout_cases() if heldout is None else heldout)
    runs = []
    for rep in range(max(cal_repeats, repeats)):
        cases = calibration_cases() if rep < cal_repeats else []
        cases += held if rep < repeats else []
        for case in cases:
            scrape = not is_calibration(case.name)
            res = bench_real(url, served_model, case, engine, scrape=scrape, repeat=rep)
            runs.append(res)
            keep(res)
            say(f"r{rep} {case.name}: {res.metrics.output_tok_s:.1f} tok/s")
    return runs


def least_disturbed_per_case(runs: Sequence[RunResult]) -> list[RunResult]:
    """Of each workload's repeats, the one to fit on: the lowest median end-to-end
    latency. Why: other work on a shared host only ever slows an engine down (on this
    2-core box the same sweep's batch-1 decode step took 19.6 ms in one minute and 12.8 ms
    three minutes later), so the fastest repeat is the closest to the engine's own speed.
    Latency, not throughput (`tune.calibration.least_disturbed`, for its closed loops):
    an open loop's throughput is its offered rate, whatever the engine's speed."""
    return [
        min(reps, key=lambda r: r.metrics.e2e_ms.p50 or math.inf)
        for reps in by_workload(runs).values()
    ]


def engine_version(srv: EngineServer) -> str:
    """The version a started engine reports (else the installed one's), for the profile."""
    return str(srv.settings.get("version") or srv.install_version or "unknown")


def run_live(
    h: Harness,
    *,
    repeats: int,
    cal_repeats: int,
    say: Callable[[str], None] = lambda s: None,
    keep: Callable[[RunResult], None] = lambda r: None,
) -> tuple[list[RunResult], str]:
    """Start the harness's engine, make all its runs (`run_blocks`), stop it: (runs, the
    engine's version)."""
    t0 = time.monotonic()
    with launch(h.cfg.engine, h.cfg, h.weights, device="cpu") as srv:
        version = engine_version(srv)
        say(f"{h.cfg.engine} up in {time.monotonic() - t0:.0f} s ({version})")
        runs = run_blocks(
            srv.url,
            srv.served_model,
            repeats=repeats,
            cal_repeats=cal_repeats,
            engine=h.cfg.engine,
            say=say,
            keep=keep,
        )
    return runs, version


def save_run(res: RunResult, where: str | Path) -> None:
    """One real run as `<where>/<workload>-<id>.json` (what `validate --runs` reads)."""
    d = Path(where)
    d.mkdir(parents=True, exist_ok=True)
    write_result(res, d / f"{res.workload.get('name')}-{res.id}.json", save_text=True)
