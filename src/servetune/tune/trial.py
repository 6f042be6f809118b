"""One trial: a config's capacity under the SLO (or its latency at the workload's load),
measured through a backend, every point looked up in / written to the study first.

This is what executors run, locally or as a Ray task, so it takes only picklable inputs
and opens what it needs itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.measure import steady
from servetune.measure.backends import Backend
from servetune.measure.result import Infeasible, PointResult, whole_points
from servetune.metrics.pct import sample_note
from servetune.results.schema import RunResult
from servetune.status import RunStatus, TrialStatus
from servetune.tune.capacity import Lattice, Probe, search_capacity
from servetune.tune.objective import Objective
from servetune.tune.space import config_key
from servetune.tune.sweetspot import analyse

Say = Callable[[str], None]


class _TimeUp(Exception):
    """The study's time budget ran out inside a trial: keep what was measured."""


@dataclass(frozen=True)
class SearchSettings:
    """How each trial loads its config."""

    load_kind: str  # concurrency | rate
    lattice: Lattice
    max_probes: int = 12
    extra_doublings: int = 0
    bisect: bool = True
    fixed_load: float | None = None  # latency objective: the one load measured


@dataclass
class TrialResult:
    key: str
    config: dict[str, Any]
    label: str
    backend: str
    status: TrialStatus
    reason: str = ""
    log_tail: list[str] = field(default_factory=list)
    points: list[PointResult] = field(default_factory=list)
    capacity: float | None = None
    # The lattice load the capacity was found at (`capacity` may be the lower rate its
    # arrivals offered, `_credit`): where a warm start resumes the lattice
    capacity_load: float | None = None
    first_fail: float | None = None
    capacity_note: str = ""
    score: float | None = None
    best: PointResult | None = None
    sweet_spot: dict[str, Any] | None = None
    launch_command: str | None = None
    elapsed_s: float = 0.0
    measured: int = 0  # points measured now (not read back from the store)
    launched: bool = False  # a session was opened now (engine launched, or tried)
    worker: str = ""
    started_unix_s: float = 0.0
    ended_unix_s: float = 0.0
    reps: list[PointResult] = field(default_factory=list)
    ci: dict[str, Any] | None = None

    @property
    def cfg(self) -> EngineConfig:
        return EngineConfig.model_validate(self.config)

    @property
    def capacity_is_lower_bound(self) -> bool:
        """No load tried missed the SLO (the lattice's top, the probe budget or the time
        budget stopped the search): the capacity is at least this much."""
        return self.capacity is not None and self.first_fail is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrialResult:
        t = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        t.status = TrialStatus(t.status)
        t.points = [PointResult.from_json(p) for p in d.get("points") or []]
        t.reps = [PointResult.from_json(p) for p in d.get("reps") or []]
        t.best = PointResult.from_json(d["best"]) if d.get("best") else None
        return t


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def point_id(key: str, kind: str, load: float, phase: str = "probe", rep: int = 0) -> str:
    return f"{key}/{phase}/{kind}={load:g}/r{rep}"


def run_trial(
    backend: Backend,
    cfg: EngineConfig,
    *,
    objective: Objective,
    search: SearchSettings,
    recorder: Any,
    label: str,
    start_index: int = 0,
    say: Say | None = None,
    deadline_unix_s: float | None = None,
    cold_index: int | None = None,
) -> TrialResult:
    """Measure one config; infeasible configs (planner, start-up, crash) are results too.
    Past `deadline_unix_s` no new load point starts (the capacity is then a lower bound).
    A warm `start_index` that fails restarts the search at `cold_index`."""
    key = config_key(cfg)
    t0, started = time.monotonic(), time.time()
    trial = TrialResult(
        key=key,
        config=cfg.model_dump(mode="json", exclude_defaults=True) | {"engine": cfg.engine},
        label=label,
        backend=backend.name,
        status=TrialStatus.OK,
        worker=worker_id(),
        started_unix_s=started,
    )
    reason = backend.check(cfg)
    if reason:
        trial.status, trial.reason = TrialStatus.SKIPPED, reason
        return _done(trial, t0)
    if backend.name == "sim" and (cached := recorder.sim_trial(key)) is not None:
        return cached
    results: dict[float, RunResult] = {}
    weak: dict[float, list[str]] = {}  # passing loads not credited (`steady.weak_evidence`)
    with _LazySession(backend, cfg, recorder, key) as lazy:
        kind = search.load_kind

        def measure(load: float) -> Probe:
            if deadline_unix_s is not None and trial.points and time.time() > deadline_unix_s:
                raise _TimeUp
            point = _measure(lazy, recorder, key, kind, load, "probe", 0, results, say, label)
            trial.points.append(point)
            why = _not_proven(point, trial.points)
            if why:
                weak[load] = why
                if say:
                    say(f"    {label} rate={load:g} passed on weak evidence ({'; '.join(why)}): "
                        "not credited, the search looks below it")  # fmt: skip
                return Probe(load, False, point.output_tok_s, None)
            return Probe(load, point.passed, point.output_tok_s, objective.score(point, cfg))

        try:
            if objective.searches_capacity:
                cap = search_capacity(
                    measure,
                    search.lattice,
                    start_index=start_index,
                    max_probes=search.max_probes,
                    bisect=search.bisect,
                    extra_doublings=search.extra_doublings,
                    cold_index=cold_index,
                )
                trial.capacity, trial.first_fail = cap.capacity, cap.first_fail
                trial.capacity_note = cap.reason
                if why := _recheck(trial, weak):
                    _look_below(trial, weak, why, measure, search.lattice, search.max_probes)
                _credit(trial)
            else:
                load = search.fixed_load or search.lattice.load(0)
                p = measure(load)
                trial.capacity = load if p.passed else None
        except _TimeUp:
            passed = [p.load for p in trial.points if p.passed and p.load not in weak]
            trial.capacity = max(passed) if passed else None
            above = [
                p.load for p in trial.points if not p.passed and p.load > (trial.capacity or 0)
            ]
            trial.first_fail = min(above) if above else None
            trial.capacity_note = "stopped by the time budget (capacity is a lower bound)"
            _credit(trial)
        except Infeasible as exc:
            trial.status = TrialStatus.INFEASIBLE
            trial.reason, trial.log_tail = exc.reason, exc.log_tail
        trial.launch_command = backend.command(cfg)  # default port: what a user runs
        trial.measured = lazy.measured
        trial.launched = lazy.tried
    if weak:
        trial.capacity_note += "; " + "; ".join(
            f"{load:g} passed but was not credited: {', '.join(why)}" for load, why in weak.items()
        )
    if trial.status == TrialStatus.OK:
        scored = [(objective.score(p, cfg), p) for p in trial.points if p.load not in weak]
        ok = [(s, p) for s, p in scored if s is not None]
        if ok:
            trial.score, trial.best = max(ok, key=lambda sp: (sp[0], sp[1].load))
        else:
            trial.status = TrialStatus.NO_SLO
            trial.reason = "no load point met the SLO"
        whole = whole_points(trial.points)  # not a point stopped at its decided miss
        if kind == "concurrency" and len({p.load for p in whole}) >= 3:
            trial.sweet_spot = analyse([(p.load, p.output_tok_s) for p in whole]).to_json()
    _done(trial, t0)
    if backend.name == "sim":
        best_load = (
            trial.best.load if trial.best else (trial.points[-1].load if trial.points else None)
        )
        res = results.get(best_load) if best_load is not None else None
        recorder.save_sim_trial(trial, res, backend)
    return trial


def _not_proven(point: PointResult, points: list[PointResult]) -> list[str]:
    """Why a passing point is weak evidence of its load (`steady.weak_evidence`, and
    `steady.settles_in_window` against the saturation the trial's points have shown)."""
    if not point.passed:
        return []
    mu = steady.saturated_rate([p.signals for p in points])
    return steady.weak_evidence(point.signals) + steady.settles_in_window(
        point.signals, point.load, mu
    )


def _recheck(trial: TrialResult, weak: dict[float, list[str]]) -> list[str]:
    """The capacity's point judged again once the search is over: a point passed before
    any overload showed the saturated rate (the doubling phase) may sit too close to it.
    Then the highest passing load that is proven is the capacity. When none is, the
    reasons are returned: the search must look below (`_look_below`)."""
    at = next((p for p in trial.points if p.load == trial.capacity and p.passed), None)
    if at is None or not (why := _not_proven(at, trial.points)):
        return []
    proven = [p.load for p in trial.points if p.passed and p.load not in weak and p is not at]
    if not proven:
        return why
    weak[at.load] = why
    trial.first_fail = at.load
    trial.capacity = max(proven)
    return []


def _look_below(
    trial: TrialResult,
    weak: dict[float, list[str]],
    why: list[str],
    measure: Callable[[float], Probe],
    lattice: Lattice,
    max_probes: int,
) -> None:
    """The search's first pass was its only one, and the overloads after it showed it too
    close to saturation to be proven (`why`): step down the lattice until a load passes on
    proven evidence (`measure` credits only those), within the search's probe budget; with
    no probe left the capacity stays where it was. Seen on the GPU what-if (max_num_seqs
    128): 38.05 req/s against a saturated 40 passed a 59 s window (P95 TTFT 264 ms) and
    missed in a run 10x as long (1.2 s)."""
    at = trial.capacity
    if at is None or len(trial.points) >= max_probes:
        return
    i = lattice.index_of(at) - 1
    if i < 0:
        return
    weak[at] = why
    trial.first_fail, trial.capacity = at, None
    while i >= 0 and len(trial.points) < max_probes:
        load = lattice.load(i)
        if measure(load).passed:
            trial.capacity = load
            return
        trial.first_fail = load
        i -= 1


def _credit(trial: TrialResult) -> None:
    """An open-loop capacity is the rate its point's arrivals showed carried, when that is
    below the lattice's nominal rate (`steady.credited_rate`), said in the note."""
    at = next((p for p in trial.points if p.load == trial.capacity), None)
    if at is None or trial.capacity is None:
        return
    trial.capacity_load = at.load
    rate = steady.credited_rate(at.signals, at.load)
    if rate < trial.capacity:
        trial.capacity_note += (
            f"; capacity {rate:.3g}, the rate the {at.load:g} req/s point's arrivals offered"
        )
        trial.capacity = rate


def run_points(
    backend: Backend,
    cfg: EngineConfig,
    kind: str,
    loads: list[float],
    *,
    recorder: Any,
    phase: str,
    say: Say | None = None,
    label: str = "",
) -> list[PointResult]:
    """Extra points for one config in one session: finalist repetitions (`phase="rep"`,
    same load repeated), the host SLO's probe blocks, or a sweet-spot sweep. Stored like
    probes, so they resume too: a load given again is the next repetition of it."""
    key = config_key(cfg)
    out: list[PointResult] = []
    results: dict[float, RunResult] = {}
    with _LazySession(backend, cfg, recorder, key) as lazy:
        for r, load in enumerate(loads):
            rep = loads[:r].count(load)
            out.append(_measure(lazy, recorder, key, kind, load, phase, rep, results, say, label))
    return out


def _done(trial: TrialResult, t0: float) -> TrialResult:
    trial.elapsed_s = time.monotonic() - t0
    trial.ended_unix_s = time.time()
    return trial


def _measure(
    lazy: _LazySession,
    recorder: Any,
    key: str,
    kind: str,
    load: float,
    phase: str,
    rep: int,
    results: dict[float, RunResult],
    say: Say | None,
    label: str,
) -> PointResult:
    pid = point_id(key, kind, load, phase, rep)
    stored = recorder.point(pid)  # a point stored in this study is read back, never re-stored
    if isinstance(stored, Infeasible):
        raise stored
    if stored is not None:
        return stored
    cached = lazy.backend_cache.get(pid)  # the simulator's points, shared across studies
    if cached is not None:
        return _store_cached(lazy, recorder, pid, (kind, load, phase, rep), cached, results)
    sess = lazy.open()
    run_id = recorder.begin_point(
        pid, lazy.backend, lazy.cfg, sess.launch_command, (kind, load, phase, rep)
    )
    try:
        point, res = lazy.backend.probe(sess, kind, load, search=phase == "probe")
    except Infeasible as exc:
        recorder.fail_point(run_id, exc)
        raise
    except BaseException:
        recorder.abandon_point(run_id)
        raise
    lazy.measured += 1
    point.run_id = run_id
    recorder.finish_point(pid, run_id, res, point)
    results[load] = res
    if lazy.backend.name == "sim":
        lazy.backend_cache[pid] = (point, res)
    if say:
        say(point_line(label, phase, kind, load, point, res))
    return point


def point_line(
    label: str, phase: str, kind: str, load: float, point: PointResult, res: RunResult
) -> str:
    """The verbose line of one measured point. A point stopped at its decided miss
    (`slo_missed`) shows no req/s nor goodput: it measured part of a closed loop's rounds
    (the main job's 6 users stopped after 2 answers read 0.75 req/s beside 3.83 at 4), a
    figure that reads as the load's throughput when it is none."""
    missed = ",".join(f"{c['metric']}.{c['stat']}" for c in point.missed()[:2])
    mark = "pass" if point.passed else "miss " + missed
    rate = f"{point.req_s:.2f} req/s, goodput {point.goodput_req_s or 0:.2f}, "
    if res.status == RunStatus.SLO_MISSED:
        mark += f"; stopped after {res.metrics.completed + res.metrics.failed} requests"
        rate = ""
    return (
        f"    {label} {phase} {kind}={load:g}: {rate}P95 TTFT {_ms(point.ttft_p95_ms)} "
        f"TPOT {_ms(point.tpot_p95_ms)} ms ({sample_note('p95', res.metrics.ttft_ms.count)}) "
        f"[{mark}]"
    )


def _store_cached(
    lazy: _LazySession,
    recorder: Any,
    pid: str,
    where: tuple[str, float, str, int],
    cached: tuple[PointResult, RunResult],
    results: dict[float, RunResult],
) -> PointResult:
    """A point the simulator computed before (another study in this process): stored in
    this study as if measured now, when this study stores such points (not probes)."""
    point, res = cached
    results[where[1]] = res
    run_id = recorder.begin_point(pid, lazy.backend, lazy.cfg, lazy.launch_command, where)
    if run_id is None:
        return point
    point = replace(point, run_id=run_id)
    recorder.finish_point(pid, run_id, res, point)
    return point


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


class _LazySession:
    """Opens the backend session (launches the engine) only when a point is not already
    in the store: a resumed trial whose points are all stored launches nothing."""

    def __init__(self, backend: Backend, cfg: EngineConfig, recorder: Any, key: str) -> None:
        self.backend = backend
        self.cfg = cfg
        self.recorder = recorder
        self.key = key
        self.stack = contextlib.ExitStack()
        self.sess: Any = None
        self.measured = 0
        self.tried = False
        self.launch_command: str | None = backend.command(cfg)
        self.backend_cache: dict[str, Any] = getattr(backend, "cache", {})

    def open(self) -> Any:
        if self.sess is None:
            launch_pid = point_id(self.key, "launch", 0, "launch")
            hit = self.recorder.point(launch_pid) if self.backend.name == "real" else None
            if isinstance(hit, Infeasible):
                raise hit
            self.tried = True
            try:
                self.sess = self._start()
            except Infeasible as exc:
                if self.backend.name == "real":
                    self.recorder.record_failure(launch_pid, self.backend, self.cfg, exc)
                raise
            self.launch_command = self.sess.launch_command
        return self.sess

    def _start(self) -> Any:
        """Open the session; a start that timed out is tried once more before the config
        is called infeasible (on a busy host a slow start is the host, not the config)."""
        try:
            return self.stack.enter_context(self.backend.session(self.cfg))
        except Infeasible as exc:
            if exc.kind != "timeout":
                raise
        return self.stack.enter_context(self.backend.session(self.cfg))

    def __enter__(self) -> _LazySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()
