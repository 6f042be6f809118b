"""Fixes to `diagnose`: the pool a llama.cpp server was given, figures nobody measured,
no-op and foreign knobs, the budget in force, the simulator's verdict, bad flags."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tests.cli_run import run_cli

from servetune.diagnose import Evidence, diagnose, diagnose_result
from servetune.diagnose.knobs import engine_has
from servetune.diagnose.predict import fits_in_kv
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure import Point, SimSession
from servetune.results.files import write_result
from servetune.results.schema import RunResult
from servetune.workload.spec import parse_workload

# 128 users of 2000 + 500 tokens (the hunt's kv.yaml)
KV = {"count": 300, "arrival": {"kind": "closed", "concurrency": 128},
      "input_tokens": {"dist": "fixed", "value": 2000},
      "output_tokens": {"dist": "fixed", "value": 500}}  # fmt: skip


def simulate(cfg: EngineConfig, workload: dict = KV) -> RunResult:
    from servetune.hardware import get_hardware
    from servetune.model import get_model

    session = SimSession(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), cfg)
    return session.measure(Point("p", parse_workload(workload)))


def finding(ev: Evidence, key: str):
    return next(f for f in diagnose(ev) if f.key == key)


def moves(f) -> list[tuple[str, object, object]]:
    return [(a.knob, a.now, a.next) for a in f.actions]


# 3 -----------------------------------------------------------------------------------


def test_the_pool_is_the_configured_one_not_what_memory_could_hold() -> None:
    ev = Evidence("x", engine="llamacpp", config={"parallel_slots": 16, "kv_cache_tokens": 64000})
    ev.settings = {"kv_cache_tokens": 443_024}  # the simulator's memory-bound capacity
    ev.input_tokens, ev.output_tokens = {"p99": 2000.0}, {"p99": 500.0}
    assert fits_in_kv(ev) == 25


def test_llamacpp_slots_are_not_raised_past_what_the_context_holds() -> None:
    """-c 64000 over 16 slots; doubling to 32 would leave 2,000 tokens a slot for requests
    of 2,500: every one refused. The slots stop at 64000 // 2500 = 25."""
    cfg = EngineConfig(engine="llamacpp", parallel_slots=16, kv_cache_tokens=64000)
    d = diagnose_result(simulate(cfg), whatif=False)
    f = next(f for f in d.findings if f.key == "batch_queueing")
    assert moves(f)[0] == ("parallel_slots", 16, 25)


# 4 -----------------------------------------------------------------------------------


def test_no_queue_share_without_completions_and_no_made_up_gauges() -> None:
    ev = Evidence("x", config={"max_num_seqs": 8}, concurrency=64, waiting_max=56.0)
    assert "batch_queueing" not in [f.key for f in diagnose(ev)]  # nothing completed
    ev.completed, ev.ttft, ev.tpot = 300, {"mean": 5000.0, "p50": 5340.0}, {"p50": 8.0}
    f = finding(ev, "batch_queueing")
    assert f.trigger.startswith("waiting peaked at 56 (max_num_seqs 8); queueing is 88%")


# 5 -----------------------------------------------------------------------------------


def test_a_saturated_pool_gives_only_a_floor_for_fp8() -> None:
    ev = Evidence("x", preemptions=12.0, kv_usage_max=1.0, config={"max_num_seqs": 64})
    fp8 = finding(ev, "kv_pressure").actions[0]
    assert "at least 50%" in fp8.predicted and "preemptions -> 0" not in fp8.predicted
    ev = Evidence("x", preemptions=0.0, kv_usage_max=0.96, waiting_max=3.0)
    fp8 = finding(ev, "kv_pressure").actions[0]
    assert fp8.predicted == "peak KV usage 96% -> 48% at this load, preemptions -> 0"


def test_simulated_figures_carry_the_simulators_expected_error() -> None:
    res = simulate(EngineConfig(max_num_seqs=128, gpu_memory_utilization=0.5))
    fp8 = diagnose_result(res).findings[0].actions[0]
    assert res.target.sim.expected_error
    assert fp8.predicted.endswith(res.target.sim.expected_error)


# 6, 7 ----------------------------------------------------------------------------------


def test_actions_that_change_nothing_are_dropped() -> None:
    ev = Evidence("x", preemptions=12.0, kv_usage_max=1.0)
    ev.config = {"max_num_seqs": 64, "gpu_memory_utilization": 0.95, "kv_cache_dtype": "fp8"}
    assert "gpu_memory_utilization" not in [a.knob for a in finding(ev, "kv_pressure").actions]
    ev = Evidence("x", failure={"kind": "oom", "reason": "CUDA out of memory"})
    ev.config = {
        "gpu_memory_utilization": 0.8,
        "enforce_eager": True,
        "max_num_batched_tokens": 512,
    }
    knobs = [a.knob for a in finding(ev, "oom").actions]
    assert "gpu_memory_utilization" not in knobs and "enforce_eager" not in knobs
    assert all(a.now != a.next for f in diagnose(ev) for a in f.actions)


def test_queueing_with_a_pool_that_holds_no_more_falls_back_to_replicas() -> None:
    ev = Evidence("x", config={"max_num_seqs": 80}, concurrency=128, waiting_max=48.0)
    ev.settings = {"kv_cache_tokens": 75 * 2500}
    ev.ttft, ev.input_tokens, ev.output_tokens = {"mean": 2000.0}, {"p99": 2000.0}, {"p99": 500.0}
    assert moves(finding(ev, "batch_queueing"))[0] == ("replicas", 1, 2)


def test_the_last_oom_step_raises_tensor_parallelism() -> None:
    ev = Evidence("x", failure={"kind": "oom", "reason": "CUDA out of memory"})
    ev.config = {"tensor_parallel_size": 8}
    assert moves(finding(ev, "oom"))[-1] == ("tensor_parallel_size", 8, 16)


# 8 -----------------------------------------------------------------------------------


def test_the_prefill_budget_grows_from_the_one_in_force() -> None:
    """Prompts of 16,000 tokens reach the 8192 in force (2,000 did not: each was one step
    already, and their 250 ms TTFT P95 was not high)."""
    few = {"kind": "closed", "concurrency": 4}
    short = {"dist": "fixed", "value": 8}
    long_in = {"dist": "fixed", "value": 16000}
    w = {**KV, "count": 40, "arrival": few, "input_tokens": long_in, "output_tokens": short}
    res = simulate(EngineConfig(), w)
    assert res.target.max_num_batched_tokens == 8192
    f = next(f for f in diagnose_result(res, whatif=False).findings if f.key == "prefill_heavy")
    assert ("max_num_batched_tokens", 8192, 16384) in moves(f)


def test_a_long_short_mix_does_not_also_ask_for_a_bigger_budget() -> None:
    ev = Evidence("x", config={"max_num_batched_tokens": 256}, completed=300)
    ev.e2e = {"mean": 6460.0, "p50": 2960.0, "p99": 33830.0}
    ev.ttft = {"mean": 3200.0, "p50": 2580.0, "p99": 30000.0}
    ev.input_tokens = {"p50": 100.0, "p99": 30000.0}
    ev.output_tokens = {"p50": 20.0, "p99": 1000.0}
    found = {f.key: f for f in diagnose(ev)}
    assert {"tail_long_short_mix", "prefill_heavy"} <= set(found)
    assert all(a.knob != "max_num_batched_tokens" for a in found["prefill_heavy"].actions)


# 9 -----------------------------------------------------------------------------------


def test_llamacpp_gets_its_own_knobs_and_none_it_lacks() -> None:
    ev = Evidence("x", engine="llamacpp", failure={"kind": "oom", "reason": "failed to allocate"})
    ev.config = {"parallel_slots": 4}
    f = finding(ev, "oom")
    knobs = [a.knob for a in f.actions]
    assert "gpu_memory_utilization" not in knobs and "tensor_parallel_size" not in knobs
    assert knobs[0] == "kv_cache_tokens" and ("parallel_slots", 4, 2) in moves(f)
    assert ("kv_cache_dtype", "auto", "int8") in moves(f)
    ev = Evidence("x", engine="llamacpp", preemptions=5.0, kv_usage_max=0.99)
    ev.config = {"parallel_slots": 4, "kv_cache_tokens": 4096}
    f = finding(ev, "kv_pressure")
    assert moves(f)[:2] == [("kv_cache_tokens", 4096, 8192), ("kv_cache_dtype", "auto", "int8")]
    assert "gpu_memory_utilization" not in [a.knob for a in f.actions]
    ev = Evidence("x", engine="llamacpp", running_mean=4.0)
    ev.config = {"parallel_slots": 4, "tensor_parallel_size": 2}
    ev.tel = {"gpu_util_mean": 0.3}
    f = finding(ev, "gpu_underused")
    assert moves(f)[0] == ("parallel_slots", 4, 8)
    assert "tensor_parallel_size" not in [a.knob for a in f.actions]


def test_sglang_is_not_told_a_vllm_environment_variable() -> None:
    ev = Evidence("x", engine="sglang")
    ev.tel = {"engine_runq_wait_share_mean": 0.8, "engine_runq_wait_cores_mean": 1.0,
              "host_cpu_busy_mean": 0.99, "host_cpu_cores_max": 2.0,
              "other_cpu_cores_mean": 1.5}  # fmt: skip
    f = finding(ev, "host_overloaded")
    assert not any("VLLM" in a.knob for a in f.actions)


def test_engine_has_reads_the_adapters_unsupported_knobs() -> None:
    assert not engine_has("llamacpp", "kv_cache_dtype", ("auto", "fp8"))
    assert engine_has("llamacpp", "kv_cache_dtype", ("auto", "int8"))
    assert not engine_has("llamacpp", "gpu_memory_utilization", (0.9, 0.93))
    assert engine_has("vllm", "gpu_memory_utilization", (0.9, 0.93))
    assert engine_has("llamacpp", "replicas", (1, 2))  # not an engine knob


# 10 ----------------------------------------------------------------------------------


def test_a_what_if_the_simulator_shows_worse_is_said_so_and_demoted() -> None:
    """fp8 KV at 35% memory: 0.35 -> 0.38 simulated worse (P99 TTFT and preemptions up)."""
    res = simulate(
        EngineConfig(kv_cache_dtype="fp8", max_num_seqs=128, gpu_memory_utilization=0.35)
    )
    f = next(f for f in diagnose_result(res).findings if f.key == "kv_pressure")
    gmu = next(a for a in f.actions if a.knob == "gpu_memory_utilization")
    assert "simulated: worse (" in (gmu.predicted or "")
    assert f.actions[0].knob != "gpu_memory_utilization" and f.actions[-1] is gmu


def test_a_what_if_where_nothing_completes_is_worse() -> None:
    from servetune.diagnose.whatif import verdict

    res = simulate(EngineConfig(max_num_seqs=128, gpu_memory_utilization=0.5))
    dead = res.model_copy(deep=True)
    dead.metrics.completed = 0
    assert verdict(res, dead) == "worse (nothing completed)"
    assert verdict(res, res) == "no gain"


# 11, 12, 13 -------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [math.inf, 1e12, math.nan, 0.5])
def test_a_window_past_a_day_is_one_line(window: float) -> None:
    from servetune.diagnose import watch

    with pytest.raises(InputError, match="^--window: .*1 to 86400 seconds"):
        watch("http://127.0.0.1:9", window)


def test_a_leak_with_an_unknown_count_says_unknown() -> None:
    ev = Evidence("x", cancellation={"cancelled": 3, "running_after_run": None, "freed": False})
    assert "unknown" in finding(ev, "cancel_leak").trigger


def test_live_only_flags_are_refused_for_a_stored_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.json"
    write_result(simulate(EngineConfig(max_num_seqs=8), {**KV, "count": 20}), path)
    for flag, value in (("--window", "5"), ("--engine", "bogus"), ("--telemetry-url", "http://x")):
        code, _, err = run_cli(capsys, "diagnose", str(path), flag, value)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: {flag}: only applies with --url"), err
    code, _, _ = run_cli(capsys, "diagnose", str(path))
    assert code == 0
