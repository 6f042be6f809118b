"""Natively quantized checkpoints are planned in their own format (MXFP4, block-wise FP8);
a user's --quant naming their own method keeps it, another is refused as vLLM refuses it,
--quant stands in for a method servetune cannot size, and scenarios that imply a format
apply it."""

from __future__ import annotations

import pytest

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.catalog import get_hardware
from servetune.model.catalog import catalog_entry, get_model
from servetune.model.hf_config import spec_from_hf_dict
from servetune.model.spec import QuantScheme
from servetune.plan.memory import memory_budget
from servetune.plan.planner import PlanRequest, make_plan
from servetune.plan.quant import WEIGHT_FORMATS, scheme_bits, weight_format, weights_bytes
from servetune.plan.service import PlanArgs, plan_to_json, run_plan
from servetune.units import GiB


def test_scheme_bits_are_values_plus_shared_scales() -> None:
    mxfp4 = QuantScheme(classes=("experts",), bits=4, kind="float", group_size=32, scale_bits=8)
    assert scheme_bits(mxfp4) == 4.25  # OCP MX: e2m1 x 32 + one e8m0 scale
    fp8 = QuantScheme(classes=("mlp",), bits=8, kind="float", block=(128, 128), scale_bits=32)
    assert scheme_bits(fp8) == 8 + 32 / (128 * 128)
    awq = QuantScheme(classes=("mlp",), bits=4, kind="int", group_size=128, zero_bits=4)
    assert scheme_bits(awq) == WEIGHT_FORMATS["awq"].body_bits == 4 + 20 / 128
    nvfp4 = QuantScheme(classes=("mlp",), bits=4, kind="float", group_size=16, scale_bits=8)
    assert scheme_bits(nvfp4) == 4.5
    per_row = QuantScheme(classes=("mlp",), bits=8, kind="float")
    assert scheme_bits(per_row) == 8


def test_gpt_oss_120b_mxfp4_weights_from_shapes() -> None:
    """Experts (36 layers x 128 x 3 x 2880^2) at 4.25 bits, everything else in bf16: the
    OpenAI model card's 60.8 GiB checkpoint, not the 217.6 GiB of a bf16 plan."""
    m = get_model("gpt-oss-120b")
    experts = 36 * 128 * 3 * 2880 * 2880
    by_hand = experts * 4.25 / 8 + (m.params_total - experts) * 2
    fmt = weight_format("auto", None, m)
    assert fmt.name == "mxfp4"
    assert weights_bytes(m, fmt) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand / GiB == pytest.approx(60.8, abs=0.05)
    assert weights_bytes(get_model("gpt-oss-20b"), fmt) / GiB == pytest.approx(12.8, abs=0.05)


def test_gpt_oss_120b_fits_one_h100() -> None:
    req = PlanRequest(model=get_model("gpt-oss-120b"), hardware=get_hardware("h100-sxm"))
    ev = make_plan(req).evaluation
    b = ev.budget
    assert ev.fits and ev.config.tensor_parallel_size == 1
    assert (b.weight_format, b.weight_format_source) == ("mxfp4", "checkpoint")
    pool = 0.9 * 79.65 * GiB - b.weights_bytes - b.activation_bytes - b.overhead_bytes
    assert b.kv_pool_bytes == pytest.approx(pool) and pool > 8 * GiB


def test_deepseek_v3_fp8_fits_8_h200_with_the_pool_it_leaves() -> None:
    """Every block matrix in e4m3 with one fp32 scale per 128x128 tile; embedding, LM head,
    routers and norms in bf16. 8-way TP: 79.3 GiB of weights per GPU, not 156 GiB: 1/8 of
    the model, plus the 7/8 of MLA's down-projections (fp8) and the routers (bf16) that
    every rank holds whole (vLLM's ReplicatedLinear)."""
    m = get_model("deepseek-v3")
    c = m.params_classes
    fp8 = c.attention + c.mlp + c.experts + c.shared_experts
    block_fp8 = (8 + 32 / 128**2) / 8
    total = fp8 * block_fp8 + (m.params_total - fp8) * 2
    # q_a_proj 7168 -> 1536, kv_a_proj_with_mqa 7168 -> 512 + 64, 61 layers; 58 MoE routers
    replicated = 61 * 7168 * (1536 + 512 + 64) * block_fp8 + 58 * 7168 * 256 * 2
    per_gpu = total / 8 + replicated * 7 / 8
    plan = run_plan(PlanArgs(model="deepseek-v3", gpu="h200", gpus=8)).plan  # chat scenario
    ev = plan.evaluation
    b = ev.budget
    assert ev.fits and ev.config.tensor_parallel_size == 8
    assert b.weights_total_bytes == pytest.approx(total, rel=1e-12)
    assert b.weights_bytes == pytest.approx(per_gpu) and 79.2 < b.weights_bytes / GiB < 79.4
    pool = 0.9 * 140.4 * GiB - per_gpu - b.activation_bytes - b.overhead_bytes
    assert b.kv_pool_bytes == pytest.approx(pool)
    per_token = 61 * (512 + 64) * 2  # MLA latent + rope key, bf16, not split by TP
    assert ev.kv_capacity_tokens == int(pool // (16 * per_token)) * 16
    # 45.32 GiB per GPU (vLLM's sizing: the CUDA context sits in the headroom)
    assert ev.kv_capacity_tokens == 692_512
    # Already quantized: the OOM list does not offer to quantize again.
    assert not [f for f in plan.fixes if f.action.startswith("quantize")]


def test_quant_overrides_the_checkpoint_format() -> None:
    m = get_model("deepseek-v3")
    awq = weight_format("auto", "awq", m)
    assert awq.name == "awq"
    assert weights_bytes(m, awq) < weights_bytes(m, weight_format("auto", None, m))


def test_mxfp4_on_a_moe_model_quantizes_its_experts_only() -> None:
    m = get_model("qwen3-30b-a3b")
    fmt = weight_format("auto", "mxfp4", m)
    c = m.params_classes
    assert weights_bytes(m, fmt) == pytest.approx(
        c.experts * 4.25 / 8 + (m.params_total - c.experts) * 2
    )
    with pytest.raises(InputError, match="mxfp4 quantizes experts only"):
        weight_format("auto", "mxfp4", get_model("llama-3.1-8b"))


def test_unknown_checkpoint_method_asks_for_quant() -> None:
    cfg = {k: v for k, v in catalog_entry("llama-3.1-8b").items() if not k.startswith("_")}
    m = spec_from_hf_dict({**cfg, "quantization_config": {"quant_method": "hqq"}}, "x")
    with pytest.raises(InputError) as info:
        weight_format("auto", None, m)
    assert info.value.field == "x: quantization_config.quant_method"
    assert "--quant" in str(info.value)
    assert weight_format("auto", "fp8", m).name == "fp8"  # --quant still plans it


def test_plan_refuses_another_method_on_a_quantized_checkpoint_as_vllm_does() -> None:
    """vLLM refuses --quantization awq on Qwen3-32B-FP8 at start-up; plan says so in one
    line naming --quant, and keeps the checkpoint's block-scaled FP8 under --quant fp8."""
    with pytest.raises(InputError) as info:
        run_plan(PlanArgs(model="qwen3-32b-fp8", gpu="h100-sxm", quant="awq"))
    assert info.value.field == "--quant" and "ships fp8" in str(info.value)
    own = run_plan(PlanArgs(model="qwen3-32b-fp8", gpu="h100-sxm", quant="fp8"))
    shipped = run_plan(PlanArgs(model="qwen3-32b-fp8", gpu="h100-sxm"))
    assert own.plan.evaluation.budget == shipped.plan.evaluation.budget
    base = run_plan(PlanArgs(model="qwen3-32b", gpu="h100-sxm", quant="awq"))
    assert base.plan.evaluation.budget.weight_format == "awq"


def test_cpu_edge_scenario_applies_gguf_q4_k_m() -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="cpu-host", scenario="cpu-edge"))
    b = result.plan.evaluation.budget
    assert b.weight_format == "q4_k_m" and result.weight_format_origin == "scenario cpu-edge"
    m = get_model("llama-3.1-8b")
    assert b.weights_total_bytes == weights_bytes(m, WEIGHT_FORMATS["q4_k_m"])
    assert "Q4_K_M.gguf" in result.launch["llamacpp"].argv[2]
    own = run_plan(
        PlanArgs(model="llama-3.1-8b", gpu="cpu-host", scenario="cpu-edge", quant="q8_0")
    )
    assert own.plan.evaluation.budget.weight_format == "q8_0"
    assert own.weight_format_origin == "--quant"


def test_plan_output_says_which_format_and_where_from() -> None:
    data = plan_to_json(run_plan(PlanArgs(model="gpt-oss-120b", gpu="h100-sxm")))
    assert data["weight_format"] == "mxfp4"
    assert data["weight_format_source"] == "checkpoint quantization_config"
    assert "MXFP4" in data["weight_format_note"]
    assert data["fits"] is True
    plain = plan_to_json(run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm")))
    assert (plain["weight_format"], plain["weight_format_source"]) == ("bf16", "--dtype")


def test_a_modelopt_fp8_checkpoint_gets_the_fp8_kv_pool_vllm_gives_it() -> None:
    """nvidia/*-FP8 checkpoints declare kv_cache_quant_algo FP8, and vLLM's
    --kv-cache-dtype auto follows it (vllm#29980): the same H100 pool holds twice the tokens
    of a 16-bit one. An explicit dtype wins; engines that do not read it keep 16 bits."""
    cfg = {k: v for k, v in catalog_entry("llama-3.1-8b").items() if not k.startswith("_")}
    quant = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    m = spec_from_hf_dict({**cfg, "quantization_config": quant}, "nvidia-fp8")
    h100 = get_hardware("h100-sxm")

    def pool(**knobs: object) -> tuple[int, float]:
        b = memory_budget(m, h100, EngineConfig(**knobs), 8192)
        return b.kv_dtype_bytes, b.kv_pool_bytes / b.kv_bytes_per_token

    auto_bytes, auto_tokens = pool()
    assert auto_bytes == 1
    assert weight_format("auto", None, m).name == "modelopt"  # FP8 weights, per tensor
    bf16_bytes, bf16_tokens = pool(kv_cache_dtype="bf16")
    assert bf16_bytes == 2 and auto_tokens == pytest.approx(2 * bf16_tokens, rel=1e-9)
    assert pool(engine="sglang")[0] == 2
    # a 16-bit checkpoint under --quantization fp8 keeps vLLM's 16-bit pool
    plain = get_model("llama-3.1-8b")
    assert memory_budget(plain, h100, EngineConfig(quantization="fp8"), 8192).kv_dtype_bytes == 2
    assert pool(quantization="fp8")[0] == 1  # the checkpoint's declaration still holds
