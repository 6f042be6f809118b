"""§16 request distribution of runs stored without records: a simulated tune trial keeps
its metrics but not its records, so its request count is unknown (not 0), and its lengths
are redrawn from its workload, the same ones the simulator was given."""

from __future__ import annotations

from typing import Any

from servetune.engines.config import EngineConfig
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.results.schema import Load, RunResult
from servetune.sim.engine import simulate
from servetune.store.meta import request_distribution, simulated_request_distribution
from servetune.workload.spec import parse_workload

M, HW = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
WORKLOAD: dict[str, Any] = {
    "input_tokens": {"dist": "lognormal", "mean": 400, "sigma": 0.6, "min": 16, "max": 2000},
    "output_tokens": {"dist": "uniform", "low": 20, "high": 200},
    "count": 300,
    "arrival": {"kind": "poisson", "rate": 50},
}


def simulated() -> RunResult:
    res, _ = simulate(M, HW, EngineConfig(max_model_len=4096), parse_workload(WORKLOAD))
    return res


def test_a_run_whose_records_were_dropped_has_no_request_count() -> None:
    res = simulated()
    assert request_distribution(res.records, res.metrics, res.load)["requests"] == 300
    dropped = request_distribution([], res.metrics, res.load)
    assert dropped["requests"] is None and dropped["input_tokens"] is None
    assert request_distribution([], None, Load())["requests"] == 0  # nothing ran


def test_redrawn_lengths_are_the_ones_the_simulator_ran() -> None:
    res = simulated()
    measured = request_distribution(res.records, res.metrics, res.load)
    redrawn = simulated_request_distribution(res.workload)
    assert redrawn is not None and redrawn["source"] == "workload"
    assert redrawn["requests"] == measured["requests"] == 300
    assert redrawn["input_tokens"] == measured["input_tokens"]
    assert redrawn["output_tokens"] == measured["output_tokens"]


def test_lengths_that_need_files_are_not_redrawn() -> None:
    wl = simulated().workload
    trace = {**wl, "mix": [], "trace": {"path": "/nonexistent/trace.jsonl"}}
    dataset = {**wl, "mix": [{"name": "d", "dataset": {"path": "/nonexistent/d.jsonl"}}]}
    for workload in (trace, dataset, {"arrival": "not a workload"}):
        assert simulated_request_distribution(workload) is None
