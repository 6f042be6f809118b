"""The tuning loop (seed 003 §14, stages 3-6 in miniature): rank configs with a strategy
on one backend, verify the best on the real engine (hybrid), re-run the finalists for
confidence intervals, find the OOM edge and step one safe step back, explain the winner,
and record everything in the study. I/O lives here; the maths is in the modules it calls.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure.backends import BackendSpec
from servetune.measure.result import PointResult
from servetune.slo import HostRule, parse_slo
from servetune.status import RunStatus, TrialStatus
from servetune.store import Store
from servetune.tune import simvsreal, timeplan
from servetune.tune.calibration import Calibration, for_hybrid, store_writer
from servetune.tune.executors import TrialTask, backend_for, make_executor, recorder_for
from servetune.tune.explain import explain, explain_shortfall
from servetune.tune.hostfit import HostCheck, check_host, contention_of, threads_for_host
from servetune.tune.hostslo import HostSLO, probe_host, slowed_since
from servetune.tune.objective import Objective, gpus_of
from servetune.tune.oomedge import OOMEdge, find_edge, step_back
from servetune.tune.selection import (
    beats,
    default_budget,
    diverse_top,
    held_in_repeats,
    merit,
    pick_winner,
    rank,
    sim_blind_knobs,
)
from servetune.tune.shortfall import Shortfall, closest
from servetune.tune.space import MEMORY_KNOBS, SearchSpace, config_key, config_label
from servetune.tune.stats import mean_ci
from servetune.tune.strategies import make_strategy
from servetune.tune.study import TUNE_KIND, fingerprint, open_study
from servetune.tune.sweetspot import analyse, doubling
from servetune.tune.trial import SearchSettings, TrialResult, run_points

Say = Callable[[str], None]
MODES: tuple[str, ...] = ("sim", "real", "hybrid")


@dataclass
class TuneSettings:
    space: SearchSpace
    mode: str  # sim | real | hybrid
    objective: Objective
    search: SearchSettings
    sim: BackendSpec | None = None
    real: BackendSpec | None = None
    strategy: str = "bayes"
    budget: int | None = None  # trials of the ranking phase (None: the strategy decides)
    seed: int = 0
    top_k: int = 3
    finalists: int = 2
    repeats: int = 3
    start_index: int = 0
    executor: str = "local"
    address: str | None = None
    num_cpus: int | None = None
    db: str | None = None
    study: str | None = None
    fresh: bool = False
    time_budget_s: float | None = None
    edge: bool = True
    verbose: bool = True
    host_slo: HostRule | None = None  # derive the SLO from an idle probe on this host
    # hybrid: where calibrated simulator profiles are cached (None: the servetune cache),
    # and whether to calibrate again even if the cached one still holds (tune.calibration)
    calibration_dir: str | None = None
    recalibrate: bool = False
    # the threads the host check fitted to a busy host (`tune.hostfit.check_host`)
    host_threads: int | None = None

    def work_base(self) -> EngineConfig:
        """What the measurements before the trials run (the calibration sweep, the SLO
        probe): the baseline, at the threads fitted to a busy host when the host check
        kept them. The trials still measure the baseline itself."""
        base = self.space.baseline_config()
        return base.with_(threads=self.host_threads) if self.host_threads else base

    def checks_host(self) -> bool:
        """Whether the host check can change what runs before the trials: a real engine
        calibrated here (hybrid, no profile given) or probed for the SLO."""
        if self.real is None or self.mode == "sim" or self.host_threads:
            return False
        calibrates = self.mode == "hybrid" and not (self.sim and self.sim.profile)
        return calibrates or self.host_slo is not None

    def fingerprint_parts(self) -> dict[str, Any]:
        return {
            "space": self.space.to_json(),
            "mode": self.mode,
            "objective": [self.objective.kind, self.objective.gpu_hour_usd],
            "search": [
                self.search.load_kind,
                self.search.lattice,
                self.search.fixed_load,
                self.search.max_probes,
            ],
            "sim": self.sim,
            "real": self.real,
            "strategy": self.strategy,
            "budget": self.budget,
            "seed": self.seed,
            **({"host_slo": self.host_slo.model_dump()} if self.host_slo else {}),
            **({"host_threads": self.host_threads} if self.host_threads else {}),
        }


# What each part of a study's fingerprint is, in the user's words (a refused resume names
# the parts that differ).
PART_NAMES = {
    "mode": "--backend",
    "search": "the load search (--load, --max-load, --max-probes)",
    "sim": "the simulated engine (model, GPU, workload, SLO, profile)",
    "real": "the real engine (model, workload, SLO)",
    "strategy": "--strategy",
    "budget": "--trials",
    "seed": "--seed",
    "objective": "--objective",
    "host_slo": "the host-derived SLO",
    "host_threads": "the threads the host check fitted to a busy host",
}


class NothingMeasured(InputError):
    """Every config was skipped by the planner or failed to start: there is nothing to
    recommend, not even a best effort (a config that runs but misses the SLO is one)."""

    def __init__(self, outcome: TuneOutcome) -> None:
        self.outcome = outcome
        super().__init__(
            "--space",
            f"no config could be measured ({len(outcome.ranked)} skipped or infeasible, "
            f"study {outcome.study})",
            "see each config's reason above; widen the space or fix the engine setup",
        )


@dataclass
class TuneOutcome:
    study: str
    db: str
    mode: str
    objective: Objective
    knobs: list[str]
    ranked: list[TrialResult] = field(default_factory=list)
    sim_ranked: list[TrialResult] = field(default_factory=list)
    winner: TrialResult | None = None
    baseline: TrialResult | None = None
    recommended: dict[str, Any] | None = None
    edges: list[OOMEdge] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    sim_vs_real: list[dict[str, Any]] = field(default_factory=list)
    # hybrid: per judged figure, the median |error|, the host's floor, the verdict
    sim_error: dict[str, dict[str, Any]] = field(default_factory=dict)
    report_runs: list[str] = field(default_factory=list)  # what the report should show
    report_path: Path | None = None  # set by whoever writes that report (the CLI)
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    slo: dict[str, Any] = field(default_factory=dict)  # what every point was judged by
    host_slo: HostSLO | None = None  # how that SLO was derived from this host
    slo_met: bool = True  # False: `winner` is the best effort, the closest to the SLO
    shortfall: Shortfall | None = None  # the best effort's distance to the SLO
    calibration: Calibration | None = None  # hybrid: the profile the simulator ranked with
    host_check: HostCheck | None = None  # a busy host's check before the study

    def to_json(self, full: bool = False) -> dict[str, Any]:
        def t(x: TrialResult | None) -> dict[str, Any] | None:
            if x is None:
                return None
            d = x.to_json()
            if not full and x.status == TrialStatus.OK:
                d.pop("log_tail", None)
            return d

        return {
            "study": self.study,
            "db": self.db,
            "mode": self.mode,
            "objective": self.objective.kind,
            "slo": self.slo,
            "slo_derived": self.host_slo.to_json() if self.host_slo else None,
            "slo_met": self.slo_met,
            "winner": t(self.winner),
            "shortfall": self.shortfall.to_json() if self.shortfall else None,
            "baseline": t(self.baseline),
            "recommended": self.recommended,
            "explanation": self.explanation,
            "oom_edges": [e.to_json() for e in self.edges],
            "sim_vs_real": self.sim_vs_real,
            "sim_error": self.sim_error,
            "ranked": [t(x) for x in self.ranked[: 200 if full else 20]],
            "sim_ranked_top": [t(x) for x in self.sim_ranked[:10]],
            "report": str(self.report_path) if self.report_path else None,
            "notes": self.notes,
            "counts": self.counts,
            "calibration": self.calibration.to_json() if self.calibration else None,
            "host_check": self.host_check.to_json() if self.host_check else None,
            "elapsed_s": round(self.elapsed_s, 2),
        }


class Tuner:
    def __init__(self, settings: TuneSettings, say: Say | None = None) -> None:
        self.s = settings
        self.say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        if settings.mode not in MODES:
            raise InputError(
                "--backend", f"unknown backend {settings.mode!r}", "sim, real or hybrid"
            )
        self.store = Store.open(settings.db)
        self.db = settings.db or self.store.url
        # a busy host: the threads that fit it, checked first (tune.hostfit)
        self.host_check = None
        if settings.checks_host():
            write = store_writer(self.store, self.say, "host check")
            self.host_check = check_host(settings.real, settings.space, say=self.say, keep=write)
            if self.host_check is not None and self.host_check.kept:
                settings.host_threads = self.host_check.threads
        # hybrid: the simulator is calibrated on the real engine before anything ranks,
        # and the study is named with the profile it ranks with (tune.calibration)
        self.calibration, calibration_note = for_hybrid(settings, self.store, self.say)
        self.t0 = time.monotonic()  # the time budget is the trials': it starts here
        budget = settings.time_budget_s
        self.deadline = None if budget is None else time.time() + budget
        name = settings.study or f"tune-{fingerprint(settings.fingerprint_parts())}"
        self.study = open_study(
            self.store,
            name,
            fingerprint(settings.fingerprint_parts()),
            {"mode": settings.mode, "strategy": settings.strategy, "seed": settings.seed},
            settings.fresh,
            named=settings.study is not None,
            parts={PART_NAMES.get(k, k): v for k, v in settings.fingerprint_parts().items()},
        )
        self.knobs = list(settings.space.knobs)
        self.executor = make_executor(settings.executor, settings.address, settings.num_cpus)
        self.trials: dict[tuple[str, str], TrialResult] = {}  # (backend, key) -> result
        self.notes: list[str] = [calibration_note] if calibration_note else []
        if self.host_check is not None:
            self.notes.append(self.host_check.line())
        self.blind: list[str] = []  # knobs the simulator does not model (hybrid)
        self.untimed_s = 0.0  # seconds outside the trials' time budget (the SLO probe)

    # -- helpers ------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def time_left(self) -> float | None:
        b = self.s.time_budget_s
        return None if b is None else b - (self.elapsed() - self.untimed_s)

    def _untimed(self, seconds: float) -> None:
        """Time spent before the trials (the SLO probe) is not the trials' budget."""
        self.untimed_s += seconds
        if self.deadline is not None:
            self.deadline += seconds

    def label(self, cfg: EngineConfig) -> str:
        base = self.s.space.baseline_config()
        lab = config_label(cfg, self.knobs)
        return f"{lab} (baseline)" if config_key(cfg) == config_key(base) else lab

    def _task(
        self, spec: BackendSpec, cfg: EngineConfig, start: int, deadline: float | None = None
    ) -> TrialTask:
        """A trial of `cfg`; a real one stops starting load points past `deadline` (unix s;
        None: the budget's end less the finalists' reserve)."""
        if deadline is None and spec.kind == "real" and self.deadline is not None:
            deadline = self.deadline - self._reserve()
        return TrialTask(
            backend=spec,
            db=self.db,
            study=self.study,
            objective=self.s.objective,
            search=self.s.search,
            config=cfg.model_dump(mode="json"),
            label=self.label(cfg),
            start_index=start,
            verbose=self.s.verbose and spec.kind == "real",
            deadline_unix_s=deadline if spec.kind == "real" else None,
            cold_index=self.s.start_index,
        )

    def _start_index(self, kind: str) -> int:
        """Warm start for rate searches: the best capacity so far (the lattice keeps every
        trial's answer independent of it; one that fails restarts at the cold start,
        `TuneSettings.start_index`). Concurrency always doubles from 1 (the sweet spot
        needs the low points)."""
        if self.s.search.load_kind != "rate":
            return self.s.start_index
        caps = [
            t.capacity_load or t.capacity
            for (b, _), t in self.trials.items()
            if b == kind and t.capacity
        ]
        if not caps:
            return self.s.start_index
        return self.s.search.lattice.index_of(max(caps))

    def run_batch(
        self, spec: BackendSpec, cfgs: list[EngineConfig], deadline: float | None = None
    ) -> list[TrialResult]:
        tasks = [self._task(spec, c, self._start_index(spec.kind), deadline) for c in cfgs]
        out = []
        for t in self.executor.map(tasks):
            self.trials[(spec.kind, t.key)] = t
            self._progress(t)
            out.append(t)
        return out

    def _progress(self, t: TrialResult) -> None:
        if self.s.mode == "hybrid" and t.backend == "sim":
            return  # summarised after the ranking
        n = len({k for (b, k) in self.trials if b == t.backend})
        fresh = t.measured or t.launched or t.status == TrialStatus.SKIPPED
        cached = "" if fresh else ", from the store"
        cap = self.s.objective.capacity_of(t)
        what = (
            f"{self.s.objective.show(t.score)}"
            + (f" (capacity {'>=' if t.capacity_is_lower_bound else ''}{cap:.3g})" if cap else "")
            if t.status == TrialStatus.OK and t.capacity is not None
            else f"{t.status}: {t.reason[:160]}"
        )
        self.say(
            f"[{self.elapsed():6.1f}s] {t.backend} trial {n}: {t.label}: {what}"
            f" [{t.elapsed_s:.1f}s{cached}]"
        )

    # -- phases -------------------------------------------------------------------------

    def search_phase(self, spec: BackendSpec) -> list[TrialResult]:
        """Baseline first, then the strategy's points until it or the budget stops."""
        space = self.s.space
        base = space.baseline_config()
        budget = self.s.budget
        if budget is None:
            budget = default_budget(self.s.strategy, len(space.valid_points()))
        start = space.point_of(base)
        strat = make_strategy(self.s.strategy, space, budget, self.s.seed, start)
        results = self.run_batch(spec, [base])
        b = results[0]
        strat.tell(start, b.score if b.status == TrialStatus.OK else None)
        real = spec.kind == "real"
        while True:
            if real and self._out_of_time(spec.kind):
                break
            n = self.executor.parallel if not real or self.executor.name == "ray" else 1
            batch = strat.ask(n)
            if not batch:
                break
            known = {t.key: t for t in results}
            new = [p for p in batch if config_key(space.config(p)) not in known]
            trials = self.run_batch(spec, [space.config(p) for p in new])
            known.update({t.key: t for t in trials})
            results.extend(trials)
            for p in batch:  # a point equal to one already run (the baseline) is not rerun
                t = known[config_key(space.config(p))]
                strat.tell(p, t.score if t.status == TrialStatus.OK else None)
        if getattr(strat, "steps", None):
            kept = ", ".join(f"{s['knob']}={s['kept']}" for s in strat.steps)  # type: ignore[attr-defined]
            self.notes.append(f"one-at-a-time kept: {kept}")
        return results

    def _point_s(self) -> float:
        """Mean seconds per measured real load point so far."""
        real = [t for (b, _), t in self.trials.items() if b == "real" and t.measured]
        pts = sum(t.measured for t in real)
        return sum(t.elapsed_s for t in real) / pts if pts else 0.0

    def _reserve(self) -> float:
        """Time kept back for the finalists' repetitions (a must: the interval)."""
        if self.s.mode == "sim":
            return 0.0
        # the baseline is re-run beside the finalists, or the best other config when the
        # baseline is the only one (`finalists_of`); kept even when it misses the SLO: the
        # reserve is a bound
        finalists = self.s.finalists + 1 if self.s.finalists > 0 else 0
        return timeplan.reserve_s(finalists, self.s.repeats, self._point_s())

    def _out_of_time(self, kind: str, what: str = "more trials") -> bool:
        left = self.time_left()
        if left is None:
            return False
        left -= self._reserve()
        done = [t.elapsed_s for (b, _), t in self.trials.items() if b == kind and t.measured]
        need = sum(done) / len(done) if done else 0.0
        if left < need or left <= 0:
            self.notes.append(timeplan.skipped_note(what, left, need))
            return True
        return False

    def verify_phase(self, sim_ranked: list[TrialResult]) -> list[TrialResult]:
        """Hybrid: the baseline and the simulator's top k on the real engine, each within
        its share of the time budget (`tune.timeplan`), so every one of them is measured.
        On a host whose other processes held cores the baseline's threads wanted, the
        threads that fit are measured next, and kept for the picks when they win. When the
        host check fitted them before the study, they are measured first and the baseline
        last: its slow points (~100 s for one beside the main job's hog) would otherwise
        spend the budget the picks' load searches need."""
        assert self.s.real is not None
        base = self.s.space.baseline_config()
        blind = self.blind = sim_blind_knobs(sim_ranked, self.knobs)
        tops = diverse_top(sim_ranked, self.s.top_k, config_key(base))
        self.say(f"[{self.elapsed():6.1f}s] {self._picks_line(sim_ranked, blind, tops)}")
        # What the simulator cannot see stays at the baseline's value until measured.
        keep = {k: getattr(base, k) for k in blind}
        fitted = self.s.host_threads
        last = 1 if fitted else 0  # the baseline, measured last
        out = [self._verify(self.s.work_base(), 1 + len(tops) + last)]
        fit = None if fitted else threads_for_host(out[0], self.s.space)
        if fit is not None:
            t = self._verify(base.with_(threads=fit), 1 + len(tops))
            out.append(t)
            kept = beats(t, out[0])
            if kept:
                keep["threads"] = fit
            self.notes.append(
                f"host: {contention_of(out[0])} in the baseline's run: threads={fit} "
                f"(the cores left free) measured next, {self._shown(t)} against the "
                f"baseline's {self._shown(out[0])}: "
                + ("kept for the simulator's picks" if kept else "not kept")
            )
        if fitted:
            keep["threads"] = fitted
        done = {t.key for t in out}
        picks: list[EngineConfig] = []
        for t in tops:
            cfg = t.cfg.with_(**keep) if keep else t.cfg
            if config_key(cfg) not in done | {config_key(c) for c in picks}:
                picks.append(cfg)
        out.extend(self._verify(cfg, len(picks) - i + last) for i, cfg in enumerate(picks))
        if fitted:
            b = self._verify(base, 1)
            out.append(b)
            self.notes.append(
                f"host: threads={fitted}, fitted by the host check, measured first "
                f"({self._shown(out[0])}) and kept for the simulator's picks; the baseline "
                f"measured last: {self._shown(b)}"
                + (" (it beat the fit in the trials)" if beats(b, out[0]) else "")
            )
        out.extend(self.blind_phase(sim_ranked, out))
        return out

    def _picks_line(
        self, ranked: list[TrialResult], blind: list[str], picks: list[TrialResult]
    ) -> str:
        """What the simulator's ranking sends to the real engine (`picks`: its top configs,
        the baseline left out), in the knobs it models: a knob it cannot see (`blind`)
        would read as predicted when it is not (on a busy host the default threads'
        baseline ranked first at the speed of the threads the profile was fitted at), and
        configs that differ only in such knobs would read as a tie of two."""
        seen = [k for k in self.knobs if k not in blind]
        base_cfg = self.s.space.baseline_config()
        base = next((t for t in ranked if t.key == config_key(base_cfg)), None)
        met = any(t.status == TrialStatus.OK for t in ranked)

        def shown(t: TrialResult) -> str:
            if met:
                return (
                    self.s.objective.show(t.score) if t.score is not None else "no load met the SLO"
                )
            m = merit(t)
            return "nothing measured" if m is None else f"worst check {-m:.2f}x its target"

        line = f"simulator ranked {len(ranked)} configs"
        if base is not None:
            line += f" (the baseline: rank {ranked.index(base) + 1}, {shown(base)})"
        line += "; " if met else "; none meets the SLO; "
        line += "its picks for the real engine: " if met else "closest, for the real engine: "
        # configs alike in what it models are measured as one (the verify phase sets the
        # rest to the baseline's values), and one alike with the baseline is the baseline
        labels = {config_label(base_cfg, seen): ""}
        for t in picks:
            labels.setdefault(config_label(t.cfg, seen), shown(t))
        line += "; ".join(f"{k} {v}" for k, v in list(labels.items())[1:]) or "none"
        if blind:
            fitted = self.s.host_threads if "threads" in blind else None
            at = f"threads={fitted} (the host check's) and the rest at " if fitted else ""
            line += (
                f" (it does not model {', '.join(blind)}: measured at {at}the baseline's "
                "values, then one change at a time)"
            )
        return line

    def _shown(self, t: TrialResult) -> str:
        """A trial's score, or why it has none (`no load point met the SLO`)."""
        if t.status == TrialStatus.OK and t.score is not None:
            return self.s.objective.show(t.score)
        return t.reason[:120] or str(t.status)

    def _verify(self, cfg: EngineConfig, left: int) -> TrialResult:
        """One config on the real engine within its share of the time left (`left`
        configs to go, this one included)."""
        assert self.s.real is not None
        share = timeplan.share_s(self.time_left(), self._reserve(), left)
        deadline = None if share is None else time.time() + share
        t = self.run_batch(self.s.real, [cfg], deadline)[0]
        if share is not None and t.capacity_note.startswith(timeplan.STOPPED):
            self.notes.append(timeplan.cut_note(t.label, share, len(t.points), t.capacity))
        return t

    def blind_phase(self, sim: list[TrialResult], real: list[TrialResult]) -> list[TrialResult]:
        """Knobs the simulator cannot see are decided on the real engine, one change at a
        time from the best verified config (seed 000 §8), keeping what helps."""
        assert self.s.real is not None
        blind = sim_blind_knobs(sim, self.knobs)
        ok = [t for t in real if t.status == TrialStatus.OK]
        if not blind or not ok:
            return []
        self.notes.append(
            f"the simulator does not model {', '.join(blind)}: decided on the "
            "real engine, one change at a time"
        )
        best = max(ok, key=lambda t: t.score or 0.0)
        done = {t.key for t in real}
        out: list[TrialResult] = []
        for knob in blind:
            for v in self.s.space.knobs[knob]:
                point = {**self.s.space.point_of(best.cfg), knob: v}
                if self.s.space.why_invalid(point) is not None:
                    continue
                cfg = self.s.space.config(point)
                if config_key(cfg) in done:
                    continue
                if self._out_of_time("real", f"{knob}={v} on the real engine"):
                    return out
                t = self.run_batch(self.s.real, [cfg])[0]
                done.add(t.key)
                out.append(t)
                if beats(t, best):
                    best = t
        return out

    def finalists_of(self, ranked: list[TrialResult]) -> list[TrialResult]:
        """The configs re-run: the first `finalists` of the ranking that met the SLO, and the
        baseline beside them when it met it too. Why the baseline: "X beats the default" is
        the claim a user acts on, and one trial of each says little on a busy host (beside
        a one-core hog the main job's winner had a trial at 0.307 req/s/GPU and repetitions
        at 0.163, the baseline one trial at 0.167); with both repeated, the winner is the
        better mean, which may be the baseline itself. When the baseline is the only
        finalist, the best other config takes the baseline's reserved place: "keep the
        default" is a claim too (the idle main job, one finalist: the baseline won on a
        trial 1% above the runner-up's, its repetitions' mean 16% below that trial)."""
        ok = [t for t in ranked if t.status == TrialStatus.OK and t.best]
        chosen = ok[: self.s.finalists]
        base = config_key(self.s.space.baseline_config())
        if not chosen:
            return chosen
        if all(t.key != base for t in chosen):
            chosen += [t for t in ok if t.key == base]
        elif all(t.key == base for t in chosen):
            chosen += [t for t in ok if t.key != base][:1]
        return chosen

    def finalist_phase(self, ranked: list[TrialResult]) -> None:
        """Re-run the finalists' best load `repeats` times: mean and 95% interval."""
        assert self.s.real is not None
        backend = backend_for(self.s.real)
        recorder = recorder_for(self.db, self.study, "real")
        for t in self.finalists_of(ranked):
            assert t.best is not None
            n = self.s.repeats  # always: the time for them was reserved
            say = self.say if self.s.verbose else None
            t.reps = run_points(
                backend,
                t.cfg,
                t.best.load_kind,
                [t.best.load] * n,
                recorder=recorder,
                phase="rep",
                say=say,
                label=t.label,
            )
            values = [self._metric(p, t.cfg) for p in t.reps]
            ci = mean_ci(values)
            t.ci = {
                **ci.to_json(),
                "metric": self.s.objective.label,
                "passed": sum(p.passed for p in t.reps),
            }
            self.say(
                f"[{self.elapsed():6.1f}s] finalist {t.label}: {n} repetitions, "
                f"{self.s.objective.label} {ci.mean:.3g} (95% CI {ci.low:.3g} .. {ci.high:.3g}), "
                f"{t.ci['passed']}/{n} met the SLO"
            )

    def _metric(self, p: PointResult, cfg: EngineConfig) -> float:
        o = self.s.objective
        if o.kind == "goodput":
            return (p.goodput_req_s or 0.0) / gpus_of(cfg)
        if o.kind == "cost":
            tok = p.output_tok_s * (p.attainment or 0.0)
            return o.cost_per_m(tok, gpus_of(cfg)) if tok > 0 else math.inf
        return p.ttft_p95_ms or math.inf

    def edge_phase(
        self, winner: TrialResult, spec: BackendSpec
    ) -> tuple[list[OOMEdge], EngineConfig]:
        """The OOM edge above the winner along each memory knob of the space."""
        backend = backend_for(spec)
        cfg = winner.cfg
        rec = cfg
        edges: list[OOMEdge] = []
        known = {k: t for (b, k), t in self.trials.items() if b == "sim"}
        known.update({k: t for (b, k), t in self.trials.items() if b == "real"})
        for knob in [k for k in MEMORY_KNOBS if k in self.s.space.knobs]:
            values = [v for v in self.s.space.knobs[knob] if isinstance(v, (int, float))]
            start = getattr(cfg, knob)
            if not values or start is None or isinstance(start, bool):
                continue

            def runs(v: Any, knob: str = knob) -> bool:
                try:
                    c = cfg.with_(**{knob: v})
                except ValueError:
                    return False
                t = known.get(config_key(c))
                if t is not None:
                    return t.status in (TrialStatus.OK, TrialStatus.NO_SLO)
                return backend.check(c) is None

            edge = find_edge(knob, values, start, runs)
            if spec.kind == "real":
                edge.note += " (values not launched are judged by the planner)"
            edges.append(edge)
            safe = step_back(edge, start)
            if safe != start:
                rec = rec.with_(**{knob: safe})
        return edges, rec

    def sweet_phase(self, winner: TrialResult, spec: BackendSpec) -> None:
        """Rate searches have no doubling curve: sweep concurrency 1, 2, 4, ... for the
        winner on the simulator (cheap) so the sweet spot is reported."""
        cfg = winner.cfg
        top = max(8, 2 * (cfg.max_num_seqs or cfg.parallel_slots or 256))
        loads = [float(c) for c in doubling(min(top, 1024))]
        points = run_points(
            backend_for(spec),
            cfg,
            "concurrency",
            loads,
            recorder=recorder_for(self.db, self.study, spec.kind),
            phase="sweet",
        )
        winner.sweet_spot = analyse([(p.load, p.output_tok_s) for p in points]).to_json()

    # -- the whole study ----------------------------------------------------------------

    def run(self) -> TuneOutcome:
        s = self.s
        out = TuneOutcome(self.study, self.store.where, s.mode, s.objective, self.knobs)
        out.host_check = self.host_check
        try:
            self.derive_slo(out)
            rank_spec = s.real if s.mode == "real" else s.sim
            assert rank_spec is not None
            first = rank(self.search_phase(rank_spec))
            if s.mode == "hybrid":
                out.sim_ranked = first
                verified = rank(self.verify_phase(first))
                out.ranked = verified
                out.sim_vs_real = self._sim_vs_real(first, verified)
            else:
                out.ranked = first
            final_spec = s.real if s.mode != "sim" else s.sim
            assert final_spec is not None
            if s.mode != "sim" and s.repeats >= 2 and s.finalists > 0:
                self.finalist_phase(out.ranked)
            if s.mode == "hybrid":
                out.sim_error = self._judge_sim(out.sim_vs_real, out.ranked)
            ok = [t for t in out.ranked if t.status == TrialStatus.OK]
            base_key = config_key(s.space.baseline_config())
            out.baseline = next((t for t in out.ranked if t.key == base_key), None)
            if not ok:
                return self._best_effort(out)
            out.winner = w = pick_winner(ok, higher_is_better=s.objective.higher_is_better)
            if w.ci and not held_in_repeats(w):
                self.say(
                    f"[{self.elapsed():6.1f}s] warning: the winner met the SLO in "
                    f"{w.ci['passed']}/{w.ci['n']} repetitions at its best load: its capacity "
                    "did not reproduce on this host (no finalist's did); treat it as an upper bound"
                )
            if s.search.load_kind == "rate" and s.objective.searches_capacity and s.sim:
                self.sweet_phase(w, s.sim)
            if s.edge:
                edge_spec = s.sim if s.mode == "sim" else final_spec
                assert edge_spec is not None
                out.edges, rec_cfg = self.edge_phase(w, edge_spec)
                out.recommended = self._recommend(w, rec_cfg, final_spec)
            out.explanation = explain(w, out.ranked, out.baseline, s.objective, self.knobs)
            self._conclude(w, out)
            out.report_runs = self._report_runs(out)
            self._finish(out, "done")
            return out
        finally:
            self.executor.close()

    def derive_slo(self, out: TuneOutcome) -> None:
        """`host_slo` (a preset's `slo_from_host`): probe the baseline idle on the engine
        that decides (real, else the simulator) and judge every trial by the SLO derived
        from it; from here on the settings' backend specs carry that SLO. A probe that
        cannot run leaves the given SLO in force, with a note."""
        s = self.s
        spec = s.real or s.sim
        assert spec is not None
        if s.host_slo is not None:
            cfg = s.work_base()
            who = "the baseline" if cfg == s.space.baseline_config() else self.label(cfg)
            self.say(
                f"[{self.elapsed():6.1f}s] deriving the SLO from this host: {who} "
                "serves the workload one request at a time (the idle probe)"
            )
            t0 = time.monotonic()
            got = probe_host(
                backend_for(spec),
                cfg,
                base=parse_slo(spec.slo),
                rule=s.host_slo,
                recorder=recorder_for(self.db, self.study, spec.kind),
                label=self.label(cfg),
            )
            self._untimed(time.monotonic() - t0)
            if isinstance(got, str):
                self.notes.append(f"SLO not derived from this host: {got}; the given SLO applies")
            else:
                out.host_slo = got
                slo = got.slo.model_dump(mode="json", exclude_none=True)
                s.sim = replace(s.sim, slo=slo) if s.sim else None
                s.real = replace(s.real, slo=slo) if s.real else None
                self.say(f"[{self.elapsed():6.1f}s] {got.text()}")
        out.slo = (s.real or s.sim or spec).slo

    def _best_effort(self, out: TuneOutcome) -> TuneOutcome:
        """No config met the SLO: the closest one is still the answer (what to run, and
        how far this host is from the SLO), recorded as such. Nothing measured at all
        (every config skipped or infeasible) is the one case without an answer."""
        rows = closest(out.ranked)
        if not rows:
            self._finish(out, "nothing measured")
            raise NothingMeasured(out)
        (w, sf), runner_up = rows[0], (rows[1][0] if len(rows) > 1 else None)
        out.winner, out.slo_met, out.shortfall = w, False, sf
        out.explanation = explain_shortfall(w, sf, runner_up)
        if out.host_slo is not None and (slowed := slowed_since(out.host_slo, out.ranked)):
            out.explanation.append(slowed)
        self._conclude(w, out)
        out.report_runs = self._report_runs(out)
        self._finish(out, "done")
        return out

    def _recommend(
        self, w: TrialResult, rec_cfg: EngineConfig, spec: BackendSpec
    ) -> dict[str, Any]:
        """What to ship (`config`, what `accept --from-study` takes): the winner, or the
        winner one safe step back from its OOM edge (measured when the backend is the
        simulator or time allows). A step back measured to miss the SLO (no load met it,
        or it did not run) is never shipped: the winner is, with the step back beside it
        (`step_back`) and a `note` saying why it has no headroom."""
        winner = {
            "config": w.config,
            "label": w.label,
            "same_as_winner": True,
            "launch_command": w.launch_command,
        }
        if config_key(rec_cfg) == w.key:
            return winner
        t = self.trials.get((spec.kind, config_key(rec_cfg)))
        if t is None and (spec.kind == "sim" or not self._out_of_time("real", "the step back")):
            t = self.run_batch(spec, [rec_cfg])[0]
        step: dict[str, Any] = {
            "config": rec_cfg.model_dump(mode="json", exclude_defaults=True),
            "label": self.label(rec_cfg),
            "same_as_winner": False,
            "launch_command": backend_for(spec).command(rec_cfg),
        }
        if t is not None:
            step.update(status=t.status, score=t.score, capacity=t.capacity)
            step.update(safety_margin(self.s.objective, w.score, t.score))
        if t is None or t.status == TrialStatus.OK:  # unmeasured (out of time): the planner's
            return step
        why = f"did not run ({t.status}: {t.reason[:120]})"
        if t.status == TrialStatus.NO_SLO:
            why = "met the SLO at no load tried"
        note = (
            f"the winner: its step back from the OOM edge, {step['label']}, {why}, so it "
            "keeps no step of memory headroom"
        )
        return {**winner, "step_back": step, "note": note}

    def _sim_vs_real(self, sim: list[TrialResult], real: list[TrialResult]) -> list[dict[str, Any]]:
        """Each verified config against the simulator at the same load (`tune.simvsreal`),
        said a line each. Configs that moved a knob the simulator does not model from the
        value its profile was fitted at (`TuneSettings.work_base`: threads=1 beside a busy
        core ran 50x faster than a profile fitted at the default) are left out: their
        error is the knob's effect, and it would mark a sound profile stale."""
        assert self.s.sim is not None
        base = self.s.work_base()
        real = [t for t in real if all(t.config.get(k) == getattr(base, k) for k in self.blind)]
        backend, recorder = backend_for(self.s.sim), recorder_for(self.db, self.study, "sim")

        def simulate_at(cfg: EngineConfig, kind: str, load: float) -> PointResult | None:
            return run_points(backend, cfg, kind, [load], recorder=recorder, phase="check")[0]

        def replay(cfg: EngineConfig, at: PointResult) -> PointResult | None:
            return simvsreal.replay_point(backend, self.store.load_result, cfg, at)

        rows = simvsreal.rows(sim, real, self.blind, simulate_at, replay)
        for row in rows:
            self.say(f"[{self.elapsed():6.1f}s] {simvsreal.line(row)}")
        return rows

    def _judge_sim(
        self, rows: list[dict[str, Any]], real: list[TrialResult]
    ) -> dict[str, dict[str, Any]]:
        """After the repetitions: the judged figures against the target and this host's
        noise floor (the real engine against itself: the baseline against its calibration
        sweep, the finalists against their repetitions; `tune.simvsreal`), said in one
        line; then the calibration is judged on them (`tune.calibration`)."""
        base = self.s.work_base()  # the config the calibration swept
        repeats = simvsreal.repeat_rows(real)
        floor = list(repeats)
        if self.calibration is not None:
            trial = next((t for t in real if t.key == config_key(base)), None)
            floor += simvsreal.floor_rows(self.calibration.sweep_runs(base), trial)
        judged = simvsreal.verdicts(rows, floor)
        self.say(f"[{self.elapsed():6.1f}s] {simvsreal.verdict_line(judged)}")
        if self.calibration is not None:
            noise = simvsreal.throughput_floor(repeats)  # this study's own, no drift in it
            errors = simvsreal.throughput_errors(rows)
            self.calibration.verify(errors, self.say, judged, noise)
        return judged

    def _conclude(self, w: TrialResult, out: TuneOutcome) -> None:
        """Seed 003 §16's conclusion, keep with why, on the run at the winner's best
        passing load (a best effort: at its closest point), never on another of its runs
        (a sweet-spot probe, a point above the capacity)."""
        point = out.shortfall.point if out.shortfall is not None else w.best
        run_id = self._run_at(w.key, point) if point is not None else None
        if run_id and w.backend == "sim":
            self._prediction_note(run_id)
        if run_id and out.slo_met:
            self.store.conclude(run_id, "keep", f"tune winner: {out.explanation[0]}")
        elif run_id:  # seed 003 §16 "next": carried on, not proven within the SLO
            note = "; ".join(out.explanation[:2])
            self.store.conclude(run_id, "next", f"tune best effort, no config met the SLO: {note}")

    def _prediction_note(self, run_id: str) -> None:
        """A simulated winner's figures are predictions: say which tier made them and what
        that tier is expected to miss by (the run's `SimStats.expected_error`), as
        `simulate` does, so a capacity read off them is not taken as measured."""
        res = self.store.load_result(run_id)
        sim = res.target.sim
        if sim is not None and sim.expected_error:
            self.notes.append(
                f"the winner's figures are simulated ({res.target.tier} tier): {sim.expected_error}"
            )

    def _run_at(self, key: str, point: PointResult) -> str | None:
        """The stored run of one of config `key`'s points: its own (real points), else the
        simulator trial's one run, which holds the trial's best point (simulator probes
        are not stored one by one; the sweet-spot sweep's runs have the key too, at other
        loads). None when no run of the config holds that load."""
        if point.run_id:
            return point.run_id
        for info in self.store.list_runs(study=self.study):
            tag = info.tune
            if (
                tag is not None
                and tag.key == key
                and tag.phase == "trial"
                and (tag.load_kind, tag.load) == (point.load_kind, point.load)
                and info.status == RunStatus.COMPLETED
            ):
                return info.id
        return None

    def _report_runs(self, out: TuneOutcome) -> list[str]:
        """The runs a report of this study shows: the winner, the runner-ups and the
        baseline (a report takes at most 200 runs)."""
        keys = {t.key for t in out.ranked[: max(3, self.s.top_k)] if t.status == TrialStatus.OK}
        if out.winner is not None:  # a best effort too
            keys.add(out.winner.key)
        if out.baseline is not None:
            keys.add(out.baseline.key)
        return [
            i.id
            for i in self.store.list_runs(study=self.study)
            if i.tune is not None and i.tune.key in keys and i.status == RunStatus.COMPLETED
        ][:200]

    def _finish(self, out: TuneOutcome, status: str) -> None:
        out.notes = self.notes
        out.calibration = self.calibration
        out.elapsed_s = self.elapsed()
        trials = list(self.trials.values())
        out.counts = {
            "trials": len(trials),
            "sim_trials": sum(t.backend == "sim" for t in trials),
            "real_trials": sum(t.backend == "real" for t in trials),
            "measured_points": sum(t.measured for t in trials),
            "skipped": sum(t.status == TrialStatus.SKIPPED for t in trials),
            "infeasible": sum(t.status == TrialStatus.INFEASIBLE for t in trials),
            "no_slo": sum(t.status == TrialStatus.NO_SLO for t in trials),
        }
        self.store.update_study_meta(
            self.study, {"status": status, "summary": out.to_json()}, TUNE_KIND
        )


def safety_margin(
    objective: Objective, winner: float | None, other: float | None
) -> dict[str, Any]:
    """What the step back costs, on the objective's own value (req/s/GPU, $ per 1M
    tokens, P95 TTFT ms), never on the score (negated for cost and latency, so a dearer
    step back read "-1%"): `cost_of_safety`, the relative change (+ is more of the
    metric), and `safety_margin`, its words (`1% more expensive`); empty without both."""
    w, o = objective.value(winner), objective.value(other)
    if w is None or o is None or not w:
        return {}
    return {"cost_of_safety": (o - w) / abs(w), "safety_margin": objective.margin(o, w)}
