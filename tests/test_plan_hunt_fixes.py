"""Defects a bug hunt found in `plan`, each pinned by the behaviour the fix gives: pipeline
stages, MoE bytes read, automatic PP, vLLM's headroom, an explicit KV pool, sliding-window
bounds, SGLang's given knobs, bf16 and KV dtypes the engine refuses, the PP activation
peak, absurd sizes, and fixes that only lower."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests.cli_run import run_cli

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.catalog import get_hardware
from servetune.model.catalog import get_model
from servetune.plan import kv as kvmath
from servetune.plan import roofline
from servetune.plan.memory import memory_budget
from servetune.plan.quant import checkpoint_format
from servetune.plan.service import PlanArgs, PlanResult, parse_overheads, plan_to_json, run_plan
from servetune.plan.sglang_pool import default_fraction, memory_tier
from servetune.units import GiB, MiB

H100 = get_hardware("h100-sxm")


def _plan(**kwargs: object) -> PlanResult:
    """`servetune plan` with these flags (`from_flags`: the values are the user's)."""
    args = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "from_flags": True, **kwargs}
    return run_plan(PlanArgs(**args))


def _refusal(**kwargs: object) -> InputError:
    with pytest.raises(InputError) as exc:
        _plan(**kwargs)
    return exc.value


# ---------------------------------------------------------------- 1. pipeline stages


def test_pipeline_stages_split_compute_and_all_reduces() -> None:
    """A stage runs ceil(layers / pp) layers: its FLOPs and all-reduces are that share,
    and the planner's pp x stage is then the whole model's once, not twice."""
    one = _plan(gpus=2, tp=1, pp=1).plan.bounds
    two = _plan(gpus=2, tp=1, pp=2).plan.bounds
    # compute-bound prefill: pp x (half the body + the LM head) ~ the whole model
    # (+7%: the last stage's LM head counted on each stage), never 2x (31.6 vs 15.8 ms)
    assert one.ttft_lower_bound_ms < two.ttft_lower_bound_ms < 1.1 * one.ttft_lower_bound_ms
    m = get_model("llama-3.1-8b")
    assert roofline.tp_allreduces(m, pp=2) == ((32, 4096, 2),)  # 2 a layer, 16 layers
    assert roofline.comm_s(m, H100, 2, 1, pp=2) == pytest.approx(roofline.comm_s(m, H100, 2, 1) / 2)
    head = m.params_lm_head
    assert roofline.stage_matmul_params(m, 2) == pytest.approx(
        (m.params_matmul_active - head) / 2 + head
    )


# ---------------------------------------------------------------- 2. MoE bytes read


def test_moe_experts_are_read_at_their_own_bytes() -> None:
    """GPT-OSS-120B keeps its experts in MXFP4 (4.25 bpw) and the rest in 16 bits: at batch
    1 a step reads the 16-bit part and 4 of 128 experts' bytes, ~6.24 GB, not 98% of
    the parameters' share of the whole file (0.98 ms)."""
    m = get_model("gpt-oss-120b")
    fmt = checkpoint_format(m)
    res = _plan(model="gpt-oss-120b")
    b = res.plan.evaluation.budget
    experts = m.params_classes.experts * 4.25 / 8
    assert roofline.expert_bytes_per_gpu(m, fmt) == pytest.approx(experts)
    read = b.weights_bytes - experts + experts * 4 / 128
    assert read / 1e9 == pytest.approx(6.24, abs=0.02)  # 4.33 GB + 60.91 GB x 4 / 128
    assert roofline.weight_bytes_read(m, b.weights_bytes, 1, fmt) == pytest.approx(read)
    ctx = res.plan.bounds.decode_context
    kv = kvmath.kv_bytes_for_sequence(m, b.kv_dtype_bytes, ctx)
    expected_ms = (read + kv) / H100.bandwidth_bytes_s * 1e3
    assert res.plan.bounds.tpot_lower_bound_ms == pytest.approx(expected_ms, rel=1e-9)
    assert 1.85 < res.plan.bounds.tpot_lower_bound_ms < 1.95


# ---------------------------------------------------------------- 3. automatic PP


def test_pipeline_is_tried_on_the_largest_tp_that_splits_the_heads(tmp_path: Path) -> None:
    """Qwen2.5-7B's 28 heads / 4 KV heads allow TP 4 at most on an 8-GPU node: on 5 GiB
    cards TP 4 alone does not fit, TP 4 x PP 2 does, and automatic parallelism finds it."""
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        "small8:\n  display_name: Small 5GB\n  vendor: nvidia\n  memory_gib: 5\n"
        "  memory_bandwidth_gbs: 500\n  tflops: {bf16: 100}\n  devices_per_node: 8\n"
        "  interconnect: nvlink\n  interconnect_gbs: 100\n  source: test\n"
    )
    res = _plan(model="qwen2.5-7b", gpu="small8", hardware_file=hw, gpus=16)
    ev = res.plan.evaluation
    assert ev.fits
    assert (ev.config.tensor_parallel_size, ev.config.pipeline_parallel_size) == (4, 2)
    assert ev.config.data_parallel_size == 2
    assert {(o.tp, o.pp) for o in res.plan.parallelism} >= {(4, 1), (4, 2), (4, 4)}


# ---------------------------------------------------------------- 4. vLLM's headroom


def test_a_cuda_context_larger_than_the_headroom_stops_vllm() -> None:
    """vLLM refuses to start when the memory free after the CUDA context is below
    utilization x device: a 30 GiB context leaves 0.95 impossible on 79.6 GiB."""
    res = _plan(overhead=["cuda_context_gib=30"], gpu_memory_utilization=0.95)
    ev = res.plan.evaluation
    assert not ev.fits and ev.breaking_term == "gpu_memory_utilization"
    limit = math.floor((1 - 30 / H100.memory_gib) * 100) / 100
    assert limit == 0.62 and "at most 0.62" in ev.verdict
    first = res.plan.fixes[0]
    assert first.change == {"gpu_memory_utilization": 0.62} and first.fits
    assert _plan(overhead=["cuda_context_gib=30"], gpu_memory_utilization=0.5).plan.evaluation.fits


# ---------------------------------------------------------------- 5. explicit KV pool


def test_an_oversized_explicit_pool_is_lowered_to_what_fits() -> None:
    res = _plan(kv_cache_space=70)
    ev, b = res.plan.evaluation, res.plan.evaluation.budget
    assert ev.breaking_term == "kv_cache_space"
    room = (b.device_bytes - b.weights_bytes - b.activation_bytes - b.overhead_bytes) / GiB
    fits = math.floor(room * 100) / 100
    assert f"overheads {b.overhead_bytes / GiB:.1f} GiB" in ev.verdict  # every term named
    assert f"lower kv_cache_space to at most {fits:.2f} GiB" in ev.verdict
    first = res.plan.fixes[0]
    assert first.change == {"kv_cache_space_gib": fits} and first.fits
    # utilization does not size an explicit pool: no step offers it
    assert not any("gpu_memory_utilization" in f.change for f in res.plan.fixes)


# ---------------------------------------------------------------- 6. sliding windows


def test_sliding_window_bounds_read_and_attend_within_the_window() -> None:
    """Gemma-3-27B: 52 of 62 layers keep 1,024 tokens. The decode bound reads one
    sequence's capped KV (4.7x less at 16,640 tokens than every layer in full), and
    windowed layers attend to at most the window."""
    m = get_model("gemma-3-27b")
    res = _plan(model="gemma-3-27b", scenario="long-context")
    b, bd = res.plan.evaluation.budget, res.plan.bounds
    ctx = bd.decode_context
    kv = kvmath.kv_bytes_for_sequence(m, b.kv_dtype_bytes, ctx)
    assert kvmath.kv_bytes_per_token(m, b.kv_dtype_bytes) * ctx / kv > 4.5
    expected_ms = (b.weights_bytes + kv) / H100.bandwidth_bytes_s * 1e3
    assert bd.tpot_lower_bound_ms == pytest.approx(expected_ms, rel=1e-9)
    w, p = m.sliding_window, bd.prefill_tokens
    assert w is not None and p > w
    full, swa = m.num_layers - m.sliding_window_layers, m.sliding_window_layers
    per_pair = 4 * m.num_attention_heads * m.head_dim
    assert roofline.attention_flops(m, ctx) == per_pair * (full * ctx + swa * w)
    causal = per_pair * (full * p * p / 2 + swa * (w * p - w * w / 2))
    assert roofline.attention_flops(m, p, prefill=True) == pytest.approx(causal)


# ---------------------------------------------------------------- 7. SGLang's given knobs


def test_sglang_takes_an_explicit_0_9_and_ignores_a_scenarios_utilization() -> None:
    pools = [
        _plan(engine="sglang", gpu_memory_utilization=u).plan.evaluation.budget.kv_pool_bytes
        for u in (0.89, 0.9, 0.91)
    ]
    assert pools[0] < pools[1] < pools[2]  # 0.9 is the user's 0.9, not SGLang's default
    given = _plan(engine="sglang", gpu_memory_utilization=0.9)
    argv = given.launch["sglang"].argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.9"
    # scenario batch's 0.95 is vLLM's knob: SGLang keeps its own fraction for the GPU
    batch = _plan(engine="sglang", scenario="batch")
    chunk = batch.plan.evaluation.config.max_num_batched_tokens
    _, graphs = memory_tier(H100.memory_gib, 1)
    own = default_fraction(H100.memory_bytes / MiB, chunk, graphs, 1, 1)
    assert batch.plan.evaluation.budget.memory_fraction == own != 0.95
    assert "--mem-fraction-static" not in batch.launch["sglang"].argv


def test_sglang_takes_an_explicit_block_size_16_as_its_page() -> None:
    res = _plan(engine="sglang", block_size=16)
    assert res.plan.evaluation.block_tokens == 16
    assert res.plan.evaluation.kv_capacity_tokens % 16 == 0
    argv = res.launch["sglang"].argv
    assert argv[argv.index("--page-size") + 1] == "16"
    assert _plan(engine="sglang").plan.evaluation.block_tokens == 1  # SGLang's own page


def test_plan_args_from_an_engine_config_keep_sglangs_defaults() -> None:
    """A caller that fills PlanArgs from a stored EngineConfig (report) passes 0.9 and 16 as
    the canonical defaults: SGLang's own fraction and page still apply there."""
    res = run_plan(
        PlanArgs(
            model="llama-3.1-8b",
            gpu="h100-sxm",
            engine="sglang",
            gpu_memory_utilization=0.9,
            block_size=16,
        )
    )
    assert res.plan.evaluation.block_tokens == 1
    assert res.plan.evaluation.budget.memory_fraction != 0.9
    assert "--mem-fraction-static" not in res.launch["sglang"].argv


# ---------------------------------------------------------------- 8. bf16 below cc 8.0


def test_bfloat16_below_compute_capability_8_is_refused() -> None:
    err = _refusal(gpu="t4", model="llama-3.2-1b", dtype="bfloat16")
    assert err.field == "--dtype" and err.fix == "use --dtype float16"
    assert "7.5" in err.problem
    for dtype in ("float16", "auto"):  # auto: vLLM serves a bf16 checkpoint in fp16 itself
        assert _plan(gpu="t4", model="llama-3.2-1b", dtype=dtype).plan.evaluation.fits


# ---------------------------------------------------------------- 9. KV dtypes per engine


def test_a_kv_dtype_the_engine_cannot_run_is_refused_or_falls_back() -> None:
    err = _refusal(engine="sglang", kv_dtype="int8")
    assert err.field == "--kv-dtype" and "sglang has no flag for int8" in err.problem
    assert err.fix is not None and "fp8" in err.fix
    res = _plan(engine="llamacpp", scenario="long-context")
    assert res.plan.evaluation.budget.kv_dtype_bytes == 2  # llama.cpp has no fp8 KV
    assert res.plan.evaluation.config.kv_cache_dtype == "auto"
    assert "scenario long-context's fp8" in res.kv_dtype_note
    assert plan_to_json(res)["kv_dtype_note"] == res.kv_dtype_note


# ---------------------------------------------------------------- 10. PP activation peak


def test_each_pipeline_stage_holds_the_whole_activation_peak() -> None:
    m = get_model("llama-3.1-8b")
    cfg = EngineConfig(max_num_batched_tokens=8192, max_num_seqs=64)
    one = memory_budget(m, H100, cfg, 8192)
    two = memory_budget(m, H100, cfg.with_(pipeline_parallel_size=2), 8192)
    assert two.activation_bytes == one.activation_bytes  # not halved


# ---------------------------------------------------------------- 11. absurd sizes


def test_absurd_pool_and_overhead_sizes_are_one_line_errors() -> None:
    err = _refusal(kv_cache_space=1e300)
    assert err.field == "--kv-cache-space"
    with pytest.raises(InputError) as exc:  # simulate --set reaches the budget directly
        memory_budget(get_model("llama-3.1-8b"), H100, EngineConfig(kv_cache_space_gib=1e300), 8192)
    assert exc.value.field == "kv_cache_space_gib"
    for raw in ("inf", "nan", "1e300"):
        with pytest.raises(InputError) as exc:
            parse_overheads([f"cuda_graphs_gib={raw}"])
        assert exc.value.field.startswith("--overhead")


# ---------------------------------------------------------------- 12. output


def test_no_lower_step_raises_its_knob() -> None:
    res = _plan(max_model_len=200, max_num_batched_tokens=128, input_len=100, output_len=50)
    changes = {k: v for f in res.plan.fixes for k, v in f.change.items()}
    assert "max_num_batched_tokens" not in changes  # 256 would raise 128
    assert "max_model_len" not in changes  # 256 would raise 200
    sglang = _plan(engine="sglang")  # SGLang's own fraction (~0.83): "lower" goes below it
    util = next(f.change for f in sglang.plan.fixes if "gpu_memory_utilization" in f.change)
    assert util["gpu_memory_utilization"] < sglang.plan.evaluation.budget.memory_fraction


def test_models_label_all_sliding_layers_and_mla_caches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "models", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["mistral-7b-v0.1"]["attention"] == "sliding"
    assert rows["phi-3-mini"]["attention"] == "sliding"
    assert rows["gemma-3-27b"]["attention"] == "sliding+full"
    assert rows["deepseek-v3"]["kv_cache"] == "latent 512 + rope 64"  # not 128 x 192
    assert rows["llama-3.1-8b"]["kv_cache"] == "8 x 128"
