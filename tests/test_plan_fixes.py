"""Twelve planner defects a second bug hunt found, each pinned by the behaviour the fix
gives (every one failed before it): vLLM's per-method GPU rules, YaRN contexts, a custom
model_type on a known architecture, AWQ/GPTQ asked of a 16-bit checkpoint, more experts
picked than exist, SGLang's one pool count, OOM fixes vLLM would refuse, vLLM's block
sizes, replicated MLA/router weights under TP, a quoted tie_word_embeddings, CUDA's
device total, a container's memory limit and MI300X's mesh links."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hf_configs import LLAMA_8B
from servetune.engines.config import EngineConfig
from servetune.engines.rules import VLLM_BLOCK_SIZES, check_batch_limits, check_block_size
from servetune.errors import InputError
from servetune.hardware import local
from servetune.hardware.catalog import get_hardware
from servetune.model.catalog import catalog_entry, get_model
from servetune.model.hf_config import spec_from_hf_dict
from servetune.model.spec import MoESpec
from servetune.plan import roofline
from servetune.plan.memory import replicated_bytes, weights_per_gpu_bytes
from servetune.plan.planner import evaluate, make_plan
from servetune.plan.quant import quantize_choice, weight_format, weights_bytes
from servetune.plan.service import PlanArgs, PlanResult, build_request, run_plan
from servetune.plan.sglang_pool import sglang_pool
from servetune.units import GiB

# Qwen2.5-7B-Instruct with the YaRN block its model card says to add for 128K contexts
QWEN25_YARN = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}


def _plan(**kwargs: Any) -> PlanResult:
    args = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "from_flags": True, **kwargs}
    return run_plan(PlanArgs(**args))


def _refusal(**kwargs: Any) -> InputError:
    with pytest.raises(InputError) as exc:
        _plan(**kwargs)
    return exc.value


def _config_dir(tmp_path: Path, cfg: dict[str, Any], name: str = "model") -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


# 1 ------------------------------------------------------------------ vLLM's method rules


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        # ModelOptFp8Config.get_min_capability() = 89: NVIDIA's FP8 release on an A100
        ({"model": "llama-3.1-8b-fp8", "gpu": "a100-80g-sxm"}, "--gpu", ">= 8.9"),
        # Mxfp4Config.get_min_capability() = 80: GPT-OSS on a T4
        ({"model": "gpt-oss-20b", "gpu": "t4"}, "--gpu", ">= 8.0"),
        # AWQConfig.get_min_capability() = 75: a V100 is 7.0; GPTQ (60) is what it runs
        ({"gpu": "v100-32g", "quant": "awq"}, "--quant", "gptq"),
        # Mxfp4Config.get_supported_act_dtypes() = [bfloat16]
        ({"model": "gpt-oss-20b", "dtype": "float16"}, "--dtype", "bfloat16 only"),
    ],
)
def test_each_method_is_checked_against_the_gpu(kwargs, field, words) -> None:
    err = _refusal(**kwargs)
    assert err.field == field and words in err.one_line()


def test_only_formats_the_gpu_runs_are_suggested() -> None:
    assert quantize_choice(get_hardware("a100-80g-sxm")) == "fp8"  # Marlin W8A16
    assert quantize_choice(get_hardware("h100-sxm")) == "fp8"
    assert quantize_choice(get_hardware("t4")) == "awq"
    assert quantize_choice(get_hardware("v100-32g")) == "gptq"
    err = _refusal(model="llama-3.1-8b-fp8", gpu="a100-80g-sxm")
    assert "16-bit release with --quant fp8" in err.one_line()
    assert "fp8" not in _refusal(gpu="v100-32g", quant="fp8").fix


# 2 ------------------------------------------------------------------ rope_scaling


def test_a_yarn_config_allows_the_context_vllm_derives(tmp_path) -> None:
    spec = spec_from_hf_dict(QWEN25_YARN, "qwen25-yarn")
    assert spec.context_limit == 32768 * 4  # original_max_position_embeddings x factor
    model = _config_dir(tmp_path, QWEN25_YARN)
    ev = _plan(model=model, max_model_len=131072, scenario="none").plan.evaluation
    assert ev.max_model_len == 131072 and ev.fits
    with pytest.raises(InputError, match="131072"):
        _plan(model=model, max_model_len=131073, scenario="none")
    # no --max-model-len: vLLM's default is the derived length
    assert _plan(model=model, scenario="none").plan.evaluation.max_model_len == 131072


@pytest.mark.parametrize(
    ("rope", "model_type", "limit"),
    [
        ({"rope_type": "linear", "factor": 2.0}, "llama", 2 * 131072),
        ({"rope_type": "dynamic", "factor": 2.0}, "llama", 2 * 131072),
        (
            {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
            "llama",
            131072,
        ),  # Llama 3.1: already scaled
        ({"rope_type": "longrope", "factor": 4.0}, "llama", 131072),
        ({"rope_type": "default"}, "llama", 131072),  # defines no factor
    ],
)
def test_rope_types_scale_as_vllm_does(rope, model_type, limit) -> None:
    spec = spec_from_hf_dict({**LLAMA_8B, "model_type": model_type, "rope_scaling": rope}, "m")
    assert spec.context_limit == limit


def test_gemma3_is_exempt_from_rope_scaling() -> None:
    """Gemma 3's 131,072 is already scaled (vLLM: "gemma3" not in model_type)."""
    cfg = catalog_entry("gemma-3-27b")  # Gemma 3 27B: linear x 8 on its global layers
    cfg["text_config"]["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    spec = spec_from_hf_dict(cfg, "gemma-3-27b")
    assert spec.context_limit == spec.max_position_embeddings == 131072


# 3 ------------------------------------------------------------------ model_type fallback


def test_a_custom_model_type_on_a_known_architecture_is_read_as_it() -> None:
    kimi = {
        **json.loads(json.dumps(_deepseek_like())),
        "model_type": "kimi_k2",
        "architectures": ["DeepseekV3ForCausalLM"],
    }
    spec = spec_from_hf_dict(kimi, "kimi-k2")
    assert spec.architecture == "DeepseekV3ForCausalLM" and spec.mla is not None
    assert spec.moe is not None and spec.moe.num_experts == 384
    with pytest.raises(InputError, match="unsupported architecture"):
        spec_from_hf_dict({**kimi, "architectures": ["KimiForCausalLM"]}, "kimi-k2")


def _deepseek_like() -> dict[str, Any]:
    return {
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_hidden_layers": 61,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "vocab_size": 163840,
        "max_position_embeddings": 131072,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 1,
        "torch_dtype": "bfloat16",
    }


# 4 ------------------------------------------------------------------ AWQ/GPTQ on 16 bits


@pytest.mark.parametrize("quant", ["awq", "gptq"])
def test_awq_or_gptq_of_a_16_bit_checkpoint_gives_no_command(quant: str) -> None:
    result = _plan(gpu="a100-80g-sxm", quant=quant)
    assert result.plan.evaluation.fits
    assert result.launch == {}
    assert "pre-quantized" in result.launch_withheld and "--quant fp8" in result.launch_withheld
    assert _plan(gpu="a100-80g-sxm", quant="fp8").launch  # vLLM quantizes to fp8 at load


def test_the_quantize_fix_on_an_a100_is_fp8() -> None:
    req, _ = build_request(PlanArgs(model="llama-3.1-70b", gpu="a100-80g-sxm", from_flags=True))
    changes = [f.change for f in make_plan(req).fixes]
    assert {"quantization": "fp8"} in changes and {"quantization": "awq"} not in changes


# 5 ------------------------------------------------------------------ k > E


def test_more_experts_picked_than_exist_is_one_line() -> None:
    cfg = {
        **LLAMA_8B,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": 2,
        "num_experts_per_tok": 8,
    }
    with pytest.raises(InputError) as exc:
        spec_from_hf_dict(cfg, "m", source="config.json")
    assert exc.value.field == "config.json: num_experts_per_tok"
    assert "num_local_experts 2" in exc.value.problem
    with pytest.raises(ValidationError, match="experts_per_token"):
        MoESpec(num_experts=2, experts_per_token=8, expert_intermediate_size=10)


# 6 ------------------------------------------------------------------ SGLang's pool


def test_sglang_capacity_and_running_requests_come_from_one_pool() -> None:
    req, _ = build_request(
        PlanArgs(model="gemma-3-27b", gpu="h100-sxm", engine="sglang", from_flags=True)
    )
    ev = make_plan(req).evaluation
    b = ev.budget
    sg = sglang_pool(
        req.hardware,
        ev.config,
        b.weights_bytes,
        b.kv_bytes_per_token,
        ev.max_model_len,
        b.overhead_bytes,
        req.given_knobs,
    )
    assert ev.kv_capacity_tokens == sg.pool_tokens == b.kv_pool_tokens
    assert b.max_num_seqs == sg.max_running_requests
    # --max-total-tokens caps the pool SGLang profiled, and the plan's capacity with it
    capped = EngineConfig(engine="sglang", kv_cache_tokens=10_000)
    assert evaluate(req.model, req.hardware, capped).kv_capacity_tokens == 10_000


# 7 ------------------------------------------------------------------ OOM fixes vLLM refuses


def test_no_fix_lowers_batched_tokens_below_max_num_seqs() -> None:
    req, _ = build_request(
        PlanArgs(
            model="llama-3.1-70b",
            gpu="h100-sxm",
            max_num_seqs=512,
            max_num_batched_tokens=768,
            from_flags=True,
        )
    )
    plan = make_plan(req)
    assert not plan.evaluation.fits
    for fix in plan.fixes:
        cfg = plan.evaluation.config.with_(**fix.change)
        seqs = cfg.max_num_seqs or 512
        check_batch_limits(cfg, seqs, cfg.max_num_batched_tokens or 768)
    # halved 768 would be 384 < 512: the fix lowers it to max_num_seqs instead
    lowered = [f.change for f in plan.fixes if "max_num_batched_tokens" in f.change]
    assert lowered == [{"max_num_batched_tokens": 512}]


# 8 ------------------------------------------------------------------ vLLM's block sizes


@pytest.mark.parametrize(
    ("size", "device", "ok"),
    [
        (48, "gpu", False),  # a multiple of 16, but no BlockSize value
        (512, "gpu", False),
        (8, "gpu", False),  # a BlockSize value FlashAttention does not run (MultipleOf(16))
        (256, "gpu", True),
        (16, "gpu", True),
        (96, "cpu", False),  # a multiple of 32, no BlockSize value
        (64, "cpu", True),
        (16, "cpu", True),  # EngineConfig's default: vLLM CPU's own
    ],
)
def test_block_size_is_one_of_vllms(size: int, device: str, ok: bool) -> None:
    cfg = EngineConfig(block_size=size)
    if ok:
        check_block_size(cfg, device)
        return
    with pytest.raises(InputError) as exc:
        check_block_size(cfg, device)
    assert exc.value.field == "block_size" and "use one of" in exc.value.fix
    assert set(map(int, exc.value.fix.removeprefix("use one of ").split(", "))) <= set(
        VLLM_BLOCK_SIZES
    )


# 9 ------------------------------------------------------------------ replicated weights


def test_mla_down_projections_and_routers_stay_whole_per_rank() -> None:
    m = get_model("deepseek-v3")
    fmt = weight_format("auto", None, m)
    block_fp8 = (8 + 32 / 128**2) / 8
    mla = 61 * 7168 * (1536 + 512 + 64) * block_fp8  # q_a_proj, kv_a_proj_with_mqa
    router = 58 * 7168 * 256 * 2  # 58 MoE layers' gates, bf16
    assert replicated_bytes(m, fmt) == pytest.approx(mla + router)
    per_gpu = weights_per_gpu_bytes(m, fmt, 8, 1)
    assert per_gpu == pytest.approx(weights_bytes(m, fmt) / 8 + (mla + router) * 7 / 8)
    assert per_gpu - weights_bytes(m, fmt) / 8 > 0.9 * GiB  # the repro's 0.93 GiB
    dense = get_model("llama-3.1-70b")  # nothing replicated: an even split, as before
    fmt = weight_format("auto", None, dense)
    assert weights_per_gpu_bytes(dense, fmt, 4, 1) == pytest.approx(weights_bytes(dense, fmt) / 4)


# 10 ----------------------------------------------------------------- tie_word_embeddings


@pytest.mark.parametrize("value", ["false", "true", 0, 1])
def test_tie_word_embeddings_must_be_a_json_bool(value) -> None:
    with pytest.raises(InputError) as exc:
        spec_from_hf_dict({**LLAMA_8B, "tie_word_embeddings": value}, "m", source="c.json")
    assert exc.value.field == "c.json: tie_word_embeddings"
    untied = spec_from_hf_dict({**LLAMA_8B, "tie_word_embeddings": False}, "m")
    assert untied.params_lm_head > 0


# 12 ----------------------------------------------------------------- cgroups, MI300X links


def test_a_cgroup_v2_limit_caps_host_memory(tmp_path, monkeypatch) -> None:
    root = tmp_path / "cg"
    (root / "app" / "job").mkdir(parents=True)
    (root / "memory.max").write_text("max\n")
    (root / "app" / "memory.max").write_text(str(4 * 2**30))
    (root / "app" / "job" / "memory.max").write_text(str(6 * 2**30))  # the parent binds
    own = tmp_path / "self_cgroup"
    own.write_text("0::/app/job\n")
    assert local.cgroup_memory_limit_bytes(root, own) == 4 * 2**30
    monkeypatch.setattr(local, "cgroup_memory_limit_bytes", lambda: 2 * 2**30)
    assert local.cpu_facts()["memory_gib"] == pytest.approx(2.0)


def test_a_cgroup_v1_limit_and_no_limit(tmp_path) -> None:
    root = tmp_path / "cg"
    (root / "memory" / "docker").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    own = tmp_path / "self_cgroup"
    own.write_text("4:memory:/docker\n0::/\n")
    assert local.cgroup_memory_limit_bytes(root, own) is None  # v1's "unlimited"
    (root / "memory" / "docker" / "memory.limit_in_bytes").write_text(str(3 * 2**30))
    assert local.cgroup_memory_limit_bytes(root, own) == 3 * 2**30


def test_mi300x_all_reduces_over_the_links_a_tp_group_reaches() -> None:
    hw = get_hardware("mi300x")
    assert [hw.allreduce_gbs(tp) for tp in (2, 4, 8)] == [64, 192, 448]
    size = 4096 * 2  # one token of a 4096-wide activation, bf16
    latency = roofline.ALLREDUCE_LATENCY_S["infinity-fabric"]
    at_tp2 = roofline.allreduce_s(hw, 2, 1, 4096)
    assert at_tp2 == pytest.approx(2 * (1 / 2) * size / 64e9 + latency)
    assert get_hardware("h100-sxm").allreduce_gbs(2) == 450  # NVSwitch: every TP alike


def test_tune_refuses_requests_past_the_derived_context_not_max_position_embeddings() -> None:
    """A model whose rope scaling sets the longest context vLLM accepts (its derived
    max_model_len) is judged on that, not on max_position_embeddings, when the space sets
    no max_model_len."""
    from servetune.cli.tune_cmd import check_servable
    from servetune.errors import InputError
    from servetune.model import get_model
    from servetune.tune.space import parse_space
    from servetune.workload.spec import parse_workload

    base = get_model("llama-3.1-8b")
    wl = parse_workload({"count": 4, "input_tokens": {"dist": "fixed", "value": 6000},
                         "output_tokens": {"dist": "fixed", "value": 100},
                         "arrival": {"kind": "closed", "concurrency": 2}})  # fmt: skip
    space = parse_space({"engine": "vllm", "knobs": {"max_num_seqs": [8, 16]}})
    shorter = base.model_copy(
        update={"max_position_embeddings": 8192, "derived_max_model_len": 4096}
    )
    with pytest.raises(InputError, match="exceeds max_model_len 4,096"):
        check_servable(wl, space, shorter)
    longer = base.model_copy(
        update={"max_position_embeddings": 4096, "derived_max_model_len": 16384}
    )
    check_servable(wl, space, longer)  # 6,100 tokens fit the derived 16,384


def test_simulate_refuses_the_activation_dtype_vllm_refuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """gpt-oss ships MXFP4 weights, whose kernels run bfloat16 activations only: vLLM
    refuses --dtype float16 at start-up, so the simulator does not simulate it; `plan`
    and `simulate` say it alike, each naming its own flag."""
    from cli_run import run_cli

    code, out, err = run_cli(capsys, "simulate", "--model", "gpt-oss-20b", "--gpu", "h100-sxm",
                             "--set", "dtype=float16")  # fmt: skip
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith("error: --set dtype: mxfp4 runs its activations in bfloat16 only")
    assert "use --set dtype=bfloat16" in err
    code, _, err = run_cli(capsys, "plan", "--model", "gpt-oss-20b", "--gpu", "h100-sxm",
                           "--dtype", "float16")  # fmt: skip
    assert code == 2 and err.startswith("error: --dtype: mxfp4") and "use --dtype bfloat16" in err
    # the bfloat16-below-8.0 check names the fix in the same terms
    code, _, err = run_cli(capsys, "simulate", "--model", "llama-3.1-8b", "--gpu", "t4",
                           "--set", "dtype=bfloat16")  # fmt: skip
    assert code == 2 and err.startswith("error: --set dtype: bfloat16 needs")
    assert err.rstrip().endswith("(use --set dtype=float16)"), err


def test_no_fix_is_offered_that_the_planned_engine_has_no_flag_for() -> None:
    """llama.cpp has no FP8 weights, no FP8 KV cache type, no TP and no utilization
    fraction: none is offered (each was, priced as if it ran); vLLM keeps them."""
    llama, _ = build_request(
        PlanArgs(model="llama-3.2-1b", gpu="h100-sxm", engine="llamacpp", from_flags=True)
    )
    knobs = {k for f in make_plan(llama).fixes for k in f.change}
    assert knobs and not knobs & {
        "quantization", "kv_cache_dtype", "tensor_parallel_size", "gpu_memory_utilization"
    }  # fmt: skip
    vllm, _ = build_request(PlanArgs(model="llama-3.2-1b", gpu="h100-sxm", from_flags=True))
    knobs = {k for f in make_plan(vllm).fixes for k in f.change}
    assert {"quantization", "kv_cache_dtype", "tensor_parallel_size"} <= knobs


def test_the_recommendation_says_which_engine_the_plan_is_sized_for() -> None:
    """`--engine llamacpp` on a GPU: the recommendation (vLLM) no longer reads as the plan's
    engine, and the plan says it used vLLM's memory model."""
    asked = run_plan(PlanArgs(model="llama-3.2-1b", gpu="h100-sxm", engine="llamacpp"))
    assert asked.engine == "vllm"
    assert "sized for --engine llamacpp with vLLM's memory model" in asked.engine_reason
    same = run_plan(PlanArgs(model="llama-3.2-1b", gpu="h100-sxm"))
    assert "sized for" not in same.engine_reason


def test_a_broken_headroom_is_fixed_at_the_verdicts_utilization() -> None:
    """0.99 on an A10 leaves less than the CUDA context: the verdict says "at most 0.97",
    and the fix offers 0.97 (it offered 0.94, 0.05 below the fraction in force)."""
    req, _ = build_request(
        PlanArgs(model="llama-3.2-3b", gpu="a10", gpu_memory_utilization=0.99, from_flags=True)
    )
    plan = make_plan(req)
    assert plan.evaluation.breaking_term == "gpu_memory_utilization"
    assert "at most 0.97" in plan.evaluation.verdict
    assert plan.fixes[0].change == {"gpu_memory_utilization": 0.97}


def test_the_llamacpp_line_names_the_gguf_nearest_the_planned_weights() -> None:
    """An FP8 checkpoint (DeepSeek-V3, 8 x H200) had been named a BF16 GGUF, twice the
    weights the plan sized: Q8_0 now, and a note says the pool is FP8's."""
    res = run_plan(PlanArgs(model="deepseek-v3", gpu="h200", gpus=8))
    line = res.launch["llamacpp"]
    assert "DeepSeek-V3-Q8_0.gguf" in line.argv and not any("BF16" in a for a in line.argv)
    assert any(n.startswith("weights: llama.cpp loads GGUF, Q8_0") for n in line.notes)
    plain = run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm")).launch["llamacpp"]
    assert any(a.endswith("-BF16.gguf") for a in plain.argv)
    assert not any(n.startswith("weights:") for n in plain.notes)


def test_the_layout_given_is_a_row_of_the_parallelism_table() -> None:
    """--tp 1 --pp 2 on 2 GPUs: PP rows were built on the largest TP only, so the plan's
    own layout was in no row."""
    req, _ = build_request(
        PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", gpus=2, tp=1, pp=2, from_flags=True)
    )
    rows = {(o.tp, o.pp): o for o in make_plan(req).parallelism}
    assert (1, 2) in rows and rows[(1, 2)].dp == 1 and rows[(1, 2)].fits
    assert {(1, 1), (2, 1)} <= set(rows)
