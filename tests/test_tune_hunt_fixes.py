"""The tune bug hunt's fixes (simulator and pure code; each test failed before its fix):

- a step back from the OOM edge that met the SLO at no load tried was printed as what to
  ship, with its launch command and no warning, and the report's verdict shipped it too;
- the step back's cost read the internal score: a 1% dearer step back said "-1%";
- the report's "capacity point" showed the best-scoring point (2 users) under "capacity:
  4 users";
- a warm start at 8 req/s with --max-probes 4 halved down to 1 req/s, all failing, and
  called a config `no_slo` whose cold capacity is 0.5 req/s;
- `ttft_ms: {}` was an SLO every point met;
- `--objective latency --load concurrency` on an open-loop workload measured 1 user and
  called it the workload's own load;
- `--time-budget` under `--backend sim` and `--ray-cpus 0` were silently ignored;
- `-o results.json` (no HTML report) was found out after the whole study, as "--output".
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.cli import tune_cmd
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure.result import PointResult
from servetune.report.data import ReportData
from servetune.report.verdict import verdict
from servetune.slo import parse_slo
from servetune.status import TrialStatus
from servetune.tune.capacity import Probe, rate_lattice, search_capacity
from servetune.tune.executors import check_executor
from servetune.tune.objective import Objective
from servetune.tune.preset import TuneOptions, load_plan
from servetune.tune.space import config_key
from servetune.tune.trial import TrialResult
from servetune.tune.tuner import TuneOutcome, Tuner
from servetune.workload.spec import parse_workload
from test_tune_sim import CHAT, sim_settings

SPACE = {"engine": "vllm", "knobs": {"max_model_len": [1024, 8192]}}


def _trial(cfg: EngineConfig, status: TrialStatus, score: float | None) -> TrialResult:
    return TrialResult(
        key=config_key(cfg), config=cfg.model_dump(mode="json", exclude_defaults=True),
        label=f"max_model_len={cfg.max_model_len}", backend="sim", status=status,
        score=score, capacity=None if score is None else 2.0,
        launch_command=f"vllm serve --max-model-len {cfg.max_model_len}",
    )  # fmt: skip


def _recommend(
    tmp: Path, objective: Objective, step: TrialResult
) -> tuple[Tuner, dict, TrialResult]:
    """The tuner's recommendation for a winner at max_model_len 8192 ($1.98 per 1M tokens,
    or 2 req/s/GPU) whose step back (1024) was already measured as `step`."""
    s = dataclasses.replace(sim_settings(tmp, SPACE, strategy="grid"), objective=objective)
    tuner = Tuner(s)
    score = -1.98 if objective.kind == "cost" else 2.0
    winner = _trial(EngineConfig(engine="vllm", max_model_len=8192), TrialStatus.OK, score)
    tuner.trials[("sim", step.key)] = step
    assert s.sim is not None
    return tuner, tuner._recommend(winner, step.cfg, s.sim), winner


def _outcome(tuner: Tuner, rec: dict, winner: TrialResult) -> TuneOutcome:
    out = TuneOutcome("s", "db", "sim", tuner.s.objective, tuner.knobs)
    out.ranked, out.winner, out.recommended, out.explanation = [winner], winner, rec, ["won"]
    return out


def test_a_step_back_that_met_the_slo_at_no_load_is_not_what_to_ship(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = _trial(EngineConfig(engine="vllm", max_model_len=1024), TrialStatus.NO_SLO, None)
    tuner, rec, winner = _recommend(tmp_path, Objective("goodput"), step)
    # the winner is what to ship (`accept --from-study` takes `config`), the step back beside
    assert rec["config"] == {"max_model_len": 8192} and rec["same_as_winner"]
    assert rec["launch_command"] == "vllm serve --max-model-len 8192"
    assert rec["step_back"]["label"] == "max_model_len=1024"
    assert rec["step_back"]["status"] == "no_slo"
    assert rec["note"] == (
        "the winner: its step back from the OOM edge, max_model_len=1024, met the SLO at "
        "no load tried, so it keeps no step of memory headroom"
    )
    tune_cmd.print_outcome(_outcome(tuner, rec, winner))
    said = capsys.readouterr().out
    assert "ship one safe step back" not in said and "--max-model-len 1024" not in said
    assert "ship the winner: its step back from the OOM edge, max_model_len=1024" in said


@pytest.mark.parametrize(
    ("objective", "step_score", "words"),
    [
        (Objective("cost", 1.0), -2.0, "1% more expensive"),  # $2.00 against the winner's $1.98
        (Objective("goodput"), 1.9, "5% less goodput per GPU"),  # 1.9 against 2.0 req/s/GPU
    ],
)
def test_the_cost_of_safety_is_said_in_the_objectives_own_direction(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    objective: Objective,
    step_score: float,
    words: str,
) -> None:
    step = _trial(EngineConfig(engine="vllm", max_model_len=1024), TrialStatus.OK, step_score)
    tuner, rec, winner = _recommend(tmp_path, objective, step)
    assert not rec["same_as_winner"] and "note" not in rec
    assert rec["safety_margin"] == words
    assert rec["cost_of_safety"] > 0 if objective.kind == "cost" else rec["cost_of_safety"] < 0
    tune_cmd.print_outcome(_outcome(tuner, rec, winner))
    said = capsys.readouterr().out
    assert "ship one safe step back from the OOM edge: max_model_len=1024: " in said
    assert f"(vs the winner: {words})" in said


def test_a_latency_step_back_that_is_slower_says_higher() -> None:
    from servetune.tune.tuner import safety_margin

    got = safety_margin(Objective("latency"), -100.0, -101.0)  # P95 TTFT 100 ms, then 101 ms
    assert got["safety_margin"] == "1% higher P95 TTFT"
    assert got["cost_of_safety"] == pytest.approx(0.01)


# -- the report's verdict -------------------------------------------------------------


def _point(users: float, ttft: float, passed: bool = True) -> PointResult:
    return PointResult("concurrency", users, passed, ttft_p95_ms=ttft, completed=8)


def _report(winner: TrialResult, **summary: object) -> ReportData:
    s = {"study": "s", "mode": "sim", "objective": "goodput", "slo_met": True,
         "slo": {"ttft_ms": {"p95": 3779.0}}, "winner": winner.to_json(),
         "baseline": winner.to_json(), **summary}  # fmt: skip
    return ReportData("t", "w", [], "concurrency", knobs=["max_model_len"], tune=s)


def _winner() -> TrialResult:
    """The hunt's CPU study: best score at 2 users, capacity 4 users."""
    points = [_point(1, 945.0), _point(2, 1684.0), _point(4, 2915.0), _point(8, 9000.0, False)]
    return TrialResult(
        key="w", config={"max_model_len": 8192}, label="w", backend="sim",
        status=TrialStatus.OK, points=points, capacity=4.0, capacity_load=4.0, first_fail=8.0,
        score=1.0, best=points[1], launch_command="serve-winner",
    )  # fmt: skip


def test_the_capacity_point_row_is_the_point_at_the_capacity() -> None:
    rows = dict(verdict(_report(_winner())).rows)
    assert rows["capacity"].startswith("4 users within the SLO")
    assert rows["capacity point"].startswith("4 users: "), rows["capacity point"]
    assert rows["capacity point"].endswith("TTFT P95 2,915 ms (n=8, ~max)")


def test_the_ship_row_only_for_a_step_back_that_met_the_slo() -> None:
    w = _winner()
    step = {"config": {"max_model_len": 1024}, "label": "max_model_len=1024",
            "same_as_winner": False, "launch_command": "serve-step"}  # fmt: skip
    # an older study's summary: the failed step back itself as `recommended`
    v = verdict(_report(w, recommended={**step, "status": "no_slo", "score": None}))
    assert v.command == "serve-winner"
    assert dict(v.rows)["ship"] == (
        "the winner: its step back from the OOM edge, max_model_len=1024, missed the SLO (no_slo)"
    )
    # this study's: the winner, the step back beside it and why
    note = "the winner: its step back ... met the SLO at no load tried, so ..."
    rec = {"config": w.config, "label": "w", "same_as_winner": True,
           "launch_command": "serve-winner", "step_back": step, "note": note}  # fmt: skip
    v = verdict(_report(w, recommended=rec))
    assert v.command == "serve-winner" and dict(v.rows)["ship"] == note
    # a step back that met it is shipped, with what it costs
    ok = {**step, "status": "ok", "score": 0.9, "safety_margin": "10% less goodput per GPU"}
    v = verdict(_report(w, recommended=ok))
    assert v.command == "serve-step"
    assert dict(v.rows)["ship"] == (
        "one safe step back from the OOM edge: max_model_len=1024 "
        "(vs the winner: 10% less goodput per GPU)"
    )


def test_the_slo_summary_names_every_target() -> None:
    slo = {"ttft_ms": {"p95": 800.0}, "itl_ms": {"p99": 60.0}, "kv_cache_usage_max": 0.9}
    rows = dict(verdict(_report(_winner(), slo=slo)).rows)
    assert rows["capacity"].endswith("(P95 TTFT <= 800 ms, P99 ITL <= 60 ms, KV cache peak <= 90%)")


# -- the search -----------------------------------------------------------------------


def test_a_failing_warm_start_restarts_where_a_cold_search_starts() -> None:
    lattice = rate_lattice(0.25, 4096)
    cold, warm = lattice.index_of(1.0), lattice.index_of(8.0)

    def measure(load: float) -> Probe:  # the hunt's max_num_seqs=2: capacity 0.5 req/s
        return Probe(load, load <= 0.5, load, load if load <= 0.5 else None)

    got = search_capacity(measure, lattice, start_index=warm, max_probes=4, cold_index=cold)
    assert [p.load for p in got.probes] == [8.0, 1.0, 0.5, 0.707107]
    assert got.capacity == 0.5 and got.first_fail == 0.707107
    alone = search_capacity(measure, lattice, start_index=cold, max_probes=4)
    assert alone.capacity == got.capacity
    # a config above the cold start: the gallop up stops below the failed warm start
    strong = search_capacity(
        lambda x: Probe(x, x <= 3.0, x, x if x <= 3.0 else None),
        lattice, start_index=warm, max_probes=12, cold_index=cold,
    )  # fmt: skip
    assert strong.capacity == 2.828427 and strong.first_fail == 3.363586
    assert max(p.load for p in strong.probes) == 8.0  # nothing above the failed warm start


def test_the_tuner_gives_each_trial_its_cold_start(tmp_path: Path) -> None:
    s = sim_settings(tmp_path, SPACE, strategy="grid")
    task = Tuner(s)._task(s.sim, s.space.baseline_config(), start=20)  # type: ignore[arg-type]
    assert task.start_index == 20 and task.cold_index == s.start_index


def _options(**given: object) -> dict:
    """`tune`'s parameters as the command gets them with no flag, then `given`."""
    o = {n: p.default.default for n, p in inspect.signature(tune_cmd.tune).parameters.items()}
    return {**o, **given}


def test_a_sim_rate_search_takes_no_extra_doubling() -> None:
    o = _options(backend="sim", model="llama-3.1-8b", gpu="h100-sxm")
    rate = tune_cmd.build_settings(o)
    assert rate.search.load_kind == "rate" and rate.search.extra_doublings == 0
    users = tune_cmd.build_settings({**o, "load": "concurrency"})
    assert users.search.extra_doublings == 1  # the sweet spot's over-saturation point


def test_tune_input_and_output_len_fix_the_workload_it_tunes_under() -> None:
    """`tune --input-len 4096 --output-len 1024`: the preset's workload at those lengths
    (`workload.spec.with_lengths`, as bench and simulate read them)."""
    from servetune.workload.spec import Fixed, parse_workload

    o = _options(backend="sim", model="llama-3.1-8b", gpu="h100-sxm")
    fixed = tune_cmd.build_settings({**o, "input_len": 4096, "output_len": 1024})
    wl = parse_workload(fixed.sim.workload)
    assert {m.input_tokens for m in wl.mix} == {Fixed(value=4096)}
    assert {m.output_tokens for m in wl.mix} == {Fixed(value=1024)}
    own = parse_workload(tune_cmd.build_settings(o).sim.workload)
    assert own.arrival == wl.arrival and own.mix[0].input_tokens != Fixed(value=4096)


# -- input refused before anything runs -----------------------------------------------


@pytest.mark.parametrize("targets", [{}, {"p95": None}])
def test_an_slo_metric_without_a_target_is_refused(targets: dict) -> None:
    with pytest.raises(InputError) as e:
        parse_slo({"ttft_ms": targets, "tpot_ms": {"p95": 40}})
    assert e.value.one_line() == "slo.ttft_ms: has no target (e.g. p95: 800)"


def test_latency_refuses_a_load_of_the_other_kind() -> None:
    open_loop = parse_workload(CHAT)
    with pytest.raises(InputError, match=r"^--load: concurrency is not the workload's own"):
        load_plan(TuneOptions(objective="latency", load="concurrency"), open_loop)
    kind, _, fixed = load_plan(TuneOptions(objective="latency", load="rate"), open_loop)
    assert (kind, fixed) == ("rate", 1.0)
    assert load_plan(TuneOptions(load="concurrency"), open_loop)[0] == "concurrency"  # a search


@pytest.mark.parametrize(
    ("executor", "address", "cpus", "needle"),
    [
        ("ray", None, 0, "--ray-cpus: 0 runs no trial"),
        ("ray", "auto", 4, "--ray-cpus: sizes a local Ray only"),
        ("local", None, 2, "--ray-cpus: only with --executor ray"),
    ],
)
def test_ray_cpus_is_never_silently_changed(
    executor: str, address: str | None, cpus: int, needle: str
) -> None:
    with pytest.raises(InputError) as e:
        check_executor(executor, address, cpus)
    assert e.value.one_line().startswith(needle)
    check_executor("ray", None, 1)


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    base = ["--backend", "sim", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
            "--db", str(tmp / "x.db")]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "tune", *base, *args],
        capture_output=True, text=True, cwd=tmp, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--slo", "empty.yaml"], "error: slo.ttft_ms: has no target (e.g. p95: 800)"),
        (["--time-budget", "2"], "error: --time-budget: only real trials are timed"),
        (["--objective", "latency", "--load", "concurrency"], "error: --load: concurrency is"),
        (["-o", "r.json"], "error: --report: r.json exists and is not an HTML report"),
        (["-o", "x.db-wal"], "error: --report: x.db-wal is the store's database"),
        (["--executor", "ray", "--ray-cpus", "0"], "error: --ray-cpus: 0 runs no trial"),
        # named where it was given: the preset's key, not a --strategy nobody typed
        (["--preset", "p.yaml"], "error: preset.tune.strategy: unknown strategy 'nope'"),
        (["--strategy", "nope"], "error: --strategy: unknown strategy 'nope'"),
        (["--repeats", "0"], "error: --repeats: only the real engine's phases read it"),
        # two engines in one preset: its space's was ignored, unsaid
        (["--preset", "two.yaml"], "error: preset.space.engine: 'sglang' is not the preset's"),
    ],
)
def test_the_cli_refuses_before_the_study(tmp_path: Path, args: list[str], needle: str) -> None:
    import yaml

    preset = yaml.safe_load((Path(__file__).parents[1] / "examples/tune/vllm-gpu.yaml").read_text())
    preset["tune"] = {**preset.get("tune", {}), "strategy": "nope"}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(preset))
    del preset["tune"]["strategy"]
    preset["space"] = {**preset["space"], "engine": "sglang"}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(preset))
    (tmp_path / "empty.yaml").write_text("ttft_ms: {}\n")
    (tmp_path / "r.json").write_text('{"not": "html"}\n')
    p = _cli(tmp_path, *args)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(needle), line
    assert not (tmp_path / "x.db").exists()  # no study opened, nothing measured
    assert (tmp_path / "r.json").read_text() == '{"not": "html"}\n'
