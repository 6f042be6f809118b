"""The hybrid flow's calibration cache, without an engine: what the key is made of, when a
cached profile is reused, when the verified configs make it stale (and the next run then
calibrates again, into a new profile file), and the sim-vs-real rows it is judged on.
The sweep and the fit are replaced by stand-ins that count their calls."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from servetune.engines.config import EngineConfig
from servetune.measure import BackendSpec
from servetune.measure.result import PointResult
from servetune.results.schema import Dist, Metrics, RunResult
from servetune.sim.profile import FitQuality, Profile, load_profile
from servetune.slo import parse_slo
from servetune.status import TrialStatus
from servetune.tune import calibration as cal
from servetune.tune import simvsreal
from servetune.tune.calibration import (
    CacheEntry,
    CalibrationCache,
    CalibrationKey,
    calibrate_first,
    file_identity,
    judge,
    least_disturbed,
    reuse_reason,
    stated_error,
    sweep_cases,
)
from servetune.tune.profilecheck import BaselineCheck
from servetune.tune.trial import TrialResult
from servetune.workload.spec import parse_workload

KEY = CalibrationKey("llamacpp", "b11434", "/m/gemma.gguf", 253_000_000, 17, "AMD EPYC|2")
WORKLOAD = {
    "name": "main",
    "api": "completions",
    "count": 6,
    "input_tokens": {"dist": "uniform", "low": 32, "high": 96},
    "output_tokens": {"dist": "fixed", "value": 16},
    "arrival": {"kind": "closed", "concurrency": 1},
}


def _profile(rel_rmse: float, method: str = "least squares + replay") -> Profile:
    return Profile(
        engine="llamacpp",
        model="gemma-3-270m",
        hardware="local",
        coefficients={"const": 0.01, "prefill_tokens": 0.001},
        fit=FitQuality(samples=100, r2=0.9, rel_rmse=rel_rmse, confidence="high", method=method),
        created_utc="2026-12-01T00:00:00+00:00",
    )


def _entry(**kw) -> CacheEntry:
    base = dict(
        key=asdict(KEY),
        profile="/p.json",
        stated_error=0.2,
        config=EngineConfig(engine="llamacpp").model_dump(mode="json"),
        fitted_utc="t",
        sweep_s=1.0,
        runs_dir="/r",
    )
    return CacheEntry(**{**base, **kw})


def test_the_key_changes_with_engine_version_model_file_and_host() -> None:
    digests = {KEY.digest}
    for change in (
        {"engine_version": "b11435"},
        {"model_file": "/m/other.gguf"},
        {"model_bytes": 1},
        {"model_mtime_ns": 18},
        {"host": "Intel Xeon|16"},
        {"threads": 1},
    ):
        digests.add(replace(KEY, **change).digest)
    assert len(digests) == 7
    assert replace(KEY).digest == KEY.digest  # stable: a function of the fields only


def test_a_replaced_model_file_is_another_model(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    first = file_identity(str(f))
    assert first[0] == str(f.resolve()) and first[1] == 10
    f.write_bytes(b"y" * 11)  # re-downloaded: other size and time
    os.utime(f, ns=(first[2] + 10**9, first[2] + 10**9))
    assert file_identity(str(f)) != first


def test_reuse_is_refused_for_each_reason_and_granted_otherwise() -> None:
    assert "no calibration cached" in (reuse_reason(None, True) or "")
    assert "stale (off by 40%)" in (reuse_reason(_entry(stale="off by 40%"), True) or "")
    assert "gone" in (reuse_reason(_entry(), False) or "")
    assert reuse_reason(_entry(), True) is None


def test_the_median_error_decides_staleness() -> None:
    assert judge([], 0.2) == (None, None)
    med, stale = judge([0.05, -0.1, 0.9], 0.2)  # one noisy trial does not condemn it
    assert med == pytest.approx(0.1) and stale is None
    med, stale = judge([-0.3, 0.25, 0.1], 0.2)
    assert med == pytest.approx(0.25) and stale is not None and "stated error 20%" in stale
    # a profile that states a large error is still held to the 25% target
    assert judge([0.2, 0.24], 0.6)[1] is None
    med, stale = judge([0.3, -0.3], 0.6)
    assert stale is not None and "the 25% target (the profile states 60%)" in stale
    # the idle main job: 7% against a stated 6%, while the finalists' trials sat 13% off
    # their own repetitions: nothing to blame the profile for; beyond that floor, stale
    assert judge([0.07, -0.05, 0.10], 0.06, noise=0.13) == (pytest.approx(0.07), None)
    assert judge([0.07, -0.05, 0.10], 0.06)[1] is not None  # no floor measured
    assert "stated error 6%" in (judge([0.2, 0.25], 0.06, noise=0.13)[1] or "")


def test_the_check_line_says_when_the_hosts_noise_kept_the_profile(tmp_path) -> None:
    """Kept within the stated error, kept within the study's own noise (said so, with
    the floor), or marked stale: three lines a user can tell apart."""
    entry = _entry(stated_error=0.06)
    c = cal.Calibration(KEY, entry, CalibrationCache(tmp_path), reused=True, why="")
    said: list[str] = []
    c.verify([0.05, -0.04], said.append, noise=0.13)
    assert said[-1].endswith("within 6%: kept"), said[-1]
    c.verify([0.12, -0.11], said.append, noise=0.13)
    assert said[-1].endswith(
        "above 6% but within this host's noise, 13% (the finalists against their own "
        "repetitions): kept"
    ), said[-1]
    assert c.check is not None and c.check["noise"] == 0.13 and c.entry.stale is None
    c.verify([0.2, -0.3], said.append, noise=0.13)
    assert "marked stale" in said[-1] and c.entry.stale is not None


def test_the_least_disturbed_sample_is_the_fastest() -> None:
    def run(tok_s: float) -> RunResult:
        return RunResult.model_construct(metrics=Metrics.model_construct(output_tok_s=tok_s))

    slow, fast = run(3.0), run(40.0)
    assert least_disturbed([slow, fast]) is fast and least_disturbed([fast, slow]) is fast


def test_the_stated_error_of_a_replay_fit_is_its_log_error_as_a_factor() -> None:
    assert stated_error(_profile(0.2)) == pytest.approx(0.2214, abs=1e-4)
    assert stated_error(_profile(0.2, "least squares")) == pytest.approx(0.2)


def test_the_cache_round_trips_and_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path)
    assert cache.load(KEY) is None
    cache.save(KEY, _entry())
    assert cache.load(KEY) == _entry()
    assert cache.load(replace(KEY, host="other|4")) is None  # another key, another file
    path = cache.entry_path(KEY)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "key": asdict(replace(KEY, model_bytes=1))}))
    assert cache.load(KEY) is None  # an entry that does not hold what its name says
    path.write_text("{not json")
    assert cache.load(KEY) is None


def test_the_sweep_is_the_study_workload_at_one_two_and_four_users() -> None:
    cases = sweep_cases(parse_workload(WORKLOAD))
    assert [c.name for c in cases] == ["cal-study-c1", "cal-study-c2", "cal-study-c4"]
    assert [c.arrival.concurrency for c in cases] == [1, 2, 4]
    assert [c.count for c in cases] == [4, 6, 10]
    assert all(c.mix == parse_workload(WORKLOAD).mix for c in cases)


def _specs() -> tuple[BackendSpec, BackendSpec]:
    common = dict(
        engine="llamacpp",
        model="gemma-3-270m",
        hardware="cpu-host",
        workload=parse_workload(WORKLOAD).model_dump(mode="json"),
        slo=parse_slo({"ttft_ms": {"p95": 2000}}).model_dump(mode="json", exclude_none=True),
    )
    return BackendSpec(kind="real", model_path="/m/gemma.gguf", **common), BackendSpec(
        kind="sim", **common
    )


def test_calibrate_reuse_go_stale_and_calibrate_again(tmp_path, monkeypatch) -> None:
    calls: list[str] = []

    def sweep(real, cfg, cases, *, say, keep, stop=None):
        calls.append("sweep")
        if stop is not None and stop([]):  # a cached profile is checked on the first block
            calls.append("stopped")
        return [], "b11434"

    def fit(runs, real, cfg, version, measured=(), needs=None):
        return _profile(0.15)

    monkeypatch.setattr(cal, "key_for", lambda real, cfg: replace(KEY, threads=cfg.threads))
    monkeypatch.setattr(cal, "run_sweep", sweep)
    monkeypatch.setattr(cal, "fit", fit)
    # the check on this study's baseline passes here (its own test is below)
    monkeypatch.setattr(cal, "check_cached", lambda runs, entry, real, base: BaselineCheck(
        {"req_s": 0.05}, cal.tolerance(entry.stated_error), ("cal-study-c1",)))  # fmt: skip
    real, sim = _specs()
    base = EngineConfig(engine="llamacpp")
    cache = CalibrationCache(tmp_path)
    said: list[str] = []

    def first(force: bool = False) -> cal.Calibration:
        return calibrate_first(real, sim, base, cache=cache, force=force, say=said.append)

    one = first()
    assert calls == ["sweep"] and not one.reused
    assert "no calibration cached" in one.why
    assert load_profile(one.entry.profile).fit.rel_rmse == 0.15  # the profile is on disk
    assert one.sim_spec(sim).profile == one.entry.profile
    assert one.entry.stated_error == pytest.approx(0.1618, abs=1e-4)

    two = first()  # reused after the check's first block: no fit
    assert calls == ["sweep", "sweep", "stopped"] and two.reused
    assert two.entry.profile == one.entry.profile
    del calls[1:]

    two.verify([0.05, -0.08], said.append)  # within 16%: kept
    assert two.check is not None and two.check["stale"] is None
    assert "kept" in said[-1] and cache.load(KEY).stale is None

    three = first()
    assert calls == ["sweep", "sweep", "stopped"] and three.reused
    del calls[1:]
    three.verify([0.4, -0.35, 0.1], said.append)  # median 35% > 16%: stale
    assert "marked stale" in said[-1] and "35%" in said[-1]
    assert [c.get("kind") for c in cache.load(KEY).checks] == ["baseline", None] * 2

    four = first()  # the next run calibrates again, into a new profile file
    assert calls == ["sweep", "sweep"] and not four.reused
    assert "stale" in four.why and cache.load(KEY).stale is None
    assert four.entry.profile != one.entry.profile  # a new study, not a resumed one
    assert first(force=True).why == "asked to recalibrate" and len(calls) == 3
    # other threads are another key: calibrated apart, the default-threads one untouched
    one_thread = calibrate_first(real, sim, base.with_(threads=1), cache=cache, force=False,
                                 say=said.append)  # fmt: skip
    assert not one_thread.reused and one_thread.key.threads == 1 and len(calls) == 4
    assert first().reused and calls[-2:] == ["sweep", "stopped"]


def _point(load: float, req_s: float, ttft: float, tpot: float) -> PointResult:
    return PointResult(
        "concurrency", load, True, req_s=req_s, goodput_req_s=req_s,
        ttft_p50_ms=ttft, ttft_p95_ms=ttft * 1.5, tpot_p50_ms=tpot, tpot_p95_ms=tpot * 1.2,
    )  # fmt: skip


def _trial(backend: str, config: dict, points: list[PointResult], best: int) -> TrialResult:
    return TrialResult(
        key=repr(sorted(config.items())), config=config, label=f"slots={config['parallel_slots']}",
        backend=backend, status=TrialStatus.OK, points=points, best=points[best],
        score=points[best].goodput_req_s, capacity=points[best].load,
    )  # fmt: skip


def test_sim_vs_real_rows_compare_at_the_real_best_load() -> None:
    cfg4 = {"engine": "llamacpp", "parallel_slots": 4, "threads": 2}
    cfg1 = {"engine": "llamacpp", "parallel_slots": 1, "threads": 2}
    # the simulator's search stopped at 8 users, the real one at 4: compared at 4
    sim4 = _trial("sim", cfg4, [_point(4, 4.0, 200, 50), _point(8, 6.0, 400, 60)], best=1)
    real4 = _trial("real", cfg4 | {"threads": 1}, [_point(4, 5.0, 250, 40)], best=0)
    sim1 = _trial("sim", cfg1, [_point(1, 2.0, 100, 30)], best=0)
    real1 = _trial("real", cfg1, [_point(1, 1.0, 90, 30), _point(2, 2.0, 180, 33)], best=1)
    asked: list[tuple] = []

    def simulate_at(cfg, kind, load):
        asked.append((cfg.parallel_slots, kind, load))
        return _point(load, 2.2, 150, 31)

    table = simvsreal.rows([sim4, sim1], [real4, real1], ["threads"], simulate_at)
    a, b = table
    assert (a["load"], a["sim_req_s_gpu"], a["real_req_s_gpu"]) == (4, 4.0, 5.0)
    assert a["req_s_error"] == pytest.approx(-0.2)
    assert a["ttft_p50_error"] == pytest.approx(-0.2) and a["tpot_p50_error"] == pytest.approx(0.25)
    assert a["score_error"] == pytest.approx(0.2)  # the old figure: each at its own best load
    assert asked == [(1, "concurrency", 2.0)]  # the simulator never probed 2 users at slots=1
    assert b["req_s_error"] == pytest.approx(0.1)
    assert simvsreal.throughput_errors(table) == pytest.approx([-0.2, 0.1])
    assert simvsreal.line(a) == (
        "sim vs real, slots=4 at 4 users: 4.00 vs 5.00 req/s/GPU (-20%), "
        "P50 TTFT 200 vs 250 ms (-20%), P50 TPOT 50 vs 40 ms (+25%)"
    )


def _sweep_run(users: int, req_s: float, ttft: float, tpot: float) -> RunResult:
    m = Metrics.model_construct(
        req_s=req_s,
        output_tok_s=req_s * 16,
        ttft_ms=Dist.model_construct(p50=ttft),
        tpot_ms=Dist.model_construct(p50=tpot),
    )
    wl = {"name": f"cal-study-c{users}", "arrival": {"kind": "closed", "concurrency": users}}
    return RunResult.model_construct(workload=wl, metrics=m)


def test_the_floor_is_the_baseline_against_its_own_sweep_at_the_same_users() -> None:
    base = {"engine": "llamacpp", "parallel_slots": 4}
    trial = _trial("real", base, [_point(1, 1.0, 100, 10), _point(2, 2.0, 100, 20)], best=1)
    sweep = [_sweep_run(1, 0.5, 800, 12), _sweep_run(2, 2.2, 110, 18), _sweep_run(4, 3, 1, 1)]
    floor = simvsreal.floor_rows(sweep, trial)
    assert len(floor) == 2  # 4 users: the trial never ran it, no pair
    assert floor[0].err == pytest.approx({"req_s": 50.0, "ttft_p50": 700.0, "tpot_p50": 20.0})
    assert floor[1].err == pytest.approx({"req_s": 10.0, "ttft_p50": 10.0, "tpot_p50": 10.0})
    assert simvsreal.floor_rows(sweep, None) == []


def test_each_figure_is_met_missed_or_too_noisy_against_25_percent_and_the_floor() -> None:
    def row(req: float, ttft: float, tpot: float) -> dict:
        return {"label": "x", "req_s_error": req, "ttft_p50_error": ttft, "tpot_p50_error": tpot}

    table = [row(0.1, -0.6, 0.3), row(-0.2, 0.9, 0.5), row(0.05, 0.7, -0.4)]
    sweep = [_sweep_run(1, 1.05, 300, 10.5), _sweep_run(2, 2.1, 300, 21)]
    trial = _trial("real", {"engine": "llamacpp", "parallel_slots": 4},
                   [_point(1, 1.0, 100, 10), _point(2, 2.0, 100, 20)], best=1)  # fmt: skip
    v = simvsreal.verdicts(table, simvsreal.floor_rows(sweep, trial))
    assert v["req_s"]["verdict"] == "met" and v["req_s"]["median_error"] == pytest.approx(0.1)
    # TTFT is 70% off, but the engine moved 200% against itself: not the model's miss
    assert v["ttft_p50"]["verdict"] == "too noisy" and v["ttft_p50"]["floor"] == pytest.approx(2)
    # TPOT is 40% off while the engine reproduced itself within 5%: a miss
    assert v["tpot_p50"]["verdict"] == "missed" and v["tpot_p50"]["floor"] == pytest.approx(0.05)
    line = simvsreal.verdict_line(v)
    assert line.startswith("sim vs real on 3 verified configs")
    assert "throughput 10% (floor 5%): within 25%" in line
    assert "P50 TTFT 70% (floor 200%): beyond 25%, but so is the host's own floor" in line
    assert "P50 TPOT 40% (floor 5%): MISSED 25%" in line
    # without a floor (no calibration sweep) every miss counts
    assert simvsreal.verdicts(table, [])["ttft_p50"]["verdict"] == "missed"
    assert "no floor measured" in simvsreal.verdict_line(simvsreal.verdicts(table, []))
    assert simvsreal.verdicts([], []) == {}


def test_the_sweep_warms_the_engine_up_before_it_measures(monkeypatch) -> None:
    import contextlib
    from types import SimpleNamespace

    calls: list[tuple[str, int]] = []

    def bench(url, model, case, engine, scrape, repeat):
        calls.append((case.name, repeat))
        tok_s = 10.0 + len(calls)  # later samples faster: the least disturbed is the last
        return RunResult.model_construct(
            workload={"name": case.name}, metrics=Metrics.model_construct(output_tok_s=tok_s,
            req_s=1.0, ttft_ms=Dist.model_construct(), tpot_ms=Dist.model_construct()),
        )  # fmt: skip

    class Backend:
        @contextlib.contextmanager
        def session(self, cfg):
            yield SimpleNamespace(srv=SimpleNamespace(url="http://x", served_model="m"))

    monkeypatch.setattr(cal, "make_backend", lambda spec: Backend())
    monkeypatch.setattr(cal, "bench_real", bench)
    monkeypatch.setattr(cal, "engine_version", lambda srv: "b1")
    real, _ = _specs()
    cases = sweep_cases(parse_workload(WORKLOAD))
    kept: list[RunResult] = []
    best, version = cal.run_sweep(real, EngineConfig(engine="llamacpp"), cases,
                                  say=lambda m: None, keep=kept.append)  # fmt: skip
    assert calls[0] == ("cal-study-c1", cal.SWEEP_SAMPLES)  # the warm-up: first, own seed
    assert len(calls) == 1 + cal.SWEEP_SAMPLES * len(cases)
    assert len(kept) == cal.SWEEP_SAMPLES * len(cases)  # the warm-up is neither kept ...
    assert [r.workload["name"] for r in best] == [c.name for c in cases]  # ... nor fitted on
    assert version == "b1"


def test_the_floor_holds_each_finalist_against_its_repetitions() -> None:
    cfg = {"engine": "llamacpp", "parallel_slots": 4}
    t = _trial("real", cfg, [_point(2, 2.0, 100, 20), _point(4, 4.0, 200, 40)], best=1)
    assert simvsreal.repeat_rows([t]) == []  # not re-run: nothing to compare
    t.reps = [_point(4, 2.0, 400, 40), _point(4, 5.0, 250, 50), _point(4, 1.0, 300, 30)]
    (row,) = simvsreal.repeat_rows([t])
    # the point against the median of the repetitions: 2.0 req/s, 300 ms, 40 ms
    assert row.err == pytest.approx({"req_s": 100.0, "ttft_p50": 100 / 3, "tpot_p50": 0.0})
    assert "3 repetitions" in row.name


def _simulated_engine(monkeypatch, truth: Profile, sweeps: list[str]) -> None:
    """The simulator stands in for the engine: every sweep run is `truth` simulating the
    case (the host as it is now); the fit returns `truth` (what a sweep would measure)."""
    import contextlib
    from types import SimpleNamespace

    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate

    def bench(url, model, case, engine, scrape, repeat):
        sweeps.append(f"{case.name}#{repeat}")
        res, _ = simulate(get_model("gemma-3-270m"), get_hardware("cpu-host"),
                          EngineConfig(engine="llamacpp"), case, profile=truth,
                          keep_requests=True)  # fmt: skip
        return res

    class Backend:
        @contextlib.contextmanager
        def session(self, cfg):
            yield SimpleNamespace(srv=SimpleNamespace(url="http://x", served_model="m"))

    monkeypatch.setattr(cal, "key_for", lambda real, cfg: KEY)
    monkeypatch.setattr(cal, "make_backend", lambda spec: Backend())
    monkeypatch.setattr(cal, "bench_real", bench)
    monkeypatch.setattr(cal, "engine_version", lambda srv: "b11434")
    monkeypatch.setattr(cal, "fit", lambda runs, real, cfg, version, measured, needs: truth)


def _host(speed: float) -> Profile:
    """A llama.cpp step-time profile of a host `speed` times as fast as the reference."""
    return _profile(0.1).model_copy(update={"hardware": "cpu-host", "coefficients": {
        "const": 0.004 / speed, "prefill_tokens": 2e-4 / speed, "decode_seqs": 1e-3 / speed,
    }})  # fmt: skip


@pytest.mark.parametrize("cached_speed, reused", [(1.0, True), (6.0, False)])
def test_a_cached_profile_is_reused_only_while_it_predicts_the_baseline_now(
    tmp_path, monkeypatch, cached_speed, reused
) -> None:
    """A profile fitted on a quiet host (6x the speed of the host now) is refused after
    the sweep's first block and fitted again on the whole sweep; one that still predicts
    the host is reused after that block, with no fit."""
    from servetune.sim.profile import save_profile

    sweeps: list[str] = []
    now = _host(1.0)
    _simulated_engine(monkeypatch, now, sweeps)
    cache = CalibrationCache(tmp_path)
    old = tmp_path / "old.profile.json"
    save_profile(_host(cached_speed), old)
    cache.save(KEY, _entry(profile=str(old), stated_error=0.16, runs_dir=str(tmp_path / "r")))
    real, sim = _specs()
    said: list[str] = []
    got = calibrate_first(real, sim, EngineConfig(engine="llamacpp"), cache=cache,
                          force=False, say=said.append)  # fmt: skip
    block = ["cal-study-c1#0", "cal-study-c2#0", "cal-study-c4#0"]
    assert sweeps[0] == "cal-study-c1#2"  # the warm-up
    check = got.baseline_check
    assert check is not None and check.holds is reused
    assert any("calibration check on this study's baseline" in m for m in said)
    entry = cache.load(KEY)
    assert entry.checks[-1]["kind"] == "baseline" and entry.checks[-1]["holds"] is reused
    if reused:  # one block measured, the cached file ranks, the block is the floor's reference
        assert sweeps[1:] == block and got.reused and got.entry.profile == str(old)
        assert max(check.errors.values()) < 0.05  # the same host: replayed to within noise
        assert [r.workload["name"] for r in got.sweep_runs(EngineConfig(engine="llamacpp"))] == [
            "cal-study-c1", "cal-study-c2", "cal-study-c4"]  # fmt: skip
    else:  # refused: the sweep runs on, a new profile is fitted and cached
        assert sweeps[1:] == block + [b.replace("#0", "#1") for b in block]
        assert not got.reused and entry.profile != str(old)
        assert "missed this study's baseline" in got.why and "refused" in " ".join(said)
        # 6x too fast: throughput far above, TPOT far below what the host does now
        assert check.errors["tpot_p50"] > 0.7 and check.errors["req_s"] > 1.0


def test_sim_vs_real_replays_the_real_points_own_requests() -> None:
    """Each real point draws its own prompts; the simulator's own point at that load drew
    the workload's. Replaying the real point's requests compares like with like: a "real"
    run that is the simulator itself (on other prompts) is then matched exactly."""
    from servetune.errors import InputError
    from servetune.hardware import get_hardware
    from servetune.measure import make_backend
    from servetune.model import get_model
    from servetune.sim.engine import simulate

    _, spec = _specs()
    backend = make_backend(spec)
    cfg = EngineConfig(engine="llamacpp", parallel_slots=2)
    wl = parse_workload(WORKLOAD)
    other = wl.with_load(concurrency=2, count=8).model_copy(update={"seed": 5})
    real_run, _ = simulate(get_model("gemma-3-270m"), get_hardware("cpu-host"), cfg, other,
                           slo=backend.slo, keep_requests=True)  # fmt: skip
    at = PointResult.from_run(real_run, "concurrency", 2.0)
    at.run_id = "r1"
    real = _trial("real", {"engine": "llamacpp", "parallel_slots": 2}, [at], best=0)
    own = _point(2.0, 0.1, 9999.0, 9999.0)  # the simulator's own point: other prompts
    sim = _trial("sim", {"engine": "llamacpp", "parallel_slots": 2}, [own], best=0)

    def load(run_id: str) -> RunResult:  # as the store's: an unknown run is an InputError
        if run_id != "r1":
            raise InputError("run", f"no run {run_id}")
        return real_run

    def replay(c, p):
        return simvsreal.replay_point(backend, load, c, p)

    (row,) = simvsreal.rows([sim], [real], [], lambda *a: None, replay)
    assert row["same_requests"]
    for fig in ("req_s", "ttft_p50", "tpot_p50"):
        assert row[f"{fig}_error"] == pytest.approx(0.0, abs=1e-6), fig
    # without the replay (or a run that cannot be read back) the own point is compared
    (plain,) = simvsreal.rows([sim], [real], [], lambda *a: None)
    assert not plain["same_requests"] and plain["ttft_p50_error"] > 10
    at.run_id = "gone"
    (missing,) = simvsreal.rows([sim], [real], [], lambda *a: None, replay)
    assert not missing["same_requests"]


def test_the_study_needs_only_what_its_workload_exercises(tmp_path: Path) -> None:
    """`needs_of`: the main job's workload (uniform 32-96-token prompts, no prefixes)
    needs batches only; the CPU held-out mix (64 and 600-900-token prompts behind shared
    prefixes) needs prefix hits and mixed lengths too; bursts never (the study ranks at its
    own loads); a trace cannot be drawn without a tokenizer, so every gap counts."""
    from servetune.tune.calibration import needs_of
    from servetune.workload.spec import load_workload

    root = Path(__file__).resolve().parents[1]
    plain = parse_workload({"count": 6, "seed": 0,
                            "input_tokens": {"dist": "uniform", "low": 32, "high": 96},
                            "output_tokens": {"dist": "fixed", "value": 16},
                            "arrival": {"kind": "closed", "concurrency": 1}})  # fmt: skip
    n = needs_of(plain)
    assert n is not None and (n.max_batch, n.prefix_runs, n.mixed_length_runs) == (4, 0, 0)
    mix = needs_of(load_workload(root / "benchmarks" / "cpu_heldout.yaml"))
    assert mix is not None and (mix.prefix_runs, mix.mixed_length_runs, mix.bursty_runs) == (
        1,
        1,
        0,
    )
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 64, "output_length": 8}\n')
    trace = parse_workload({"trace": {"path": str(path)}, "arrival": {"kind": "trace"}})
    assert needs_of(trace) is None
