"""The hybrid flow's calibration: before the simulator ranks a space, its step-time tier is
fitted on the real engine, cached, and reused while it still predicts within its error.

Why: the roofline tier is a bound with stated efficiency factors, not a measurement; on a
CPU host it was ~12x off and ranked every llama.cpp config the same. So `hybrid` first runs
a short sweep on the real engine at the space's baseline config (`sweep_cases`: the study's
own requests as closed loops of 1, 2 and 4 users after one unmeasured warm-up run, each
run twice and the least disturbed kept), fits a profile on those runs (least squares, then
replay: `sim.calibrate`, what `servetune calibrate --url` does) and ranks with it.

The cache (`CalibrationCache`, under the servetune cache dir) holds one entry per
`CalibrationKey`: engine and its version, the model file served, the host CPU (and the
engine's threads, which the simulator does not model). An entry is reused until
`reuse_reason` finds a reason not to; the verify trials then check it (`judge`): when the
simulator's median throughput error on the verified configs exceeds the profile's stated
error (at most TARGET_ERROR), the entry is marked stale and the next run calibrates again.
The sweep's runs are kept (`runs_dir`): they are the reference of the host's noise floor
that the verified configs' figures are judged against (`Calibration.sweep_runs`,
`tune.simvsreal`).
The decisions are pure functions; the sweep and the files are the I/O at the edges.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servetune.engines import install
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.hardware.local import cpu_facts
from servetune.measure.backends import BackendSpec, make_backend
from servetune.measure.result import Infeasible
from servetune.model import get_model
from servetune.paths import cache_root
from servetune.results.files import load_result
from servetune.results.schema import RunResult
from servetune.sim.calibrate import fit_by_replay, fit_profile, repeat_spread, served
from servetune.sim.confidence import BATCH_COVERED, SPREAD_COVERED, Coverage
from servetune.sim.profile import Profile, load_profile, save_profile
from servetune.store import RunMeta, Store
from servetune.store.meta import host_info
from servetune.tune import simvsreal
from servetune.tune.profilecheck import BaselineCheck, replay_errors
from servetune.validate import bench_real, calibration_cases, engine_version, save_run
from servetune.workload.materialize import materialize_columns
from servetune.workload.spec import WorkloadSpec, parse_workload

if TYPE_CHECKING:
    from servetune.tune.tuner import TuneSettings

Say = Callable[[str], None]
ENTRY_KIND = "servetune-calibration"
SWEEP_USERS = (1, 2, 4)
SWEEP_SAMPLES = 2  # runs of each sweep case; the least disturbed is fitted on
# The most a profile may miss the verified configs by and still be reused: its stated
# error, but never more than the hybrid flow's fidelity target (a profile fitted on a
# noisy sweep must not be kept on the strength of its own noise).
TARGET_ERROR = simvsreal.TARGET
MAX_CHECKS = 20  # the checks an entry keeps (newest last)


# --- what a profile is cached under ----------------------------------------------------


@dataclass(frozen=True)
class CalibrationKey:
    """What a calibrated profile is valid for: the engine build, the exact model file it
    served, the host CPU (model and cores, as `hardware.local` keys its measurement) and
    the engine's threads (None: its default), which the simulator does not model: a
    profile fitted at other threads would price every step wrong."""

    engine: str
    engine_version: str
    model_file: str
    model_bytes: int
    model_mtime_ns: int
    host: str
    threads: int | None = None

    @property
    def digest(self) -> str:
        """A short stable name for the cache files."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def describe(self) -> str:
        threads = "default threads" if self.threads is None else f"{self.threads} threads"
        return (
            f"{self.engine} {self.engine_version}, {Path(self.model_file).name}, "
            f"{self.host}, {threads}"
        )


def file_identity(path: str) -> tuple[str, int, int]:
    """(resolved path, bytes, newest mtime in ns) of a model file or directory: a file
    replaced or re-downloaded is another model as far as the cache knows."""
    p = Path(path).expanduser().resolve()
    try:
        files = [p] if p.is_file() else [f for f in p.iterdir() if f.is_file()]
        stats = [f.stat() for f in files]
    except OSError as exc:
        raise InputError("--model-path", f"cannot read {p}: {exc.strerror}") from None
    return str(p), sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)


def host_key() -> str:
    """The host CPU as `hardware.local` keys its measurement: "model|cores"."""
    facts = cpu_facts()
    return f"{facts['model']}|{facts['cores']}"


def key_for(real: BackendSpec, cfg: EngineConfig) -> CalibrationKey:
    """The key of the engine, model file and host a real backend runs `cfg` on."""
    version = install.require(real.engine, real.executable).version or "unknown"
    if real.model_path is None:
        raise InputError("--model-path", f"a real {real.engine} needs the model to serve")
    path, size, mtime = file_identity(real.model_path)
    return CalibrationKey(real.engine, version, path, size, mtime, host_key(), cfg.threads)


# --- the cache entry and the decisions on it --------------------------------------------


@dataclass
class CacheEntry:
    """One cached calibration: the profile file, what it claims, what checked it since."""

    key: dict[str, Any]
    profile: str  # the profile JSON (a new file per calibration)
    stated_error: float  # the profile's own error, relative (`stated_error`)
    config: dict[str, Any]  # the engine config the sweep ran
    fitted_utc: str
    sweep_s: float  # seconds the sweep and the fit took
    runs_dir: str  # the sweep's runs as JSON
    stale: str | None = None  # why the next run must calibrate again
    checks: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kind": ENTRY_KIND, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CacheEntry:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def stated_error(profile: Profile) -> float:
    """The relative error a profile claims: after a replay fit its RMS log error of the
    replayed figures as a relative error (a log error e is a factor of exp(e): exp(e) - 1),
    else the least squares' relative RMSE of the step times."""
    fit = profile.fit
    if fit is None:
        return math.inf
    return math.expm1(fit.rel_rmse) if "replay" in fit.method else fit.rel_rmse


def reuse_reason(entry: CacheEntry | None, profile_exists: bool) -> str | None:
    """Why the cached calibration cannot be reused (None: reuse it)."""
    if entry is None:
        return "no calibration cached for this engine, model file, host and threads"
    if entry.stale:
        return f"the cached one is stale ({entry.stale})"
    if not profile_exists:
        return "the cached profile file is gone"
    return None


def tolerance(stated: float) -> float:
    """How far the verified configs may be off before the profile is stale: its stated
    error, at most TARGET_ERROR."""
    return min(stated, TARGET_ERROR)


def judge(
    errors: list[float], stated: float, noise: float | None = None
) -> tuple[float | None, str | None]:
    """(median |error| of the verified configs' throughput, why the profile is stale or
    None). The median, so one noisy real trial does not throw a good profile away; and
    within `noise`, the real engine against itself in the same study (the finalists'
    trials against their repetitions), no error is the profile's to answer for: the idle
    main job marked a 6% profile stale at 7% beside a 13% floor, and every next run paid
    for a new sweep (minutes on a busy host). Not the floor against the calibration
    sweep: that one holds the host's drift since the fit, which is what staleness is for."""
    if not errors:
        return None, None
    med = statistics.median(abs(e) for e in errors)
    tol = tolerance(stated)
    if med <= tol or (noise is not None and med <= noise):
        return med, None
    bound = (
        f"the profile's stated error {stated:.0%}"
        if tol == stated
        else f"the {tol:.0%} target (the profile states {stated:.0%})"
    )
    return med, f"the verified configs' median throughput error {med:.0%} exceeds {bound}"


def sweep_cases(workload: WorkloadSpec) -> list[WorkloadSpec]:
    """The short sweep: the study's own requests as closed loops of 1, 2 and 4 users,
    2 requests per user + 2 each (sized as the fidelity harness's calibration runs), so the
    fit sees the prompt lengths and batch sizes the study will be ranked on. Named `cal-*`
    (the harness's calibration set). A trace workload (it cannot be a closed loop) is
    swept with the harness's short-prompt calibration runs instead."""
    try:
        return [
            workload.with_load(concurrency=c, count=2 * c + 2).model_copy(
                update={"name": f"cal-study-c{c}"}
            )
            for c in SWEEP_USERS
        ]
    except ValueError:
        short = {f"cal-c{c}-p64" for c in SWEEP_USERS}
        return [c for c in calibration_cases() if c.name in short]


def needs_of(workload: WorkloadSpec) -> Coverage | None:
    """What the study's profile must have covered to rank it (`sim.confidence`): batches
    of BATCH_COVERED, prefix hits when its requests share prefixes, mixed lengths when its
    prompts (drawn as `materialize` draws them) span SPREAD_COVERED x. Never bursts: the
    study ranks at its own loads (closed loops, Poisson rates), not at the workload's
    arrival. Its sweep is its own requests, so a gap the workload does not have is none
    (the main job's LOW warning listed prefix, burst and mix runs for a workload of
    neither). None: the lengths cannot be drawn without a tokenizer (datasets, traces),
    every gap counts."""
    cols = materialize_columns(workload)
    if cols is None or len(cols) == 0:
        return None
    lengths = cols.prompt_tokens
    return Coverage(
        runs=1,
        max_batch=BATCH_COVERED,
        prefix_runs=int((cols.prefix_group >= 0).any()),
        open_loop_runs=0,
        bursty_runs=0,
        mixed_length_runs=int(lengths.max() >= SPREAD_COVERED * max(int(lengths.min()), 1)),
        fastest_ttft_s=None,
    )


# --- the files ---------------------------------------------------------------------------


class CalibrationCache:
    """The entries under `root` (default: the servetune cache's `calibration/`): one JSON
    entry per key, its profiles and its sweeps' runs beside it."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root() / "calibration"

    def entry_path(self, key: CalibrationKey) -> Path:
        return self.root / f"{key.engine}-{key.digest}.json"

    def load(self, key: CalibrationKey) -> CacheEntry | None:
        """The entry, or None when there is none or it cannot be read (then it is
        calibrated again, never trusted half-read)."""
        try:
            data = json.loads(self.entry_path(key).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("kind") != ENTRY_KIND:
            return None
        try:
            entry = CacheEntry.from_json(data)
        except TypeError:
            return None
        return entry if entry.key == asdict(key) else None

    def save(self, key: CalibrationKey, entry: CacheEntry) -> Path:
        """Written whole and renamed, so a reader never sees half an entry."""
        path = self.entry_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    def new_paths(self, key: CalibrationKey) -> tuple[Path, Path]:
        """(profile file, runs folder) of a new calibration: named by its time, so a study
        ranked on one profile never resumes on another (the profile path is part of the
        study's fingerprint)."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        base = self.root / f"{key.engine}-{key.digest}-{stamp}"
        return Path(f"{base}.profile.json"), Path(f"{base}-runs")


# --- the sweep on the real engine ----------------------------------------------------------


def least_disturbed(samples: list[RunResult]) -> RunResult:
    """The sample of a case to fit on: the one with the highest output throughput. Other
    work on the host only ever slows a run down (on a shared 2-core box one sample's TPOT
    was 15 ms and the next's 1.9 s), so the fastest is the engine's own speed, as the
    host's bandwidth is the best of its samples (`hardware.local`)."""
    return max(samples, key=lambda r: r.metrics.output_tok_s)


def run_sweep(
    real: BackendSpec,
    cfg: EngineConfig,
    cases: list[WorkloadSpec],
    *,
    say: Say,
    keep: Callable[[RunResult], None],
    stop: Callable[[list[RunResult]], bool] | None = None,
) -> tuple[list[RunResult], str]:
    """Launch the engine at `cfg`, run the first case once unmeasured (the warm-up), then
    measure each case SWEEP_SAMPLES times as `calibrate --url` does (`validate.bench_real`:
    completions, the server's tokenizer, a seed per case and repeat), in interleaved blocks
    (every case, then every case again: the host drifts over minutes), stop it. Returns
    (each case's least disturbed run, the version the engine reports); every measured run
    is kept. `stop` sees the first block (each case once) and ends the sweep there when it
    returns True (a cached profile that still predicts it, `calibrate_first`).

    Why the warm-up: the first requests after a launch pay one-time costs that no later
    request does (llama.cpp + Gemma 3 270M here, the main job's first point: TTFT 2,082
    and 525 ms for the first two requests, 94-127 ms for the next four), and the simulator
    models none of them; fitted on, they priced every prefill several times too high."""
    backend = make_backend(real)
    samples: dict[str, list[RunResult]] = {c.name: [] for c in cases}
    with backend.session(cfg) as session:
        srv = session.srv  # type: ignore[attr-defined]
        bench_real(
            srv.url, srv.served_model, cases[0], real.engine, scrape=False, repeat=SWEEP_SAMPLES
        )
        for rep in range(SWEEP_SAMPLES):
            for case in cases:
                res = bench_real(
                    srv.url, srv.served_model, case, real.engine, scrape=False, repeat=rep
                )
                keep(res)
                samples[case.name].append(res)
            if rep == 0 and stop is not None and stop([runs[0] for runs in samples.values()]):
                break
        version = engine_version(srv)
    best = []
    for name, runs in samples.items():
        pick = least_disturbed(runs)
        best.append(pick)
        m = pick.metrics
        others = ", ".join(f"{r.metrics.req_s:.2f}" for r in runs if r is not pick)
        of = f"best of {len(runs)} runs" if len(runs) > 1 else "1 run"
        other = f" (other {others})" if others else ""
        say(f"calibration: {name}: {of} {m.req_s:.2f} req/s{other}, P50 TTFT "
            f"{m.ttft_ms.p50 or 0:,.0f} ms, P50 TPOT {m.tpot_ms.p50 or 0:,.0f} ms")  # fmt: skip
    return best, version


def fit(
    runs: list[RunResult],
    real: BackendSpec,
    cfg: EngineConfig,
    version: str,
    measured: Sequence[RunResult] = (),
    needs: Coverage | None = None,
) -> Profile:
    """The calibrated tier from the sweep: least squares on the runs' inter-chunk gaps,
    then refined by replaying them through the scheduler at `cfg` (`sim.calibrate`).
    `measured`: every sample of the sweep, whose repeats tell the host's noise from a
    misfit in the verdict (`repeat_spread`); `needs`, the study's (`needs_of`)."""
    model = get_model(real.model)
    hw = get_hardware(real.hardware, real.hardware_file)
    prof = fit_profile(
        runs, engine=real.engine, model=model.name, hardware=hw.name, engine_version=version
    )
    spread = repeat_spread(measured)
    return fit_by_replay(
        runs, prof, real.model, cfg, hardware=real.hardware, spread=spread, needs=needs
    )


# --- the hybrid flow's calibration, end to end -----------------------------------------------


@dataclass
class Calibration:
    """The profile the hybrid flow ranks with: where it came from and how it did."""

    key: CalibrationKey
    entry: CacheEntry
    cache: CalibrationCache
    reused: bool
    why: str  # why it was fitted now, or that it was reused
    check: dict[str, Any] | None = None  # the verified configs' verdict (`verify`)
    # A reused profile: how it predicted this study's baseline before it ranked, and the
    # runs measured for that (`tune.profilecheck`)
    baseline_check: BaselineCheck | None = None
    fresh_runs: list[RunResult] = field(default_factory=list)

    def sim_spec(self, sim: BackendSpec) -> BackendSpec:
        """The simulator backend ranking with this profile."""
        return replace(sim, profile=self.entry.profile)

    def sweep_runs(self, baseline: EngineConfig) -> list[RunResult]:
        """The noise floor's reference (`simvsreal.floor_rows`): the baseline's runs of
        this study's check when the profile was reused (measured minutes ago, on this
        host as it is now), else the runs the profile was fitted on (each sweep case's
        least disturbed sample, read back from `runs_dir`), when the sweep ran at
        `baseline`. Empty when it ran at another config or its files are gone."""
        if self.fresh_runs:
            return list(self.fresh_runs)
        if self.entry.config != baseline.model_dump(mode="json"):
            return []
        by_case: dict[str, list[RunResult]] = {}
        for path in sorted(Path(self.entry.runs_dir).glob("*.json")):
            try:
                run = load_result(path)
            except InputError:
                continue
            by_case.setdefault(str(run.workload.get("name")), []).append(run)
        return [least_disturbed(runs) for runs in by_case.values()]

    def verify(
        self,
        errors: list[float],
        say: Say,
        figures: dict[str, Any] | None = None,
        noise: float | None = None,
    ) -> None:
        """After the verify trials: judge the profile on the verified configs' throughput
        errors beside this study's own noise (`judge`), record the check (with the judged
        figures' verdicts, `simvsreal.verdicts`) in the entry and mark it stale when it
        missed."""
        med, stale = judge(errors, self.entry.stated_error, noise)
        if med is None:
            return
        self.check = {
            "at_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "configs": len(errors),
            "median_error": med,
            "max_error": max(abs(e) for e in errors),
            "stated_error": self.entry.stated_error,
            "noise": noise,
            "stale": stale,
            "figures": figures or {},
        }
        self.entry.checks = [*self.entry.checks, self.check][-MAX_CHECKS:]
        if stale:
            self.entry.stale = stale
        with contextlib.suppress(OSError):
            self.cache.save(self.key, self.entry)
        say(self.check_line())

    def check_line(self) -> str:
        """One line for the output: how the profile did on the verified configs."""
        c = self.check
        if c is None:
            return "calibration check: no verified config to compare"
        tol, noise = tolerance(c["stated_error"]), c.get("noise")
        if c["stale"]:
            verdict = f"marked stale, the next run calibrates again: {c['stale']}"
        elif c["median_error"] <= tol or noise is None:
            verdict = f"within {tol:.0%}: kept"
        else:
            verdict = (
                f"above {tol:.0%} but within this host's noise, {noise:.0%} (the finalists "
                "against their own repetitions): kept"
            )
        return (
            f"calibration check: median throughput error {c['median_error']:.0%} (max "
            f"{c['max_error']:.0%}) on {c['configs']} verified configs, {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        return {
            "key": asdict(self.key),
            "profile": e.profile,
            "reused": self.reused,
            "why": self.why,
            "stated_error": e.stated_error,
            "fitted_utc": e.fitted_utc,
            "config": e.config,
            "runs_dir": e.runs_dir,
            "check": self.check,
            "baseline_check": self.baseline_check.to_json() if self.baseline_check else None,
        }

    def line(self) -> str:
        """One line for the output: what the simulator ranked with."""
        e = self.entry
        how = f"reused ({self.why})" if self.reused else f"fitted now ({self.why})"
        return (
            f"simulator calibrated on the real engine: profile {how}, fitted "
            f"{e.fitted_utc} on {self.key.describe()}, stated error {e.stated_error:.0%}"
        )


def check_cached(
    runs: list[RunResult], entry: CacheEntry, real: BackendSpec, baseline: EngineConfig
) -> BaselineCheck:
    """How the cached profile predicts `runs` (this study's baseline, measured now),
    held to its tolerance (`tune.profilecheck`)."""
    model = get_model(real.model)
    hw = get_hardware(real.hardware, real.hardware_file)
    errors = replay_errors(runs, load_profile(entry.profile), model, hw, baseline)
    names = tuple(str(r.workload.get("name")) for r in runs)
    return BaselineCheck(errors, tolerance(entry.stated_error), names)


def calibrate_first(
    real: BackendSpec,
    sim: BackendSpec,
    baseline: EngineConfig,
    *,
    cache: CalibrationCache,
    force: bool,
    say: Say,
    store_run: Callable[[RunResult, RunMeta], None] | None = None,
) -> Calibration:
    """The cached calibration for this engine, model file and host when it still
    predicts this study's baseline measured now (the sweep's first block, `check_cached`),
    else a new one: the rest of the short sweep at the space's baseline, the fit, the
    entry. Raises `measure.Infeasible` when the engine does not start at the baseline."""
    key = key_for(real, baseline)
    entry = cache.load(key)
    why = "asked to recalibrate" if force else None
    if why is None:
        why = reuse_reason(entry, entry is not None and Path(entry.profile).exists())
    study = parse_workload(sim.workload)
    cases = sweep_cases(study)
    names = ", ".join(c.name for c in cases)
    checked: list[BaselineCheck] = []
    stop: Callable[[list[RunResult]], bool] | None = None
    if why is None and entry is not None:
        cached = entry
        say(f"calibration: a profile is cached (fitted {entry.fitted_utc}, stated error "
            f"{entry.stated_error:.0%}); reused only if it predicts this study's baseline "
            f"now: one run of each sweep case first ({names})")  # fmt: skip

        def stop(block: list[RunResult]) -> bool:
            checked.append(check_cached(block, cached, real, baseline))
            say(checked[-1].line())
            return checked[-1].holds

    else:
        n = baseline.threads
        at = "the baseline" if n is None else f"the baseline, threads={n}"
        say(f"calibration: {why}: a short sweep on the real engine at {at} "
            f"({names}; {SWEEP_SAMPLES} runs each)")  # fmt: skip
    t0 = time.monotonic()
    profile_path, runs_dir = cache.new_paths(key)

    measured: list[RunResult] = []

    def keep(res: RunResult) -> None:
        measured.append(res)
        save_run(res, runs_dir)  # kept before any fitting: nothing measured is lost
        if store_run is not None:
            store_run(res, calibration_meta(res, key))

    runs, version = run_sweep(real, baseline, cases, say=say, keep=keep, stop=stop)
    if checked and entry is not None:
        record = {
            "kind": "baseline",
            "at_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runs_dir": str(runs_dir),
            **checked[0].to_json(),
        }
        entry.checks = [*entry.checks, record][-MAX_CHECKS:]
        if checked[0].holds:
            with contextlib.suppress(OSError):
                cache.save(key, entry)
            how = f"it predicts this study's baseline within {checked[0].tolerance:.0%}"
            cal = Calibration(key, entry, cache, reused=True, why=how,
                              baseline_check=checked[0], fresh_runs=runs)  # fmt: skip
            say(f"calibration: {cal.line()} [{time.monotonic() - t0:.0f}s]")
            return cal
        why = checked[0].reason()
    say("calibration: fitting the step-time profile (least squares, then replay)")
    # a sweep run in which no request was served has no step to fit: left out, said; none
    # left is an InputError, and the study ranks on the roofline tier (`for_hybrid`)
    names = {r.id: r.workload_name for r in runs}
    kept = served(runs, lambda line: say(f"calibration: {line}"), names, "calibration")
    prof = fit([runs[i] for i in kept], real, baseline, version, measured, needs_of(study))
    save_profile(prof, profile_path)
    new = CacheEntry(
        key=asdict(key),
        profile=str(profile_path),
        stated_error=stated_error(prof),
        config=baseline.model_dump(mode="json"),
        fitted_utc=prof.created_utc,
        sweep_s=time.monotonic() - t0,
        runs_dir=str(runs_dir),
        checks=entry.checks[-MAX_CHECKS:] if checked and entry is not None else [],
        # A fit that is not fit for use ranks this study only, said loudly; the cache
        # never offers it as the default for the next one (`Profile.fit_for_use`).
        stale=None if prof.fit_for_use else "its fit has low confidence",
    )
    if warn := prof.warning():
        say(f"calibration: {warn}")
    cache.save(key, new)
    assert why is not None
    cal = Calibration(key, new, cache, reused=False, why=why,
                      baseline_check=checked[0] if checked else None)  # fmt: skip
    say(f"calibration: {cal.line()} [{new.sweep_s:.0f}s]")
    return cal


def for_hybrid(
    settings: TuneSettings, store: Store | None, say: Say
) -> tuple[Calibration | None, str | None]:
    """The hybrid flow's first step: calibrate (or reuse) and point the settings'
    simulator at the profile, before anything ranks. Returns (the calibration, a note).
    A profile the user gave (--profile, any mode that simulates) is used as given, its
    confidence in the note and a low one's warning said (`given_profile_note`); a
    calibration that cannot run (the engine does not start at the baseline) leaves the
    simulator on its roofline tier, said in the note, and the study goes on."""
    sim, real = settings.sim, settings.real
    if sim is not None and sim.profile:
        return None, given_profile_note(sim.profile, say, hybrid=settings.mode == "hybrid")
    if settings.mode != "hybrid" or sim is None or real is None:
        return None, None
    try:
        cal = calibrate_first(
            real,
            sim,
            settings.work_base(),  # the baseline, at a busy host's fitted threads
            cache=CalibrationCache(settings.calibration_dir),
            force=settings.recalibrate,
            say=say,
            store_run=store_writer(store, say, "calibration") if store is not None else None,
        )
    except (Infeasible, InputError) as exc:
        why = exc.reason if isinstance(exc, Infeasible) else exc.one_line()
        return None, f"calibration failed ({why}): the simulator ranked on its roofline tier"
    settings.sim = cal.sim_spec(sim)
    return cal, None


def given_profile_note(path: str, say: Say, *, hybrid: bool = False) -> str:
    """The note of a study ranked with a profile the user gave: its path and confidence,
    and, for a low one, its warning (`Profile.warning`), which is also said at once. A
    low profile used to rank a study with no word in the output or its --json notes."""
    prof = load_profile(path)  # a bad profile: one line, before anything ranks
    conf = prof.fit.confidence if prof.fit is not None else "not stated"
    how = "not calibrated, " if hybrid else ""
    note = f"the simulator ranks with the given profile {path} ({how}confidence {conf})"
    if warn := prof.warning():
        say(f"simulator: {warn}")
        note += f": {warn}"
    return note


def calibration_meta(res: RunResult, key: CalibrationKey) -> RunMeta:
    """A sweep run's record: a study of its own (`calibration-<engine>-<digest>`, tag
    `calibration`)."""
    return RunMeta(
        backend="real",
        study=f"calibration-{key.engine}-{key.digest}",
        study_kind="calibration",
        tags=["calibration"],
        model=key.model_file,
        engine_config=res.target.config or None,
        hardware=host_info(),
        software={"engine": key.engine, "engine_version": key.engine_version},
    )


def store_writer(store: Store, say: Say, what: str) -> Callable[[RunResult, RunMeta], None]:
    """Runs measured before a study's trials (the calibration sweep, the host check) into
    the experiment store too, each with the record its caller gives; a store that fails is
    said once (`what` names the runs) and left alone: the study goes on."""
    failed: list[str] = []

    def write(res: RunResult, meta: RunMeta) -> None:
        if failed:
            return
        try:
            store.save_result(res, meta)
        except Exception as exc:  # noqa: BLE001 - storing comes second to measuring
            failed.append(str(exc))
            say(f"{what}: runs not stored ({str(exc).splitlines()[0][:120]})")

    return write


__all__ = [
    "CacheEntry",
    "Calibration",
    "CalibrationCache",
    "CalibrationKey",
    "calibrate_first",
    "calibration_meta",
    "check_cached",
    "file_identity",
    "fit",
    "for_hybrid",
    "given_profile_note",
    "host_key",
    "judge",
    "key_for",
    "least_disturbed",
    "reuse_reason",
    "run_sweep",
    "stated_error",
    "store_writer",
    "sweep_cases",
    "tolerance",
]
