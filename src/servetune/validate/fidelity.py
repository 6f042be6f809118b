"""Fidelity: the same workloads on a real engine and in simulation, compared.

Why: a simulator is only worth its predictions. The harness runs a calibration sweep
against a live engine (closed loops at several batch sizes and prompt lengths, so the
per-step, per-prefill-token, per-decode-sequence and per-KV-token terms can be told apart),
fits the calibrated tier from those runs only, then runs *other* workloads (held out) on
the engine and in simulation with the same materialised requests, and reports the absolute
% error of output throughput, P50/P95 TTFT and P50/P95 TPOT per workload and the median
over workloads. Every real workload is measured `repeats` times and each figure is the
median of the repeats, because the host is shared and noisy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.model import get_model
from servetune.results.schema import RunResult
from servetune.sim.calibrate import fit_by_replay, fit_profile, repeat_spread
from servetune.sim.profile import Profile
from servetune.validate.cases import is_calibration
from servetune.validate.compare import (
    Figures,
    Row,
    by_workload,
    compare_runs,
    medians_over,
    noise_floor,
    verdict,
)
from servetune.validate.harness import Harness, bench_real, preemptions_of, simulate_like
from servetune.workload.spec import WorkloadSpec


def compare_case(
    url: str,
    served_model: str,
    case: WorkloadSpec,
    model_path: str,
    cfg: EngineConfig,
    profile: Profile,
    *,
    repeats: int = 3,
    keep: list[RunResult] | None = None,
) -> Row:
    """Run `case` `repeats` times for real (on its own engine) and simulate each run's
    requests on one simulated engine; the row holds the median of the real figures and of
    the simulated ones, and the most preemptions either side counted."""
    reals, sims = [], []
    shapes: set[int] = set()  # the step sizes the engine has run, repeat after repeat
    for rep in range(repeats):
        res = bench_real(url, served_model, case, cfg.engine, repeat=rep)
        if keep is not None:
            keep.append(res)
        reals.append(res)
        sims.append(simulate_like(res, model_path, cfg, profile, shapes=shapes))
    extra = {
        "preemptions_real": _most_preemptions(reals),
        "preemptions_sim": _most_preemptions(sims),
    }
    return compare_runs(case.name, reals, sims, extra)


def _most_preemptions(runs: Sequence[RunResult]) -> float | None:
    """The most preemptions any of the runs counted (None when none of them says)."""
    return max((p for r in runs if (p := preemptions_of(r)) is not None), default=None)


def compare_saved(
    runs: Sequence[RunResult],
    model_path: str,
    cfg: EngineConfig,
    profile: Profile | None = None,
    *,
    model_name: str | None = None,
    engine_version: str = "unknown",
    hardware: str = "cpu-host",
    measured: Sequence[RunResult] | None = None,
) -> tuple[Profile, list[Row], list[Row]]:
    """The harness over real runs already made (live, or saved by `save_run`): fit on the
    runs named `cal-*` (least squares, then `fit_by_replay`) unless a profile is given,
    then replay every run in the order the engine served it, carrying the simulated
    engine's step-size history, and compare per workload (median over its repeats).
    `measured`: every calibration run made, when `runs` holds only those to fit on (the
    least disturbed of each workload, as `calibrate --url` fits): the fit's repeat spread
    is read over them, as `calibrate` reads it, not over runs that no longer repeat.
    Returns (profile, calibration rows, held-out rows)."""
    runs = sorted(runs, key=lambda r: r.started_unix_s or 0.0)  # the engine's order
    by = by_workload(runs)
    if profile is None:
        cal = [r for k, v in by.items() if is_calibration(k) for r in v]
        if not cal:
            raise InputError("--runs", "no calibration runs (workloads named cal-*)", None)
        if model_name is None:
            model_name = get_model(model_path).name
        start = fit_profile(
            cal,
            engine=cfg.engine,
            model=model_name,
            hardware=hardware,
            engine_version=engine_version,
        )
        spread = repeat_spread(cal if measured is None else measured)
        profile = fit_by_replay(cal, start, model_path, cfg, hardware=hardware, spread=spread)

    shapes: set[int] = set()  # one engine ran them all: replay in the order they ran
    sims_of = {id(r): simulate_like(r, model_path, cfg, profile, hardware, shapes) for r in runs}

    def row(name: str, reals: Sequence[RunResult]) -> Row:
        sims = [sims_of[id(r)] for r in reals]
        return compare_runs(name, reals, sims, {"repeats": len(reals)})

    cal_rows = [row(k, v) for k, v in by.items() if is_calibration(k)]
    rows = [row(k, v) for k, v in by.items() if not is_calibration(k)]
    return profile, cal_rows, rows


@dataclass
class Outcome:
    """One validation: the profile used, the calibration and held-out rows, and the real
    engine against itself (`noise_floor`), which says what the targets can be judged on."""

    profile: Profile
    calibration: list[Row]
    heldout: list[Row]
    floor: list[Row]

    def medians(self) -> Figures:
        """Median absolute % error over the held-out workloads."""
        return medians_over(self.heldout)

    def verdict(self) -> tuple[str, list[str]]:
        """met / missed / too noisy, with the figures concerned (`compare.verdict`)."""
        return verdict(self.heldout, self.floor)


def validate_runs(
    runs: Sequence[RunResult],
    h: Harness,
    profile: Profile | None = None,
    *,
    engine_version: str = "unknown",
) -> Outcome:
    """The harness's verdict on real runs of `h`'s engine (`compare_saved`, plus the
    noise floor); runs with no held-out workload are refused in one line."""
    prof, cal_rows, rows = compare_saved(
        runs, h.model, h.cfg, profile, engine_version=engine_version, hardware=h.hardware
    )
    if not rows:
        raise InputError("validate", "no held-out workloads to compare (only cal-* runs)", None)
    return Outcome(prof, cal_rows, rows, noise_floor(runs))
