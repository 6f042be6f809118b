"""TensorRT-LLM adapter: `trtllm-serve <model>` (PyTorch backend, the default).

Flag names checked against tensorrt_llm/commands/serve.py and
tensorrt_llm/llmapi/llm_args.py (TensorRT-LLM 1.x main branch, 2026):
--max_batch_size, --max_num_tokens, --max_seq_len, --tp_size, --pp_size,
--kv_cache_free_gpu_memory_fraction (a share of the memory free after loading: see
`_kv_fraction`), --enable_chunked_prefill (off by default, so the canonical default
`True` is emitted), --config <yaml> (alias
--extra_llm_api_options). Knobs without a CLI flag go in that YAML: top-level
`dtype`, `kv_cache_config` {dtype, enable_block_reuse (prefix caching, on by
default), tokens_per_block (default 32), max_tokens, max_gpu_total_bytes} and
`cuda_graph_config: null` (eager). Not run on this machine: golden tests only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from servetune.engines.base import (
    GIB,
    LLAMACPP_ONLY,
    Device,
    FlagBuilder,
    LaunchSpec,
    PlannedPool,
    fmt_float,
)
from servetune.engines.config import EngineConfig

name = "trtllm"
# The source revision whose trtllm-serve options the tests check against
# (data/engine_flags/trtllm.json); no release tag was at hand for it.
TARGET_VERSION = "main@00209af149e7774406881a37283dce303571eb11"
default_port = 8000
health_path = "/health"
CONFIG_FILE = "servetune-trtllm.yaml"

_KV_DTYPE = {"fp8": "fp8", "fp16": "float16", "bf16": "bfloat16"}

# trtllm-serve's /metrics returns JSON iteration stats, not Prometheus text.
METRICS: dict[str, str] = {}
HISTOGRAMS: dict[str, str] = {}

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"Error: No such option|Error: Invalid value|Got unexpected extra argument", "bad_flag"),
    (r"out of memory|OutOfMemory", "oom"),
    (r"Address already in use|address already in use|Failed to bind socket", "port_in_use"),
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
    """EngineConfig -> trtllm-serve command, plus a `--config` YAML when needed; `pool`
    turns the plan's KV pool into TensorRT-LLM's own fraction."""
    port = default_port if port is None else port
    exe = list(prefix) if prefix else ["trtllm-serve"]
    b = FlagBuilder(cfg, [*exe, model, "--host", host, "--port", str(port)])
    extra: dict[str, object] = {}
    kv: dict[str, object] = {}

    if cfg.dtype != "auto":
        extra["dtype"] = cfg.dtype
    if cfg.quantization is not None:
        b.unsupported_knob(
            "quantization", "TensorRT-LLM reads quantization from a pre-quantized checkpoint"
        )
    if cfg.kv_cache_dtype in _KV_DTYPE:
        kv["dtype"] = _KV_DTYPE[cfg.kv_cache_dtype]
    elif cfg.kv_cache_dtype != "auto":
        b.unsupported_knob("kv_cache_dtype", "no int8 KV cache in the PyTorch backend")
    b.map({"tensor_parallel_size": "--tp_size", "pipeline_parallel_size": "--pp_size"})
    b.unsupported_if_set("data_parallel_size", "run one trtllm-serve per replica")
    b.map(
        {
            "max_num_seqs": "--max_batch_size",
            "max_num_batched_tokens": "--max_num_tokens",
            "max_model_len": "--max_seq_len",
        }
    )
    _kv_fraction(cfg, pool, b)
    if cfg.enable_chunked_prefill:
        b.flag("--enable_chunked_prefill", knob="enable_chunked_prefill")
    if cfg.kv_cache_space_gib is not None:
        kv["max_gpu_total_bytes"] = int(cfg.kv_cache_space_gib * GIB)
    if cfg.kv_cache_tokens is not None:
        kv["max_tokens"] = cfg.kv_cache_tokens
    if cfg.block_size != 16:
        kv["tokens_per_block"] = cfg.block_size
    if not cfg.enable_prefix_caching:
        kv["enable_block_reuse"] = False
    b.unsupported_if_set("scheduling_policy", "trtllm-serve has no priority scheduler")
    if cfg.enforce_eager:
        extra["cuda_graph_config"] = None
    for knob in (*LLAMACPP_ONLY, "n_gpu_layers"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    if kv:
        extra["kv_cache_config"] = kv
    if extra:
        import yaml  # only when a config file is written: keeps `import servetune` light

        b.files[CONFIG_FILE] = yaml.safe_dump(extra, sort_keys=True)
        b.flag("--config", CONFIG_FILE)
    return b.finish(name, host, port)


def _kv_fraction(cfg: EngineConfig, pool: PlannedPool | None, b: FlagBuilder) -> None:
    """--kv_cache_free_gpu_memory_fraction is a share of the memory left free after the
    weights and a profiling forward pass, not of the device like gpu_memory_utilization:
    TensorRT-LLM's KvCacheCreator._cal_max_memory (tensorrt_llm/_torch/pyexecutor/
    _util.py) sizes KV as (total - profiling peak + temporary KV) x fraction, and its
    docs ("How to Change KV Cache Behavior") read the default 0.9 as "90% of free GPU
    memory". With the plan's figures: fraction = KV pool / (device - weights - activation
    peak - fixed overheads), floored to 4 decimals so the pool never exceeds the plan."""
    if cfg.kv_cache_space_gib is not None:  # kv_cache_config.max_gpu_total_bytes sizes it
        b.unsupported_if_set("gpu_memory_utilization", "kv_cache_space_gib sizes the KV pool")
        return
    free = pool.free_after_load_bytes if pool else 0.0
    if pool is None or pool.kv_bytes <= 0 or free <= 0:
        b.unsupported_if_set(
            "gpu_memory_utilization",
            "TensorRT-LLM's fraction is of the memory free after loading; "
            "`servetune plan` converts it with its memory figures",
        )
        return
    fraction = math.floor(min(pool.kv_bytes / free, 1.0) * 1e4) / 1e4
    b.flag("--kv_cache_free_gpu_memory_fraction", fmt_float(fraction), knob="kv_cache_space_gib")
    b.notes.append(
        f"gpu_memory_utilization: the planned {pool.kv_bytes / GIB:.2f} GiB KV pool is "
        f"{fraction} of the {free / GIB:.2f} GiB free after loading"
    )
