"""The one seam "measure a point" (servetune.measure): the simulator and a server give the
same RunResult for the same points, a sweep stops at a failed point and keeps what was
measured, and bench, simulate and tune all produce their results through the sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.bench.runner import BenchOptions
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.measure import (
    NO_SINKS,
    Point,
    ResultFiles,
    ServerSession,
    SimSession,
    Sinks,
    StoreSettings,
    SweepLoads,
    sweep,
    sweep_points,
)
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.model import get_model
from servetune.results.files import load_result
from servetune.slo import parse_slo
from servetune.store import Store
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

WORKLOAD = {
    "count": 12,
    "arrival": {"kind": "poisson", "rate": 1},
    "input_tokens": {"dist": "fixed", "value": 20},
    "output_tokens": {"dist": "fixed", "value": 6},
}
SLO = parse_slo({"ttft_ms": {"p95": 800}, "tpot_ms": {"p95": 40}})


def server(url: str) -> ServerSession:
    return ServerSession(BenchOptions(url=url, workers=1), WordTokenizer(), SLO)


def simulator() -> SimSession:
    cfg = EngineConfig(engine="vllm", max_num_seqs=8, max_model_len=4096)
    return SimSession(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), cfg, slo=SLO)


def test_sweep_points_label_cap_and_check_every_load_first() -> None:
    spec = parse_workload(WORKLOAD, swept=True)
    points = sweep_points(spec, SweepLoads((2.0, 0.5), (8,), count=5), max_concurrency=4)
    assert [p.label for p in points] == ["rate2", "rate0.5", "conc8"]
    arrivals = [p.spec.arrival for p in points]
    assert [(a.kind, a.concurrency) for a in arrivals] == [
        ("poisson", 4),
        ("poisson", 4),
        ("closed", 8),  # a closed loop keeps its own user count under the cap
    ]
    assert [a.rate for a in arrivals[:2]] == [2.0, 0.5]
    assert all(p.spec.count == 5 for p in points)
    assert [p.label for p in sweep_points(spec, SweepLoads())] == ["point"]
    # the workload's own open loop keeps its kind and rate under the cap (it became a
    # closed loop of 4 users); a cap with no open loop to cap is refused, not dropped
    (own,) = sweep_points(spec.with_load(rate=3.0), SweepLoads(), max_concurrency=4)
    assert (own.spec.arrival.kind, own.spec.arrival.rate, own.spec.arrival.concurrency) == (
        "poisson",
        3.0,
        4,
    )
    with pytest.raises(InputError, match="--max-concurrency: caps an open loop"):
        sweep_points(spec, SweepLoads((), (4,)), max_concurrency=1)
    trace = spec.model_copy(update={"arrival": spec.arrival.model_copy(update={"kind": "trace"})})
    with pytest.raises(InputError, match="--concurrency"):
        sweep_points(trace, SweepLoads((1.0,), (4,)))  # refused before the rate is measured


def test_a_sim_sweep_and_a_mock_server_sweep_give_the_same_run_result(tmp_path: Path) -> None:
    points = sweep_points(parse_workload(WORKLOAD, swept=True), SweepLoads((40.0, 80.0)))
    with mock_in_thread(MockConfig()) as srv:
        real = sweep(server(f"http://127.0.0.1:{srv.port}"), points,
                     files=ResultFiles(tmp_path / "real.json"))  # fmt: skip
    sim = sweep(simulator(), points, files=ResultFiles(tmp_path / "sim.json", save_text=True))
    assert [r.backend for r in real + sim] == ["real", "real", "sim", "sim"]
    for r, s, label in zip(real, sim, ("rate40", "rate80"), strict=True):
        assert r.status == s.status == "completed"
        assert r.workload == s.workload and r.load == s.load  # the same point, one schema
        assert r.load.rate == float(label[4:])
        assert len(r.records) == len(s.records) == r.metrics.completed == 12
        assert r.metrics.model_dump().keys() == s.metrics.model_dump().keys()
        assert r.metrics.slo_pass is not None and s.metrics.slo_pass is not None
        # and the files are the same runs, read back through the one schema
        for res, name in ((r, "real"), (s, "sim")):
            back = load_result(tmp_path / f"{name}-{label}.json")
            assert back.id == res.id and back.metrics == res.metrics
            assert [x.send_ns for x in back.records] == [x.send_ns for x in res.records]


class _SplitSession:
    """Points labelled `dead` go to a port nothing listens on (the circuit breaker
    trips); the others to the mock."""

    launch_command = None

    def __init__(self, live: ServerSession, dead: ServerSession) -> None:
        self.live, self.dead = live, dead
        self.measured: list[str] = []

    def measure(self, point: Point, sinks: Sinks = NO_SINKS):  # noqa: ANN201
        self.measured.append(point.label)
        return (self.dead if point.label == "dead" else self.live).measure(point, sinks)


def test_a_sweep_stops_at_a_failed_point_and_keeps_what_was_measured(tmp_path: Path) -> None:
    spec = parse_workload({**WORKLOAD, "count": 60}, swept=True)
    points = [Point(label, spec.with_load(rate=200)) for label in ("ok", "dead", "never")]
    db = str(tmp_path / "s.db")
    with mock_in_thread(MockConfig()) as srv:
        session = _SplitSession(
            server(f"http://127.0.0.1:{srv.port}"), server("http://127.0.0.1:9")
        )
        out = sweep(
            session,
            points,
            files=ResultFiles(tmp_path / "r.json", csv=tmp_path / "r.csv"),
            store=StoreSettings(db, "bench", study="stop"),
        )
    assert session.measured == ["ok", "dead"]  # nothing after the failed point
    assert [r.status for r in out] == ["completed", "failed"]  # the dead one reached nothing
    assert "connection refused at 127.0.0.1:9" in (out[1].stop_reason or "")
    assert sorted(p.name for p in tmp_path.glob("r-*.json")) == ["r-dead.json", "r-ok.json"]
    assert (tmp_path / "r-ok.records.jsonl").exists()  # flushed while it was measured
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 1 + 60 + len(out[1].records)
    with Store.open(db, create=False) as store:
        runs = {r.id: r for r in store.list_runs(study="stop")}
    assert {runs[r.id].status for r in out} == {"completed", "failed"}
    assert runs[out[0].id].n_records == 60


def test_bench_simulate_and_tune_measure_through_the_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[tuple[str, str]] = []  # (session kind, run id) in the order measured
    for cls in (ServerSession, SimSession):
        inner = cls.measure

        def spy(self, point, sinks=NO_SINKS, _inner=inner):  # noqa: ANN001, ANN202
            res = _inner(self, point, sinks)
            measured.append((type(self).__name__, res.id))
            return res

        monkeypatch.setattr(cls, "measure", spy)
    monkeypatch.chdir(tmp_path)
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps(WORKLOAD))
    with mock_in_thread(MockConfig()) as srv:
        code, out, err = run_cli(
            capsys, "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(wl),
            "--rate", "40,80", "--tokenizer", "word", "--json", "--no-store",
        )  # fmt: skip
    assert code == 0, err
    assert measured == [("ServerSession", r["id"]) for r in json.loads(out)]
    measured.clear()
    code, out, err = run_cli(capsys, "simulate", "-w", str(wl), "--rate", "5,10", "--json",
                              "--no-store")  # fmt: skip
    assert code == 0, err
    assert measured == [("SimSession", r["id"]) for r in json.loads(out)]
    measured.clear()
    from servetune.measure import BackendSpec
    from servetune.tune import executors
    from servetune.tune.capacity import concurrency_lattice
    from servetune.tune.objective import Objective
    from servetune.tune.space import parse_space
    from servetune.tune.trial import SearchSettings
    from servetune.tune.tuner import Tuner, TuneSettings

    spec = BackendSpec(
        kind="sim", engine="vllm", model="llama-3.1-8b", hardware="h100-sxm",
        workload=WORKLOAD, slo=SLO.model_dump(mode="json", exclude_none=True),
    )  # fmt: skip
    settings = TuneSettings(
        space=parse_space({"engine": "vllm", "knobs": {"max_num_seqs": [16, 64]}}),
        mode="sim",
        objective=Objective("goodput"),
        search=SearchSettings("concurrency", concurrency_lattice(64), max_probes=6),
        sim=spec,
        strategy="grid",
        db=str(tmp_path / "tune.db"),
        edge=False,
        verbose=False,
    )
    executors._BACKENDS.clear()
    outcome = Tuner(settings).run()
    executors._BACKENDS.clear()
    probes = [p for t in outcome.ranked for p in t.points]
    assert probes and len(measured) == len(probes)  # every probe measured by the simulator
    assert {kind for kind, _ in measured} == {"SimSession"}
