"""A busy host: other processes hold cores a CPU engine's threads want
(`telemetry.contention`). `diagnose` names it, and the hybrid tuner measures the threads
that fit right after the baseline (`tune.hostfit`) instead of in the blind phase's turn,
which a busy host's slow trials never reach."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from servetune.diagnose.evidence import Evidence
from servetune.diagnose.rules import diagnose
from servetune.engines.config import EngineConfig
from servetune.measure.backends import SimBackend
from servetune.measure.result import Infeasible, PointResult, signals
from servetune.measure.session import Session
from servetune.measure.simulated import SimSession
from servetune.results.schema import TelemetrySeries
from servetune.slo import HostRule
from servetune.status import TrialStatus
from servetune.store import RunMeta, Store
from servetune.telemetry.contention import contention
from servetune.telemetry.sampler import summarize
from servetune.tune import calibration as cal
from servetune.tune import executors
from servetune.tune.hostfit import check_host, early_threads, threads_for_host
from servetune.tune.space import parse_space
from servetune.tune.trial import TrialResult
from servetune.tune.tuner import Tuner, TuneSettings
from sim_as_real import SimAsReal, hybrid_settings, serve_real_with
from synthetic_runs import synthetic_run

# Samples of a real run (2026-12-07, this 2-core host): llama-server at its default
# threads (all cores) serving Gemma 3 270M one request at a time, a `while True` loop
# pinned to core 0. P50 TPOT 632 ms; the same at threads=1 beside the loop: 18 ms.
HELD = [
    {"host_cpu_cores": 2.0, "other_cpu_cores": 0.987, "engine_cpu_cores": 0.933,
     "engine_runq_wait_cores": 0.924, "engine_runq_wait_share": 0.498, "host_cpu_busy": 0.98},
    {"host_cpu_cores": 2.0, "other_cpu_cores": 0.98, "engine_cpu_cores": 1.01,
     "engine_runq_wait_cores": 0.986, "engine_runq_wait_share": 0.494, "host_cpu_busy": 1.0},
    {"host_cpu_cores": 2.0, "other_cpu_cores": 1.0, "engine_cpu_cores": 1.0,
     "engine_runq_wait_cores": 1.004, "engine_runq_wait_share": 0.501, "host_cpu_busy": 1.0},
]  # fmt: skip
# Means of the same host's other runs: threads=1 beside the loop, and idle at default threads.
ONE_THREAD = {"host_cpu_cores_max": 2.0, "other_cpu_cores_mean": 1.003,
              "engine_cpu_cores_mean": 0.974, "engine_runq_wait_cores_mean": 0.016}  # fmt: skip
IDLE = {"host_cpu_cores_max": 2.0, "other_cpu_cores_mean": 0.013,
        "engine_cpu_cores_mean": 1.65, "engine_runq_wait_cores_mean": 0.139}  # fmt: skip


def test_a_busy_core_beside_all_cores_threads_is_contention_and_one_thread_fits() -> None:
    tel = summarize(TelemetrySeries(values=HELD))
    held = contention(tel)
    assert held is not None and held.free_cores == 1
    assert "held 1.0 of 2 cores" in held.describe()
    # threads that fit the free core, an idle host, and an engine whose own threads
    # outnumber an otherwise idle host's cores: none of them is the host's doing
    assert contention(ONE_THREAD) is None
    assert contention(IDLE) is None
    assert (
        contention({**IDLE, "engine_cpu_cores_mean": 2.0, "engine_runq_wait_cores_mean": 1.0})
        is None
    )
    assert contention({}) is None  # a remote engine: no process telemetry


def test_diagnose_names_the_host_and_the_threads_that_fit() -> None:
    """The starved-host rule alone (a wait share >= 50%) missed this run by 0.1 point."""
    ev = Evidence("x", engine="llamacpp", config={})
    ev.tel = summarize(TelemetrySeries(values=HELD))
    assert ev.tel["engine_runq_wait_share_mean"] < 0.5
    f = diagnose(ev)[0]
    assert f.key == "host_overloaded"
    threads = next(a for a in f.actions if a.knob.startswith("engine "))
    assert threads.knob == "engine threads" and threads.next == "1 dedicated core"
    ev.tel = dict(ONE_THREAD)
    assert "host_overloaded" not in {x.key for x in diagnose(ev)}


def test_a_real_runs_signals_carry_the_free_cores() -> None:
    res, _ = synthetic_run(1, backend="real", n_requests=8)
    assert "free_cores" not in signals(res)  # no telemetry sampled
    res.telemetry = TelemetrySeries(values=HELD)
    sig = signals(res)
    assert sig["free_cores"] == 1 and "other processes held 1.0 of 2 cores" in sig["contention"]


def _trial(threads: int | None, free: int | None) -> TrialResult:
    sig = {"free_cores": free, "contention": "held"} if free else {}
    point = PointResult("concurrency", 1, True, signals=sig)
    cfg = EngineConfig(engine="llamacpp", threads=threads)
    return TrialResult("k", cfg.model_dump(), "base", "real", TrialStatus.OK, points=[point])


def test_the_threads_tried_are_the_largest_the_space_offers_within_the_free_cores() -> None:
    space = parse_space({"engine": "llamacpp", "knobs": {"threads": [1, 2, 4, 8]}})
    assert threads_for_host(_trial(None, 3), space) == 2
    assert threads_for_host(_trial(None, 1), space) == 1
    assert threads_for_host(_trial(None, None), space) is None  # the host had the cores
    assert threads_for_host(_trial(2, 3), space) is None  # it already fits
    narrow = parse_space({"engine": "llamacpp", "knobs": {"threads": [4, 8]}})
    assert threads_for_host(_trial(None, 2), narrow) is None  # none the space offers fits
    fixed = parse_space({"engine": "llamacpp", "knobs": {"parallel_slots": [1, 2]}})
    assert threads_for_host(_trial(None, 1), fixed) is None  # not the tuner's to change


class _HeldReal(SimBackend):
    """A "real" llama.cpp on a 2-core host with one core held by another process: the
    simulator, 20x slower and saying so in its signals whenever the engine runs more
    threads than the one free core (its default: all cores)."""

    name = "real"

    @contextlib.contextmanager
    def session(self, cfg: EngineConfig) -> Iterator[Session]:
        hw = self.hw
        if cfg.threads != 1:
            slow = {k: v / 20 for k, v in hw.tflops.items()}
            hw = hw.model_copy(
                update={"memory_bandwidth_gbs": hw.memory_bandwidth_gbs / 20, "tflops": slow}
            )
        yield SimSession(self.model, hw, cfg, profile=self.profile, slo=self.slo)

    def probe(self, session: Session, kind: str, load: float, *, search: bool = False):  # type: ignore[override]
        out, res = super().probe(session, kind, load, search=search)
        if session.cfg.threads != 1:  # type: ignore[attr-defined]
            out.signals |= {"free_cores": 1, "contention": "other processes held 1.0 of 2 cores"}
        return out, res


@pytest.fixture
def held_host(monkeypatch):
    yield from serve_real_with(monkeypatch, _HeldReal)


@pytest.fixture
def idle_host(monkeypatch):
    yield from serve_real_with(monkeypatch, SimAsReal)


def _settings(tmp_path: Path, name: str) -> TuneSettings:
    # h100-sxm: the simulator's step time does not see threads (a CPU host's would)
    space = parse_space(
        {"engine": "llamacpp", "knobs": {"parallel_slots": [1, 2, 4], "threads": [1, 2]}}
    )
    return hybrid_settings(tmp_path, name, space, ttft_p95_ms=20000, max_load=4, max_probes=3,
                           top_k=2, finalists=0, repeats=0)  # fmt: skip


def test_the_tuner_fits_threads_to_a_busy_host_right_after_the_baseline(
    tmp_path: Path, held_host
) -> None:
    out = Tuner(_settings(tmp_path, "held")).run()
    assert out.winner is not None
    real = sorted((t for t in out.ranked), key=lambda t: t.started_unix_s)
    # the baseline first, then the baseline at the one free core's threads, one change
    assert real[0].config.get("threads") is None
    assert real[1].config.get("threads") == 1
    assert {k: v for k, v in real[1].config.items() if k != "threads"} == {
        k: v for k, v in real[0].config.items() if k != "threads"
    }
    # it won, so the simulator's picks ran with it, and so does the winner
    assert all(t.config.get("threads") == 1 for t in real[1:3])
    assert out.winner.config.get("threads") == 1
    note = next(n for n in out.notes if n.startswith("host: "))
    assert (
        "other processes held 1.0 of 2 cores" in note and "kept for the simulator's picks" in note
    )
    # sim vs real leaves out what the simulator does not model: threads moved off the baseline's
    assert out.sim_vs_real and all("threads=1" not in r["label"] for r in out.sim_vs_real)


def _picks_said(said: list[str]) -> str:
    """The line after the simulator's ranking: what it sends to the real engine."""
    return next(m for m in said if "simulator ranked" in m)


def test_an_idle_host_verifies_as_before(tmp_path: Path, idle_host) -> None:
    said: list[str] = []
    out = Tuner(_settings(tmp_path, "idle"), said.append).run()
    real = sorted(out.ranked, key=lambda t: t.started_unix_s)
    assert not any(n.startswith("host: ") for n in out.notes)
    # the baseline, then the simulator's picks at the baseline's threads (blind to them)
    assert real[0].config.get("threads") is None
    assert real[1].config.get("threads") is None and real[1].config != real[0].config
    # the line names the picks in what the simulator models, as they are measured, and says
    # where the knob it cannot see stands (a label with threads in it would read predicted)
    line = _picks_said(said)
    picks = line.split("its picks for the real engine: ")[1]
    assert f"parallel_slots={real[1].config['parallel_slots']} " in picks
    assert "threads=" not in picks.split(" (it does not model")[0]
    assert picks.endswith("(it does not model threads: measured at the baseline's values, then "
                          "one change at a time)")  # fmt: skip
    assert "(the baseline: rank " in line


# --- before the study: the host check ---------------------------------------------------


def _busy(seconds: float) -> tuple[int, float]:
    return 2, 1.0  # one of two cores held by another process


def test_the_threads_checked_before_any_engine_runs_fit_the_cores_others_leave() -> None:
    space = parse_space({"engine": "llamacpp", "knobs": {"threads": [1, 2, 4]}})
    assert early_threads(space, 2, 1.0) == 1
    assert early_threads(space, 8, 3.4) == 4  # round(8 - 3.4) = 5 free: the largest within
    assert early_threads(space, 2, 0.3) is None  # the others hold under half a core
    pinned = parse_space({"engine": "llamacpp", "baseline": {"threads": 1},
                          "knobs": {"threads": [1, 2]}})  # fmt: skip
    assert early_threads(pinned, 2, 1.0) is None  # the baseline already fits
    fixed = parse_space({"engine": "llamacpp", "knobs": {"parallel_slots": [1, 2]}})
    assert early_threads(fixed, 2, 1.0) is None


def test_the_host_check_keeps_the_fit_only_when_clearly_faster(
    tmp_path: Path, held_host, monkeypatch
) -> None:
    settings = _settings(tmp_path, "check")
    kept: list[RunMeta] = []
    got = check_host(settings.real, settings.space, say=lambda m: None,
                     keep=lambda res, meta: kept.append(meta), sample=_busy)  # fmt: skip
    assert got is not None and got.threads == 1 and got.kept
    assert got.fit_req_s > 5 * got.base_req_s  # the held baseline is 20x slower
    assert [m.engine_config for m in kept] == [{"engine": "llamacpp"},
                                               {"engine": "llamacpp", "threads": 1}]  # fmt: skip
    assert {m.study for m in kept} == {"host-check-llamacpp"}
    assert "other processes held 1.0 of 2 cores" in got.line()
    # an idle host's sample: nothing measured
    assert check_host(settings.real, settings.space, say=print, sample=lambda s: (2, 0.1)) is None
    # a host that only looks busy (the fit is no faster): not kept
    monkeypatch.setattr(
        executors, "make_backend", lambda spec: SimAsReal(replace(spec, kind="sim"))
    )
    executors._BACKENDS.clear()
    same = check_host(settings.real, settings.space, say=lambda m: None, sample=_busy)
    assert same is not None and not same.kept and "not 25% faster" in same.line()


def test_a_busy_host_fits_the_threads_before_the_slo_probe_and_the_calibration(
    tmp_path: Path, held_host, monkeypatch
) -> None:
    monkeypatch.setattr("servetune.tune.hostfit.others_now", _busy)
    settings = _settings(tmp_path, "early")
    settings.host_slo = HostRule(ttft_x=4, tpot_x=3)
    calibrated: list[EngineConfig] = []

    def calibrate_first(real, sim, cfg, **kw):
        calibrated.append(cfg)
        raise Infeasible("launch", "no model file here")  # the simulator stays on roofline

    monkeypatch.setattr(cal, "calibrate_first", calibrate_first)
    said: list[str] = []
    out = Tuner(settings, said.append).run()
    assert out.host_check is not None and out.host_check.kept
    assert "measured at threads=1 (the host check's) and the rest at" in _picks_said(said)
    assert settings.work_base().threads == 1 and calibrated == [settings.work_base()]
    # the SLO is what the host gives at the threads that fit it, not at the starved default
    assert out.host_slo is not None and "threads=1" in out.host_slo.config
    # the fit first, the simulator's picks with it, the baseline last (still measured: the
    # reference), so its slow points cannot spend the picks' share of the budget
    real = sorted((t for t in out.ranked if t.backend == "real"), key=lambda t: t.started_unix_s)
    threads = [t.config.get("threads") for t in real]
    last = threads.index(None)  # then the blind phase's other values, time allowing
    assert last >= 2 and set(threads[:last]) == {1}
    assert real[0].config == {**real[last].config, "threads": 1}
    assert out.winner is not None and out.winner.config.get("threads") == 1
    note = next(n for n in out.notes if n.startswith("host: threads=1, fitted by the host check"))
    assert "the baseline measured last" in note
    assert any(n.startswith("host check: other processes held 1.0 of 2 cores") for n in out.notes)
    with Store.open(settings.db) as st:
        assert len(st.list_runs(study="host-check-llamacpp")) == 2
