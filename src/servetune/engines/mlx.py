"""MLX adapter: `python -m mlx_lm.server` (mlx-lm's OpenAI-compatible server).

Flag names from `mlx_lm.server --help` of mlx-lm 0.32.2 (installed by
`servetune engine install mlx` with `mlx[cpu]` 0.32.4): --model, --host, --port,
--decode-concurrency (requests decoded together when batchable), --prefill-step-size
(prompt tokens per prefill step, default 2048), --kv-bits (quantized KV; disables
batching). It loads a safetensors directory; HF_HUB_OFFLINE=1 and an existing
HF_HUB_CACHE are needed or `/v1/models` crashes (tried here, 2026-12). Streams start
with `: keepalive` SSE comment lines, which the bench client skips like any comment.
No `/metrics`: every figure of an MLX run is client-side.
"""

from __future__ import annotations

from collections.abc import Sequence

from servetune.engines.base import LLAMACPP_ONLY, Device, FlagBuilder, LaunchSpec, PlannedPool
from servetune.engines.config import EngineConfig

name = "mlx"
default_port = 8080
health_path = "/health"
MODULE = "mlx_lm.server"
TARGET_VERSION = "0.32.2"  # mlx-lm

NO_TOKENIZE = True  # no /tokenize: prompts use the model directory's tokenizer
METRICS: dict[str, str] = {}  # no Prometheus endpoint
HISTOGRAMS: dict[str, str] = {}

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"error: unrecognized arguments|error: argument |invalid choice", "bad_flag"),
    (r"Address already in use|address already in use", "port_in_use"),
    (r"out of memory|Cannot allocate memory", "oom"),
]

_NO_FLAG = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_space_gib",
    "kv_cache_tokens",
    "block_size",
    "scheduling_policy",
    "enforce_eager",
    "quantization",
    "dtype",
)


def build(
    cfg: EngineConfig,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    device: Device = "cpu",
    prefix: Sequence[str] | None = None,
    pool: PlannedPool | None = None,
) -> LaunchSpec:
    """EngineConfig -> mlx_lm.server command. The launcher adds HF_HUB_CACHE (an existing
    directory in servetune's cache, `engines.process`)."""
    port = default_port if port is None else port
    py = list(prefix) if prefix else ["python"]
    b = FlagBuilder(cfg, [*py, "-m", MODULE, "--model", model, "--host", host, "--port", str(port)])
    b.map({"max_num_seqs": "--decode-concurrency", "max_num_batched_tokens": "--prefill-step-size"})
    if cfg.kv_cache_dtype in ("fp8", "int8"):
        b.flag("--kv-bits", 8, knob="kv_cache_dtype")
        b.notes.append("kv_cache_dtype: --kv-bits 8 quantizes KV and turns batching off")
    elif cfg.kv_cache_dtype != "auto":
        b.unsupported_knob("kv_cache_dtype", "MLX keeps KV in the model dtype or --kv-bits")
    for knob in _NO_FLAG:
        b.unsupported_if_set(knob, "mlx_lm.server has no flag for it")
    b.unsupported_if_set("enable_chunked_prefill", "MLX always prefills in steps")
    b.unsupported_if_set("enable_prefix_caching", "MLX's prompt cache is always on")
    for knob in (*LLAMACPP_ONLY, "n_gpu_layers"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    b.env["HF_HUB_OFFLINE"] = "1"
    b.notes.append("no /metrics: every figure is client-side")
    return b.finish(name, host, port)
