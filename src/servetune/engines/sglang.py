"""SGLang adapter: `python -m sglang.launch_server`.

Flag names checked against SGLang's docs/advanced_features/server_arguments.md
(main branch, SGLang 0.5.x, 2026) and metric names against
python/sglang/srt/metrics/collector.py: --model-path, --context-length, --dtype,
--quantization, --kv-cache-dtype {fp8_e4m3,fp8_e5m2,bf16,...}, --tp-size, --pp-size,
--dp-size, --mem-fraction-static, --max-running-requests, --max-total-tokens,
--chunked-prefill-size (-1 disables chunking), --max-prefill-tokens, --page-size,
--disable-radix-cache, --enable-priority-scheduling, --disable-cuda-graph,
--enable-metrics. Not run on this machine (no GPU): golden tests only.
"""

from __future__ import annotations

from collections.abc import Sequence

from servetune.engines.base import LLAMACPP_ONLY, Device, FlagBuilder, LaunchSpec, PlannedPool
from servetune.engines.config import EngineConfig

name = "sglang"
# The version whose CLI and metrics the tests check against (data/engine_flags/sglang.json).
TARGET_VERSION = "0.5.23"
default_port = 30000
health_path = "/health"
MODULE = "sglang.launch_server"

_KV_DTYPE = {"fp8": "fp8_e4m3", "bf16": "bf16"}
_QUANT = {"fp8": "fp8", "awq": "awq", "gptq": "gptq", "int8": "w8a8_int8"}

METRICS: dict[str, str] = {
    "requests_running": "sglang:num_running_reqs",
    "requests_waiting": "sglang:num_queue_reqs",
    "kv_cache_usage": "sglang:token_usage",
    "kv_cache_capacity_tokens": "sglang:max_total_num_tokens",
    "prefix_cache_hit_rate": "sglang:cache_hit_rate",
    "prefix_cache_hits_total": "sglang:cached_tokens_total",
    "preemptions_total": "sglang:num_retracted_requests_total",
    "prompt_tokens_total": "sglang:prompt_tokens_total",
    "generation_tokens_total": "sglang:generation_tokens_total",
    "requests_finished_total": "sglang:num_requests_total",
}
HISTOGRAMS: dict[str, str] = {
    "ttft_seconds": "sglang:time_to_first_token_seconds",
    "itl_seconds": "sglang:inter_token_latency_seconds",
    "tpot_seconds": "sglang:request_time_per_output_token_seconds",  # per request, as vLLM's
    "queue_time_seconds": "sglang:queue_time_seconds",
    "e2e_seconds": "sglang:e2e_request_latency_seconds",
}

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"error: unrecognized arguments|error: argument |invalid choice", "bad_flag"),
    (r"out of memory|Not enough memory|Cannot allocate memory", "oom"),
    (r"Address already in use|address already in use", "port_in_use"),
]


def build(
    cfg: EngineConfig,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    device: Device = "gpu",
    prefix: Sequence[str] | None = None,
    pool: PlannedPool | None = None,
) -> LaunchSpec:
    """EngineConfig -> SGLang server command (metrics always on: servetune reads them).
    `pool` is not needed: --mem-fraction-static is a share of device memory, as in the plan."""
    port = default_port if port is None else port
    py = list(prefix) if prefix else ["python"]
    argv = [*py, "-m", MODULE, "--model-path", model, "--host", host, "--port", str(port)]
    b = FlagBuilder(cfg, argv)
    b.map({"dtype": "--dtype"})
    if cfg.quantization in _QUANT:
        b.flag("--quantization", _QUANT[cfg.quantization], knob="quantization")
    elif cfg.quantization is not None:
        b.unsupported_knob("quantization", f"no SGLang weight format for '{cfg.quantization}'")
    if cfg.kv_cache_dtype in _KV_DTYPE:
        b.flag("--kv-cache-dtype", _KV_DTYPE[cfg.kv_cache_dtype], knob="kv_cache_dtype")
    elif cfg.kv_cache_dtype != "auto":
        b.unsupported_knob("kv_cache_dtype", "SGLang offers auto, bf16, fp8_e4m3/e5m2, fp4_e2m1")
    b.map(
        {
            "tensor_parallel_size": "--tp-size",
            "pipeline_parallel_size": "--pp-size",
            "data_parallel_size": "--dp-size",
            "max_model_len": "--context-length",
            "max_num_seqs": "--max-running-requests",
        }
    )
    if not cfg.enable_chunked_prefill:
        b.flag("--chunked-prefill-size", -1, knob="enable_chunked_prefill")
        if cfg.max_num_batched_tokens is not None:
            b.flag(
                "--max-prefill-tokens", cfg.max_num_batched_tokens, knob="max_num_batched_tokens"
            )
    elif cfg.max_num_batched_tokens is not None:
        # vLLM's per-step token budget ~ SGLang's prefill chunk size.
        b.flag("--chunked-prefill-size", cfg.max_num_batched_tokens, knob="max_num_batched_tokens")
    b.map(
        {"gpu_memory_utilization": "--mem-fraction-static", "kv_cache_tokens": "--max-total-tokens"}
    )
    b.unsupported_if_set("kv_cache_space_gib", "SGLang sizes the pool in tokens: kv_cache_tokens")
    b.map({"block_size": "--page-size", "enable_prefix_caching": "--disable-radix-cache"})
    if cfg.scheduling_policy == "priority":
        b.flag("--enable-priority-scheduling", knob="scheduling_policy")
    elif cfg.scheduling_policy == "lpm":
        b.flag("--schedule-policy", "lpm", knob="scheduling_policy")
    b.map({"enforce_eager": "--disable-cuda-graph"})
    for knob in (*LLAMACPP_ONLY, "n_gpu_layers"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    b.flag("--enable-metrics")
    return b.finish(name, host, port)
