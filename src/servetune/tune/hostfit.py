"""Fit a CPU engine's threads to the cores this host leaves it, before anything else is
verified (seed 003 §13: low utilisation, "check the CPU" first; seed 000 §8: one change
at a time from the baseline).

Why first, not in the blind phase's turn: the simulator cannot tell a llama.cpp config's
threads apart (its profile is fitted at one setting), so `threads` waits for the real
engine, after the simulator's picks; on a busy host that turn never comes. Beside one
CPU hog on a 2-core host the main job's real trials at llama.cpp's default threads (all
cores) ran P95 TPOT ~1,000 ms, each trial ~140 s, and the budget was spent before
`threads=1` could run (the note said "threads=1 on the real engine skipped"); the winner
it named carried the 50x slower threads. Measured right after the baseline, the fit is
decided in one short trial, and the simulator's picks run with it when it wins.

Before the study, too (`check_host`): what runs before the trials (the calibration sweep,
the SLO probe) ran at the default threads on that host: ~400 s of the main job's ~750 s
beside the hog, a profile fitted on the slow engine (marked stale when the fitted threads
then served 10x faster) and an SLO derived from it (P95 TTFT <= 11 s). So when other
processes already hold half a core or more as the study begins, the baseline and the
threads that fit the cores they leave serve a few of the study's requests first, and
when the fit is clearly faster the study's pre-trial measurements run with it
(`TuneSettings.work_base`). The trials still measure the baseline as it is: it stays the
reference every "better" is said against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.measure.backends import BackendSpec
from servetune.measure.result import Infeasible
from servetune.results.schema import RunResult
from servetune.store import RunMeta
from servetune.store.meta import host_info
from servetune.telemetry.contention import MIN_OTHERS, free_cores
from servetune.telemetry.host import others_now
from servetune.tune.executors import backend_for
from servetune.tune.space import SearchSpace
from servetune.tune.trial import TrialResult

CHECK_REQUESTS = 3  # of the study's requests, one at a time, per config
FASTER = 1.25  # the fit is kept when it serves 25% more req/s: beyond a short run's noise
SAMPLE_S = 2.0  # seconds the host is sampled before the check


def threads_for_host(base: TrialResult, space: SearchSpace) -> int | None:
    """The `threads` value to measure next to the baseline: the largest the space offers
    within the cores the others left free, when the baseline's run showed other processes
    holding cores its threads wanted (`telemetry.contention`, carried in the point's
    signals). None when `threads` is not a knob of the space, the host had the cores, or
    the baseline already runs that few. Whether the simulator models threads does not
    matter: neither its profile nor its roofline knows the host's other processes."""
    if "threads" not in space.knobs:
        return None
    free = next((int(p.signals["free_cores"]) for p in base.points if "free_cores" in p.signals), 0)
    if not free:
        return None
    now = base.cfg.threads  # None: the engine's default, all cores
    if now is not None and now <= free:
        return None
    return _largest_within(space, free)


def _largest_within(space: SearchSpace, free: int) -> int | None:
    fits = [v for v in space.knobs["threads"] if isinstance(v, int) and v <= free]
    return max(fits) if fits else None


def early_threads(space: SearchSpace, cores: int, others: float) -> int | None:
    """Before any engine runs: the `threads` to check against the baseline's, or None
    (not a knob, the others hold under half a core, or the baseline's threads already
    fit the cores they leave; its default, None, is all cores)."""
    if "threads" not in space.knobs or others < MIN_OTHERS:
        return None
    free = free_cores(cores, others)
    now = space.baseline_config().threads or cores
    return None if now <= free else _largest_within(space, free)


@dataclass(frozen=True)
class HostCheck:
    """The host before the study, and the baseline against the threads that fit it: each
    config's req/s over CHECK_REQUESTS of the study's requests, one at a time."""

    cores: int
    others: float
    threads: int
    base_req_s: float
    fit_req_s: float

    @property
    def kept(self) -> bool:
        return self.fit_req_s > 0 and self.fit_req_s >= FASTER * self.base_req_s

    def line(self) -> str:
        verdict = (
            "the calibration, the SLO probe and the simulator's picks run at "
            f"threads={self.threads}"
            if self.kept
            else f"not {FASTER - 1:.0%} faster: the study runs at the baseline's threads"
        )
        return (
            f"host check: other processes held {self.others:.1f} of {self.cores} cores as the "
            f"study began; {CHECK_REQUESTS} of its requests one at a time: the baseline "
            f"{self.base_req_s:.3g} req/s, threads={self.threads} (the cores left free) "
            f"{self.fit_req_s:.3g} req/s: {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "others_cores": round(self.others, 3),
            "threads": self.threads,
            "baseline_req_s": self.base_req_s,
            "fit_req_s": self.fit_req_s,
            "kept": self.kept,
            "text": self.line(),
        }


def check_meta(cfg: EngineConfig, engine: str) -> RunMeta:
    """A host check's run: a study of its own (`host-check-<engine>`, tag `host-check`)."""
    return RunMeta(
        backend="real",
        study=f"host-check-{engine}",
        study_kind="host-check",
        tags=["host-check"],
        engine_config=cfg.model_dump(mode="json", exclude_defaults=True),
        hardware=host_info(),
        software={"engine": engine},
    )


def check_host(
    real: BackendSpec,
    space: SearchSpace,
    *,
    say: Callable[[str], None],
    keep: Callable[[RunResult, RunMeta], None] | None = None,
    sample: Callable[[float], tuple[int, float]] | None = None,
) -> HostCheck | None:
    """Sample the host (`telemetry.host.others_now`); when others hold cores the
    baseline's threads want, measure the baseline and the threads that fit
    (`early_threads`), each launched on its own, and say what was found. None: nothing to
    check, or the check could not run (the study then goes on at the baseline's threads,
    as before). A space whose `threads` cannot go below the baseline's is not sampled."""
    lowest = min((v for v in space.knobs.get("threads", []) if isinstance(v, int)), default=None)
    now = space.baseline_config().threads
    if lowest is None or (now is not None and now <= lowest):
        return None
    cores, others = (sample or others_now)(SAMPLE_S)
    fit = early_threads(space, cores, others)
    if fit is None:
        return None
    base = space.baseline_config()
    say(
        f"host check: other processes hold {others:.1f} of {cores} cores: the baseline and "
        f"threads={fit} serve {CHECK_REQUESTS} of the study's requests one at a time first"
    )
    spec = replace(real, workload={**real.workload, "count": CHECK_REQUESTS}, per_user=1)
    backend = backend_for(spec)
    rates = []
    for cfg in (base, base.with_(threads=fit)):
        try:
            with backend.session(cfg) as sess:
                point, res = backend.probe(sess, "concurrency", 1.0)
        except Infeasible as exc:
            say(f"host check: not run ({exc.reason}): the study runs at the baseline's threads")
            return None
        if keep is not None:
            keep(res, check_meta(cfg, real.engine))
        rates.append(point.req_s)
    got = HostCheck(cores, others, fit, rates[0], rates[1])
    say(got.line())
    return got


def contention_of(base: TrialResult) -> str:
    """What the baseline's run showed of the host (for the note), or ""."""
    return next(
        (str(p.signals["contention"]) for p in base.points if "contention" in p.signals), ""
    )
