"""Fixes to `diagnose` from the second bug hunt: an open loop's queue on the simulator, the
what-if of a run it cannot reproduce or that did not stream, actions that went the wrong
way (a "smaller" pool that grew, a "bigger" one that shrank, llama.cpp's -b, a cap under
the engine's default), symptoms on healthy figures or idle clocks, unmeasured figures read
as 0, and bad stored values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli_run import run_cli

from servetune.diagnose import Evidence, diagnose, diagnose_result, from_result
from servetune.diagnose.run import Diagnosis, render
from servetune.engines.config import EngineConfig
from servetune.measure import Point, SimSession
from servetune.results.schema import RunResult, TelemetrySeries
from servetune.sim.profile import Profile
from servetune.workload.spec import parse_workload

# 128 users of 2000 + 500 tokens: the pool of gpu_memory_utilization 0.5 overflows
KV = {"count": 300, "arrival": {"kind": "closed", "concurrency": 128},
      "input_tokens": {"dist": "fixed", "value": 2000},
      "output_tokens": {"dist": "fixed", "value": 500}}  # fmt: skip


def simulate(cfg: EngineConfig, workload: dict, *, profile=None, hw=None) -> RunResult:
    from servetune.hardware import get_hardware
    from servetune.model import get_model

    hw = hw or get_hardware("h100-sxm")
    session = SimSession(get_model("llama-3.1-8b"), hw, cfg, profile=profile)
    return session.measure(Point("p", parse_workload(workload)))


def keys(ev: Evidence) -> list[str]:
    return [f.key for f in diagnose(ev)]


def finding(ev: Evidence, key: str):
    return next(f for f in diagnose(ev) if f.key == key)


def moves(f) -> list[tuple[str, object, object]]:
    return [(a.knob, a.now, a.next) for a in f.actions]


# 1 -----------------------------------------------------------------------------------


def test_a_simulated_open_loop_past_the_cap_queues() -> None:
    """30 req/s of 200 + 100 tokens on max_num_seqs 8 (the hunt's oq.yaml): hundreds in
    flight past the cap, TTFT tens of seconds, and no finding at all."""
    w = {"count": 300, "arrival": {"kind": "poisson", "rate": 30},
         "input_tokens": {"dist": "fixed", "value": 200},
         "output_tokens": {"dist": "fixed", "value": 100}}  # fmt: skip
    res = simulate(EngineConfig(max_num_seqs=8), w)
    d = diagnose_result(res, whatif=False)
    assert d.evidence.waiting_max == res.metrics.max_in_flight - 8 > 0
    f = next(f for f in d.findings if f.key == "batch_queueing")
    assert moves(f)[0] == ("max_num_seqs", 8, 16)


# 2 -----------------------------------------------------------------------------------

PROFILE = {"kind": "servetune-sim-profile", "version": 1, "engine": "vllm",
           "model": "llama-3.1-8b", "hardware": "h100-sxm",
           "coefficients": {"const": 0.03, "prefill_tokens": 0.00002, "decode_seqs": 0.0002,
                            "kv_read_tokens": 0.0, "attn_pairs": 0.0, "prefill_sq": 0.0,
                            "cached_pairs": 0.0}}  # fmt: skip
QUEUE = {"count": 200, "arrival": {"kind": "closed", "concurrency": 64},
         "input_tokens": {"dist": "fixed", "value": 200},
         "output_tokens": {"dist": "fixed", "value": 100}}  # fmt: skip


def test_a_what_if_of_a_profiled_run_is_not_simulated_on_another_tier() -> None:
    """The run names its profile, not its coefficients: re-simulated without them it was
    another engine (P99 TTFT 10.2 s -> 1.2 s, TPOT 33 -> 8.7 ms) with the gpu tier's
    error quoted for a calibrated run."""
    res = simulate(EngineConfig(max_num_seqs=16), QUEUE, profile=Profile.model_validate(PROFILE))
    assert res.target.tier == "calibrated"
    f = next(f for f in diagnose_result(res).findings if f.key == "batch_queueing")
    said = f.actions[0].predicted or ""
    assert "no simulated what-if: the run used profile vllm@" in said, said
    assert "simulated: P99" not in said and "expected |error|" not in said


def test_a_what_if_of_a_run_on_other_hardware_is_not_simulated() -> None:
    """A --hardware-file entry under a catalog name: the run records the name only."""
    from servetune.hardware import get_hardware

    hw = get_hardware("h100-sxm")
    small = hw.model_copy(update={"memory_gib": hw.memory_gib / 2})
    res = simulate(EngineConfig(max_num_seqs=128, gpu_memory_utilization=0.5), KV, hw=small)
    f = next(f for f in diagnose_result(res).findings if f.key == "kv_pressure")
    said = f.actions[0].predicted or ""
    assert "do not reproduce the run" in said and "simulated: P99" not in said, said


def test_a_run_that_does_not_reproduce_names_the_build_that_simulated_it() -> None:
    """The run records the servetune build that simulated it: when today's simulator gives
    other figures, the message says whether the simulator changed since (another build) or
    the run had what the store does not keep (this build)."""
    from servetune.build import build_id
    from servetune.diagnose.whatif import not_reproduced, why_no_whatif

    res = simulate(EngineConfig(max_num_seqs=16), QUEUE)
    assert res.target.sim.build == build_id()
    assert why_no_whatif(res) is None  # reproduced: the what-ifs run
    res.metrics.ttft_ms.p99 = (res.metrics.ttft_ms.p99 or 0.0) * 2  # as an older simulator's
    said = why_no_whatif(res) or ""
    assert "though this build simulated it" in said, said
    res.target.sim.build = "0123456789ab"
    said = why_no_whatif(res) or ""
    assert f"servetune build 0123456789ab simulated it and this is {build_id()}" in said, said
    assert "before builds were named" in not_reproduced(None, build_id())


def test_a_run_the_simulator_reproduces_keeps_its_what_if() -> None:
    res = simulate(EngineConfig(max_num_seqs=16), QUEUE)
    f = next(f for f in diagnose_result(res).findings if f.key == "batch_queueing")
    assert "simulated: P99 TTFT" in (f.actions[0].predicted or "")


# 3 -----------------------------------------------------------------------------------


def test_a_what_if_of_a_run_that_did_not_stream_is_judged_on_e2e() -> None:
    """stream: false has no TTFT: fp8 KV's win (preemptions 37 -> 0) read "worse (nothing
    completed)" and was moved last."""
    from servetune.diagnose.whatif import resimulate, verdict

    res = simulate(
        EngineConfig(max_num_seqs=128, gpu_memory_utilization=0.5), {**KV, "stream": False}
    )
    assert res.metrics.ttft_ms.p99 is None and res.metrics.completed
    after = resimulate(res, {"kv_cache_dtype": "fp8"})
    assert after is not None and verdict(res, after) is None
    f = next(f for f in diagnose_result(res).findings if f.key == "kv_pressure")
    fp8 = f.actions[0]
    assert fp8.knob == "kv_cache_dtype", moves(f)
    assert (
        "simulated: P99 E2E" in (fp8.predicted or "") and "nothing completed" not in fp8.predicted
    )


# 4, 5 ---------------------------------------------------------------------------------


def oom(config: dict, engine: str = "vllm") -> Evidence:
    return Evidence("x", engine=engine, config=config, failure={"kind": "oom", "reason": "OOM"})


def test_the_first_oom_step_never_grows_the_pool() -> None:
    """max(0.8, 0.7 - 0.05) asked a 0.7 server for 0.8 as "a smaller KV pool"."""
    f = finding(oom({"gpu_memory_utilization": 0.7}), "oom")
    assert "gpu_memory_utilization" not in [a.knob for a in f.actions]
    f = finding(oom({"gpu_memory_utilization": 0.95}), "oom")
    assert moves(f)[0] == ("gpu_memory_utilization", 0.95, 0.9)


def test_the_first_oom_step_shrinks_a_pool_the_config_fixes() -> None:
    """With kv_cache_space_gib (vLLM's --kv-cache-memory-bytes) the fraction sizes no pool."""
    f = finding(oom({"kv_cache_space_gib": 4.0}), "oom")
    assert moves(f)[0] == ("kv_cache_space_gib", 4.0, 2.0)
    assert "gpu_memory_utilization" not in [a.knob for a in f.actions]
    f = finding(oom({"kv_cache_tokens": 64000}), "oom")
    assert moves(f)[0] == ("kv_cache_tokens", 64000, 32000)


def test_a_bigger_pool_never_lowers_the_memory_fraction() -> None:
    ev = Evidence("x", config={"gpu_memory_utilization": 0.97}, preemptions=12.0)
    ev.kv_usage_max = 0.99
    f = finding(ev, "kv_pressure")
    assert "gpu_memory_utilization" not in [a.knob for a in f.actions], moves(f)


def test_the_oom_order_does_not_raise_max_model_len() -> None:
    ev = oom({"max_model_len": 2048})
    ev.input_tokens, ev.output_tokens = {"p99": 3600.0}, {"p99": 500.0}
    assert "max_model_len" not in [a.knob for a in finding(ev, "oom").actions]


# 7 -----------------------------------------------------------------------------------


def decode_bound(engine: str, config: dict) -> Evidence:
    ev = Evidence("x", engine=engine, config=config, completed=20, running_busy_mean=4.0)
    ev.ttft, ev.tpot = {"p50": 60.0, "p95": 70.0}, {"p50": 120.0, "p95": 125.0}
    ev.e2e = {"mean": 7700.0, "p50": 7700.0}
    ev.ttft["mean"] = 60.0
    ev.input_tokens, ev.output_tokens = {"p50": 9.0, "p99": 9.0}, {"p50": 64.0, "p99": 64.0}
    return ev


def test_llamacpp_budget_is_its_batch_size_and_its_2048_default() -> None:
    """-b 256: "max_num_batched_tokens: default -> 1024" raised it, on a knob the adapter
    ignores when batch_size is set."""
    ev = decode_bound("llamacpp", {"batch_size": 256, "parallel_slots": 4})
    assert ev.batched_tokens == 256
    f = finding(ev, "decode_heavy")
    assert ("parallel_slots", 4, 2) in moves(f)
    assert not any("batch" in m[0] for m in moves(f)), moves(f)  # max(256, 256 // 2): none
    f = finding(decode_bound("llamacpp", {"batch_size": 1024}), "decode_heavy")
    assert ("batch_size", 1024, 512) in moves(f)
    f = finding(oom({}, engine="llamacpp"), "oom")
    assert ("parallel_slots", "default", 2) in moves(f)  # half of -np auto's 4 (was 128)


def test_llamacpps_activation_step_is_its_ubatch() -> None:
    """llama.cpp sizes its compute buffer for one -ub pass (min(-ub, -b); -ub 512 by
    default): the 2nd OOM step halved -b 2048 -> 1024, which frees nothing."""
    f = finding(oom({}, engine="llamacpp"), "oom")
    assert ("ubatch_size", "default (512)", 256) in moves(f)
    assert "batch_size" not in [m[0] for m in moves(f)], moves(f)
    f = finding(oom({"batch_size": 256}, engine="llamacpp"), "oom")  # -ub is min(512, -b)
    assert ("ubatch_size", "default (256)", 128) in moves(f)
    f = finding(oom({"ubatch_size": 128}, engine="llamacpp"), "oom")
    assert ("ubatch_size", 128, 64) in moves(f)
    assert ("max_num_batched_tokens", "default", 1024) in moves(finding(oom({}), "oom"))


def test_a_smaller_budget_from_an_unknown_vllm_default_is_below_every_default() -> None:
    """vLLM's default is 2048 or 8192 by GPU: 8192 // 2 = 4096 raised an A100's 2048."""
    f = finding(oom({}), "oom")
    assert ("max_num_batched_tokens", "default", 1024) in moves(f)


# 8 -----------------------------------------------------------------------------------


def test_an_idle_gpu_with_an_unknown_cap_asks_for_load_first() -> None:
    """No cap known: "max_num_seqs: default -> 256 (batch limit too small)" was a quarter
    of vLLM's 1024 on an H100."""
    ev = Evidence("x", engine="vllm", running_mean=3.0, tel={"gpu_util_mean": 0.3})
    f = finding(ev, "gpu_underused")
    assert f.actions[0].knob == "offered load"
    cap = next(a for a in f.actions if a.knob == "max_num_seqs")
    assert isinstance(cap.next, str) and "above its default" in cap.next
    ev = Evidence("x", engine="llamacpp", running_mean=3.0, tel={"gpu_util_mean": 0.3})
    f = finding(ev, "gpu_underused")
    assert f.actions[0].knob == "offered load"
    assert ("parallel_slots", "default", 8) in moves(f)


# 9 -----------------------------------------------------------------------------------


def short_answers(**kw) -> Evidence:
    """The hunt's b1.json: 50 + 12 tokens, TTFT P50 51 ms most of a 90 ms E2E."""
    ev = Evidence("x", completed=38, **kw)
    ev.ttft = {"mean": 51.5, "p50": 51.1, "p95": 53.0, "p99": 56.0}
    ev.tpot, ev.e2e = {"p50": 3.0, "p95": 3.5}, {"mean": 83.0, "p50": 82.0, "p99": 90.0}
    ev.input_tokens, ev.output_tokens = {"p50": 50.0, "p99": 50.0}, {"p50": 12.0, "p99": 12.0}
    return ev


def test_a_healthy_ttft_is_not_prefill_bound() -> None:
    assert "prefill_heavy" not in keys(short_answers())
    ev = short_answers(slo={"ttft_ms": {"p95": 40.0}})  # a target it misses
    f = finding(ev, "prefill_heavy")
    assert f.trigger.startswith("TTFT P95 53 ms over the P95 target of 40 ms (the run's SLO)")
    assert "queueing unknown" in f.trigger  # not 0%: nothing measured it
    # 50-token prompts are one step of any budget: a bigger one shortens nothing
    assert all("batched" not in a.knob for a in f.actions), moves(f)


def test_a_healthy_tpot_is_not_decode_bound() -> None:
    ev = decode_bound("vllm", {"max_num_seqs": 8})
    ev.tpot = {"p50": 10.0, "p95": 12.0}
    assert "decode_heavy" not in keys(ev)


def test_slo_targets_come_from_the_run() -> None:
    from servetune.slo import parse_slo

    res = simulate(EngineConfig(max_num_seqs=16), {**QUEUE, "count": 64})
    res.slo = parse_slo({"ttft_ms": {"p95": 800}, "tpot_ms": {"p95": 40}})
    assert from_result(res).slo == {"ttft_ms": {"p95": 800.0}, "tpot_ms": {"p95": 40.0}}


# 10 ----------------------------------------------------------------------------------


def test_idle_samples_clocked_down_are_not_a_downclock() -> None:
    """NVML reads 210 MHz on an idle GPU (its P-state) before and after the run."""
    idle = {"gpu_util": 0.0, "gpu_sm_clock_mhz": 210.0, "gpu_sm_clock_max_mhz": 1980.0}
    busy = {"gpu_util": 0.95, "gpu_sm_clock_mhz": 1950.0, "gpu_sm_clock_max_mhz": 1980.0}
    tel = TelemetrySeries(t_ns=[0, 1, 2, 3], values=[idle, busy, busy, idle])
    res = RunResult(id="r", created_utc="2026-01-01T00:00:00+00:00", telemetry=tel)
    assert "gpu_downclocked" not in keys(from_result(res))
    slow = {**busy, "gpu_sm_clock_mhz": 1100.0}
    res.telemetry = TelemetrySeries(t_ns=[0, 1, 2, 3], values=[idle, busy, slow, idle])
    f = finding(from_result(res), "gpu_downclocked")
    assert "1100 of 1980 MHz" in f.trigger


# 11 ----------------------------------------------------------------------------------


def test_an_unmeasured_kv_usage_is_not_zero() -> None:
    ev = Evidence("x", engine="sglang", preemptions=12.0)
    f = finding(ev, "kv_pressure")
    assert "KV usage not measured" in f.trigger and "0%" not in f.trigger
    fp8 = next(a for a in f.actions if a.knob == "kv_cache_dtype")
    assert fp8.predicted is None


# 14 ----------------------------------------------------------------------------------


def _one_line(code: int, err: str, needle: str) -> None:
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_stored_config_value_no_engine_takes_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    res = simulate(EngineConfig(max_num_seqs=8), {**QUEUE, "count": 20})
    data = res.model_dump(mode="json")
    data["target"]["config"] = {"max_num_seqs": "lots"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "diagnose", str(path))
    _one_line(code, err, "target.config.max_num_seqs: ")
    assert "'lots'" in err


def test_a_stored_nan_is_refused_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json` printed `"p50": NaN`: not JSON."""
    res = simulate(EngineConfig(max_num_seqs=8), {**QUEUE, "count": 20})
    data = res.model_dump(mode="json")
    data["metrics"]["ttft_ms"]["p50"] = float("nan")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))  # Python writes NaN, as the damaged file had it
    code, _, err = run_cli(capsys, "diagnose", str(path), "--json")
    _one_line(code, err, "metrics.ttft_ms.p50: nan in ")


def test_a_valid_stored_config_keeps_its_values() -> None:
    res = simulate(EngineConfig(max_num_seqs=8), {**QUEUE, "count": 20})
    res.target.config = {"max_num_seqs": "8", "from_a_newer_servetune": 1}
    ev = from_result(res)
    assert ev.config == {"max_num_seqs": 8, "from_a_newer_servetune": 1}
    assert "\n".join(render(Diagnosis(ev, diagnose(ev))))
