"""The launch commands a plan prints agree with the plan: the KV pool it sized, the model
a server can load."""

from __future__ import annotations

import math

from servetune.plan.service import PlanArgs, run_plan

L4_CHAT = PlanArgs(model="llama-3.1-8b", gpu="l4")  # chat: 8,192 tokens x 64 sequences


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_llamacpp_context_is_the_planned_kv_capacity() -> None:
    result = run_plan(L4_CHAT)
    ev = result.plan.evaluation
    assert ev.fits and ev.kv_capacity_tokens < 64 * 8192  # the L4 holds ~28k tokens
    argv = result.launch["llamacpp"].argv
    assert int(_arg(argv, "-c")) == ev.kv_capacity_tokens  # not 64 x 8,192 = 524,288
    assert _arg(argv, "-np") == "64" and "--kv-unified" in argv


def test_trtllm_fraction_is_the_plans_pool_over_the_memory_left_free() -> None:
    result = run_plan(L4_CHAT)
    b = result.plan.evaluation.budget
    free = b.device_bytes - b.weights_bytes - b.activation_bytes - b.overhead_bytes
    expected = math.floor(b.kv_pool_bytes / free * 1e4) / 1e4
    argv = result.launch["trtllm"].argv
    assert float(_arg(argv, "--kv_cache_free_gpu_memory_fraction")) == expected
    # A 24 GiB card with 15 GiB of weights: ~0.68 of what is free, far from vLLM's 0.9.
    assert 0.6 < expected < 0.7


def test_commands_name_the_hf_repo_not_the_catalog_id() -> None:
    launch = run_plan(L4_CHAT).launch
    repo = "meta-llama/Llama-3.1-8B-Instruct"
    assert _arg(launch["vllm"].argv, "--model") == repo
    assert _arg(launch["sglang"].argv, "--model-path") == repo
    assert _arg(launch["tgi"].argv, "--model-id") == repo
    assert launch["trtllm"].argv[1] == repo
    assert _arg(launch["llamacpp"].argv, "-m") == "Llama-3.1-8B-Instruct-BF16.gguf"


def test_a_checkpoint_format_needs_no_quantization_flag() -> None:
    """vLLM and TensorRT-LLM read the format from config.json; llama.cpp's GGUF of GPT-OSS
    keeps the experts in MXFP4."""
    launch = run_plan(PlanArgs(model="gpt-oss-120b", gpu="h100-sxm")).launch
    assert "--quantization" not in launch["vllm"].argv
    assert _arg(launch["vllm"].argv, "--model") == "openai/gpt-oss-120b"
    assert _arg(launch["llamacpp"].argv, "-m") == "gpt-oss-120b-MXFP4.gguf"
