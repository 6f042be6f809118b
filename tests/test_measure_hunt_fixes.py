"""Fixes to the measure seam from the diagnose bug hunt: the tuner's closed-loop points keep
a workload's duration, and `simulate --replay --duration` draws for that duration."""

from __future__ import annotations

from pathlib import Path

from servetune.engines.config import EngineConfig
from servetune.hardware import get_hardware
from servetune.measure import SimulateSettings, SweepLoads, load_spec, run_simulate
from servetune.measure.steady import SIM_STEADY
from servetune.model import get_model
from servetune.results.files import write_result
from servetune.results.schema import RunResult
from servetune.sim.engine import simulate
from servetune.workload.spec import parse_workload

TIMED = {"duration_s": 300, "arrival": {"kind": "closed", "concurrency": 4},
         "input_tokens": {"dist": "fixed", "value": 200},
         "output_tokens": {"dist": "fixed", "value": 100}}  # fmt: skip


def test_a_closed_loop_point_keeps_the_workloads_duration() -> None:
    """The hunt's dur.yaml (300 s, no count) at 8 users: count 8 x per_user replaced the
    duration, and the 300 s run ended after 40 requests."""
    spec = load_spec(parse_workload(TIMED), "concurrency", 8, 5, SIM_STEADY)
    assert (spec.duration_s, spec.count, spec.arrival.concurrency) == (300, None, 8)
    counted = {**TIMED, "count": 10}
    del counted["duration_s"]
    spec = load_spec(parse_workload(counted), "concurrency", 8, 5, SIM_STEADY)
    assert (spec.duration_s, spec.count) == (None, 40)  # a count: per_user x users at least


CFG = EngineConfig(max_num_seqs=8)


def _simulated(load: dict) -> RunResult:
    """A simulated run of 100/20-token requests under `load`, with its requests kept."""
    lengths = {"input_tokens": {"dist": "fixed", "value": 100},
               "output_tokens": {"dist": "fixed", "value": 20}}  # fmt: skip
    w = parse_workload({**load, **lengths})
    return simulate(
        get_model("llama-3.1-8b"), get_hardware("h100-sxm"), CFG, w, keep_requests=True
    )[0]


def test_a_replay_with_a_duration_is_drawn_for_that_duration(tmp_path: Path) -> None:
    """`simulate --replay X --duration N` sent X's own 20 requests and ignored N."""
    base = _simulated({"count": 20, "arrival": {"kind": "poisson", "rate": 4}})
    path = tmp_path / "b.json"
    write_result(base, path)
    own = run_simulate(SimulateSettings(config=CFG, replay=path))
    assert len(own[0].records) == 20
    timed = run_simulate(
        SimulateSettings(config=CFG, replay=path, loads=SweepLoads(duration_s=30.0))
    )
    sends = [r.send_ns for r in timed[0].records]
    assert len(sends) > 60 and 25 < (max(sends) - min(sends)) / 1e9 <= 30  # 4/s for 30 s


def test_a_replay_of_a_run_that_ended_at_its_duration_sends_what_it_sent(
    tmp_path: Path,
) -> None:
    """A 1 s closed loop of 2 users sent 148 of its 4,096-request pool and stopped at its
    duration; the replay kept the duration, ran the closed loop that long at simulated
    speed and sent 18, after a note saying it sends those 148."""
    from servetune.measure import Hooks

    base = _simulated({"duration_s": 60.0, "arrival": {"kind": "closed", "concurrency": 2}})
    sent = len(base.records)  # a minute at H100 speed
    cut = base.model_copy(update={"records": base.records[: sent // 3]})  # slower engine
    path = tmp_path / "b.json"
    write_result(cut, path)
    said: list[str] = []
    res = run_simulate(SimulateSettings(config=CFG, replay=path), Hooks(say=said.append))
    assert len(res[0].records) == sent // 3
    assert any(f"the replay sends those {sent // 3}" in s for s in said)
