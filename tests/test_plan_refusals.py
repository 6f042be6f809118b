"""What `plan` refuses, or reports as not fitting, instead of planning something the engine
would not run: requests longer than max_model_len, FP8 below compute capability 8.0, TP
across nodes, weight formats the engine has no flag for, SGLang on a CPU host."""

from __future__ import annotations

import json

import pytest
from tests.cli_run import run_cli

from servetune.cli.engine_cmd import _check_engine_has_flags
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.catalog import get_hardware, hardware_names
from servetune.plan.service import PlanArgs, build_request, plan_to_json, run_plan


def _refusal(**kwargs: object) -> InputError:
    with pytest.raises(InputError) as exc:
        run_plan(PlanArgs(**{"model": "llama-3.1-8b", "gpu": "h100-sxm", **kwargs}))
    return exc.value


# ---------------------------------------------------------------- request length


def test_a_request_longer_than_max_model_len_is_refused_not_clamped() -> None:
    err = _refusal(max_model_len=2048, input_len=4000, output_len=500)
    assert err.field == "--input-len"
    assert "4,500 tokens exceed max_model_len 2,048 (--max-model-len)" in err.problem
    assert "raise --max-model-len to at least 4,500" in (err.fix or "")


@pytest.mark.parametrize("scenario", ["long-context", "rag"])
def test_a_scenario_longer_than_the_models_context_is_refused(scenario: str) -> None:
    # llama-2-7b serves 4,096 tokens: rag's 4,096 + 512 and long-context's 16,384 + 512
    # are each answered HTTP 400 by vLLM
    err = _refusal(model="llama-2-7b", scenario=scenario)
    assert err.field == "--scenario"
    assert "max_model_len 4,096 (llama-2-7b's max_position_embeddings)" in err.problem
    assert "sum to at most 4,096" in (err.fix or "")


def test_a_scenario_max_model_len_names_the_flag_that_raises_it() -> None:
    err = _refusal(input_len=10_000)  # chat's max_model_len is 8,192
    assert err.field == "--input-len" and "(scenario chat)" in err.problem
    assert "raise --max-model-len to at least 10,256" in (err.fix or "")


def test_avg_context_above_max_model_len_is_refused() -> None:
    err = _refusal(avg_context=9000, max_model_len=4096)
    assert err.field == "--avg-context" and "9,000 tokens" in err.problem


def test_requests_that_fit_are_planned_at_their_own_length() -> None:
    result = run_plan(
        PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=4500, input_len=4000)
    )
    assert result.plan.bounds.prefill_tokens == 4000


def test_the_default_request_fits_a_short_max_model_len() -> None:
    # no scenario, no --input-len: servetune's own 1,024 + 256 request is shortened to fit
    args = PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", scenario=None, max_model_len=512)
    req, _ = build_request(args)
    assert (req.input_tokens, req.output_tokens) == (410, 102)
    assert run_plan(args).plan.bounds.prefill_tokens == 410


def test_no_fix_lowers_max_model_len_below_the_requests() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-70b", gpu="h100-sxm", quant="fp8", input_len=6000))
    assert not result.plan.evaluation.fits
    for fix in result.plan.fixes:
        assert fix.change.get("max_model_len", 10**9) >= 6256


def test_sglang_refuses_requests_longer_than_its_kv_pool() -> None:
    # SGLang starts with a pool smaller than max_model_len, but no longer request runs
    args = PlanArgs(model="llama-3.1-8b", gpu="l4", engine="sglang", max_model_len=65536)
    assert run_plan(args).plan.evaluation.fits
    args.input_len, args.output_len = 60_000, 100
    ev = run_plan(args).plan.evaluation
    assert not ev.fits and "60,100-token request" in ev.verdict


def test_cli_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "plan", "--max-model-len", "2048", "--input-len", "4000", "--json"
    )
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--input-len" in err


# ---------------------------------------------------------------- FP8 and compute capability


def test_every_nvidia_gpu_records_its_compute_capability() -> None:
    for name in hardware_names():
        hw = get_hardware(name)
        assert (hw.compute_capability is not None) == (hw.vendor == "nvidia"), name
    assert get_hardware("v100-32g").compute_capability == 7.0
    assert get_hardware("l40s").compute_capability == 8.9


@pytest.mark.parametrize("gpu", ["v100-32g", "t4"])
def test_fp8_below_compute_capability_8_is_refused(gpu: str) -> None:
    err = _refusal(gpu=gpu, quant="fp8")
    assert err.field == "--quant" and "compute capability >= 8.0" in err.problem


def test_fp8_on_ampere_is_weight_only() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="a100-80g-sxm", quant="fp8"))
    b = result.plan.evaluation.budget
    assert b.weight_format == "fp8" and "weight-only" in b.weight_format_note
    assert "W8A8" not in b.weight_format_note
    assert "--quantization fp8" in result.launch["vllm"].shell()  # vLLM picks Marlin itself


def test_fp8_on_ada_stays_w8a8() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="l40s", quant="fp8"))
    assert "W8A8" in result.plan.evaluation.budget.weight_format_note


# ---------------------------------------------------------------- TP within a node


def test_tp_beyond_one_node_is_refused_with_a_pp_split() -> None:
    err = _refusal(gpu="rtx-4090", gpus=8, tp=8)
    assert err.field == "--tp" and "4 GPUs in one rtx-4090 node" in err.problem
    assert "--tp 4 --pp 2" in (err.fix or "")


def test_a_head_split_error_offers_only_tp_sizes_within_a_node() -> None:
    err = _refusal(tp=3)
    assert err.field == "--tp"
    assert "use one of 1, 2, 4, 8 " in (err.fix or "") and "16" not in (err.fix or "")


# ---------------------------------------------------------------- engine support


def test_int8_is_refused_for_vllm_in_simulates_words() -> None:
    err = _refusal(quant="int8")
    with pytest.raises(InputError) as sim:
        _check_engine_has_flags("vllm", EngineConfig(quantization="int8"), ["quantization"])
    assert err.field == "--quant" and err.problem == sim.value.problem
    assert "vLLM has no 'int8' weight format" in err.problem


def test_int8_is_planned_for_sglang() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", quant="int8", engine="sglang"))
    assert result.plan.evaluation.budget.weight_format == "int8"


def test_gguf_types_stay_plannable_for_vllm() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", quant="q4_k_m"))
    assert result.plan.evaluation.budget.weight_format == "q4_k_m"


def test_sglang_on_a_cpu_host_is_refused() -> None:
    err = _refusal(gpu="cpu-host", engine="sglang")
    assert err.field == "--engine" and "GPU server" in err.problem


# ---------------------------------------------------------------- messages and nulls


def test_a_tiny_kv_pool_is_described_in_kib_not_zero_gib() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", kv_cache_space=0.0001))
    verdict = result.plan.evaluation.verdict
    assert "2.00 MiB" in verdict and "104.86 KiB KV pool" in verdict
    assert "0.00 GiB" not in verdict


def test_a_plan_that_does_not_fit_reports_no_concurrency(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_plan(PlanArgs(model="llama-3.1-70b", gpu="h100-sxm", quant="fp8"))
    data = plan_to_json(result)
    assert data["fits"] is False
    assert data["max_concurrency"] is None and data["max_concurrency_at_max_model_len"] is None
    assert all(o["max_concurrency"] is None for o in data["parallelism"] if not o["fits"])
    code, out, _ = run_cli(capsys, "plan", "--model", "llama-3.1-70b", "--quant", "fp8", "--json")
    assert code == 2 and json.loads(out)["max_concurrency"] is None


def test_the_simulator_refuses_tp_beyond_one_node_as_plan_does() -> None:
    """`simulate --set tensor_parallel_size=16` on an 8-GPU H100 node was simulated with
    NVLink all-reduces across 16 GPUs (TPOT 2.8 ms); plan refused it. One rule for both
    (`plan.planner.check_tp_within_node`), said in the simulator's knobs."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import setup

    model, hw = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    with pytest.raises(InputError) as e:
        setup(model, hw, EngineConfig(tensor_parallel_size=16))
    assert e.value.field == "--set tensor_parallel_size" and "8 GPUs in one" in e.value.problem
    assert "tensor_parallel_size=8 pipeline_parallel_size=2" in (e.value.fix or "")
    assert setup(model, hw, EngineConfig(tensor_parallel_size=8, pipeline_parallel_size=2))


def test_the_simulators_head_split_error_offers_sizes_within_a_node() -> None:
    """`simulate --gpus 3` on an H100 was answered "use one of 1, 2, 4, 8, 16": vLLM's rule
    alone, where 16 is past the 8-GPU node (and refused next). Plan's answer, in one."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import setup

    with pytest.raises(InputError) as e:
        setup(
            get_model("llama-3.1-8b"),
            get_hardware("h100-sxm"),
            EngineConfig(tensor_parallel_size=3),
        )
    assert e.value.field == "tensor_parallel_size"
    assert e.value.fix == "use one of 1, 2, 4, 8 (TP stays within one node)", e.value.fix
