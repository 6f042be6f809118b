"""The report's sweet spot is the tuner's (one seam: the analysis `tune` stored and
printed, else `tune.sweetspot.analyse`), drawn against users in flight from closed-loop
runs only; closed-loop and open-loop runs never share a load axis."""

from __future__ import annotations

from pathlib import Path

from servetune.engines.config import EngineConfig
from servetune.report.charts import latency_vs_load, sweet_spot
from servetune.report.data import load_report_data
from servetune.report.sweetspot import report_sweet_spot
from servetune.results.schema import Load, RunResult, TuneTag
from servetune.store import Store
from servetune.store.meta import RunMeta
from servetune.tune.sweetspot import analyse
from synthetic_runs import synthetic_run, synthetic_sweep

USERS = (1, 2, 4, 8, 16, 32, 64, 128)
CFG = EngineConfig(max_num_seqs=64)


def _open_loop(rate: float, req_s: float, run_id: str) -> tuple[RunResult, RunMeta]:
    """An open-loop (Poisson) run of the same config, achieving `req_s`: more than any
    closed-loop point, so on a req/s axis it would be the sweep's last point."""
    r, m = synthetic_run(16, config=CFG, seed=9)
    r.id = m.id = run_id
    r.load = Load(kind="poisson", rate=rate)
    r.workload = {**r.workload, "arrival": {"kind": "poisson", "rate": rate}}
    r.metrics.req_s = req_s
    return r, m


def _tag(r: RunResult, phase: str, kind: str, load: float) -> None:
    pid = f"k/{phase}/{load}"
    r.target.tune = TuneTag(pid=pid, key="k", phase=phase, load_kind=kind, load=load)


def _sim_tune_study(store: Store, knee_override: float | None = None) -> dict:
    """A simulated rate-search tune study as `tune` stores it: one open-loop trial run per
    config, the winner's closed-loop sweet-spot sweep, and the summary with the sweet spot
    `tune` printed (analyse over the sweep's (users, output tok/s))."""
    sweep = synthetic_sweep(USERS, config=CFG, backend="sim")
    for r, m in sweep:
        _tag(r, "sweet", "concurrency", float(r.load.concurrency or 0))
        store.save_result(r, m, study="t")
    top = max(r.metrics.req_s for r, _ in sweep)
    trial, meta = _open_loop(rate=3 * top, req_s=3 * top, run_id="trial-k")
    trial.backend = "sim"
    meta.backend = "sim"
    _tag(trial, "trial", "rate", 3 * top)
    store.save_result(trial, meta, study="t")
    spot = analyse([(float(r.load.concurrency or 0), r.metrics.output_tok_s) for r, _ in sweep])
    stored = spot.to_json()
    if knee_override is not None:  # what tune printed, whatever a recomputation says
        stored["knee"] = knee_override
    winner = {"key": "k", "backend": "sim", "label": "w", "config": {}, "sweet_spot": stored}
    summary = {"study": "t", "mode": "sim", "winner": winner, "baseline": winner,
               "ranked": [winner]}  # fmt: skip
    store.update_study_meta("t", {"summary": summary}, "tune")
    return stored


def test_the_report_stars_the_sweet_spot_tune_printed(tmp_path: Path) -> None:
    with Store.open(str(tmp_path / "r.db")) as store:
        stored = _sim_tune_study(store)
        data = load_report_data(store, ["t"])
    knee = stored["knee"]
    assert knee is not None and stored["reason"] == "start of the saturation region"
    chart = sweet_spot(data)
    assert f"Sweet spot: {knee:g} in flight (start of the saturation region)" in chart.note
    assert "achieved req/s" not in chart.note
    curve = next(t for t in chart.fig.data if t.name == "output tok/s")
    assert list(curve.x) == [float(c) for c in USERS]  # users, not the trial's req/s
    assert list(curve.y) == stored["throughput"]
    star = next(t for t in chart.fig.data if t.name == "sweet spot")
    assert list(star.x) == [knee]
    assert chart.fig.layout.xaxis.title.text == "concurrency (users)"


def test_the_stored_analysis_is_the_one_seam(tmp_path: Path) -> None:
    """A tune report reads the knee `tune` stored, not a second computation of its own."""
    with Store.open(str(tmp_path / "r.db")) as store:
        _sim_tune_study(store, knee_override=8.0)
        data = load_report_data(store, ["t"])
    found = report_sweet_spot(data)
    assert found is not None and found.from_tune and found.spot.knee == 8.0
    assert "Sweet spot: 8 in flight" in sweet_spot(data).note


def test_a_simulated_tune_study_draws_latency_against_users(tmp_path: Path) -> None:
    """One open-loop run per config makes no rate sweep; the winner's closed-loop sweep
    does: the latency chart's axis is users, and the trial run is left off it (said)."""
    with Store.open(str(tmp_path / "r.db")) as store:
        _sim_tune_study(store)
        data = load_report_data(store, ["t"])
    assert data.x_kind == "concurrency"
    trial = next(r for r in data.runs if r.info.id == "trial-k")
    assert data.x(trial) is None
    chart = latency_vs_load(data)
    xs = {x for t in chart.fig.data for x in t.x}
    assert xs == {float(c) for c in USERS}
    assert "1 open-loop run(s) left off this concurrency axis" in chart.note


def test_closed_and_open_loop_runs_never_share_a_load_axis(tmp_path: Path) -> None:
    """A bench report of a rate sweep and a concurrency sweep of one config: latency on
    the rate axis holds only the open-loop runs; the sweet spot only the closed-loop ones,
    analysed by the tuner's function."""
    with Store.open(str(tmp_path / "r.db")) as store:
        sweep = synthetic_sweep(USERS, config=CFG)
        for r, m in sweep:
            store.save_result(r, m, study="b")
        for k, rate in enumerate((5.0, 10.0, 20.0)):
            store.save_result(*_open_loop(rate, rate, f"open-{k}"), study="b")
        data = load_report_data(store, ["b"])
    assert data.x_kind == "rate" and len(data.series) == 1
    chart = latency_vs_load(data)
    ids = {i for t in chart.fig.data for i in (t.text or ())}
    assert ids == {"open-0", "open-1", "open-2"}
    assert f"{len(USERS)} closed-loop run(s) left off this rate axis" in chart.note
    expected = analyse([(float(r.load.concurrency or 0), r.metrics.output_tok_s) for r, _ in sweep])
    spot = sweet_spot(data)
    assert not report_sweet_spot(data).from_tune  # type: ignore[union-attr]
    assert f"Sweet spot: {expected.knee:g} in flight ({expected.reason})" in spot.note
    curve = next(t for t in spot.fig.data if t.name == "output tok/s")
    assert list(curve.x) == [float(c) for c in USERS]


def test_open_loop_runs_alone_have_no_sweet_spot(tmp_path: Path) -> None:
    """Output tok/s against achieved req/s is a straight line ("linear" to the end):
    the chart says it needs a closed-loop sweep instead of starring a point on it."""
    with Store.open(str(tmp_path / "r.db")) as store:
        for k, rate in enumerate((5.0, 10.0, 20.0, 40.0)):
            store.save_result(*_open_loop(rate, rate, f"open-{k}"), study="o")
        data = load_report_data(store, ["o"])
    chart = sweet_spot(data)
    assert chart.fig is None and "closed-loop sweep" in chart.note


def test_a_run_stopped_at_its_decided_miss_is_no_point_of_the_curve(tmp_path: Path) -> None:
    """A tuner probe that stopped once its SLO miss was decided (`slo_missed`) measured a
    part of a closed loop's rounds: the report's sweet spot leaves it out, as the tuner's
    analysis does, instead of reading its low throughput as over-saturation."""
    from servetune.status import RunStatus

    with Store.open(str(tmp_path / "r.db")) as store:
        sweep = synthetic_sweep(USERS, config=CFG)
        for r, m in sweep:
            if r.load.concurrency == 128:
                r.status, r.stop_reason = RunStatus.SLO_MISSED, "the SLO is already missed"
                r.metrics.output_tok_s /= 10  # two answers of a loop of 128
            store.save_result(r, m, study="b")
        data = load_report_data(store, ["b"])
    found = report_sweet_spot(data)
    assert found is not None and 128.0 not in found.spot.loads
    assert list(found.spot.loads) == [float(c) for c in USERS[:-1]]
