"""Text Generation Inference adapter: `text-generation-launcher`.

Flag names checked against TGI's docs/source/reference/launcher.md and
launcher/src/main.rs (TGI 3.3.x, main branch Jan 2026): --model-id, --hostname,
--port, --dtype {float16,bfloat16}, --quantize, --kv-cache-dtype
{fp8_e4m3fn,fp8_e5m2}, --num-shard, --max-total-tokens, --max-batch-size,
--max-batch-prefill-tokens, --max-batch-total-tokens, --cuda-memory-fraction,
--cuda-graphs (0 disables), and per launch (`instance_args`) --shard-uds-path,
--master-port, --prometheus-port. Prefix caching is the PREFIX_CACHING env var (0 = off);
TGI 3 always chunks prefills and picks its own block size (attention backend).
Metric names from router/src (tgi_*). Not run on this machine: golden tests only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from servetune.engines.base import (
    LLAMACPP_ONLY,
    Device,
    FlagBuilder,
    LaunchSpec,
    PlannedPool,
    fmt_float,
)
from servetune.engines.config import EngineConfig

name = "tgi"
# The version whose CLI and metrics the tests check against (data/engine_flags/tgi.json).
TARGET_VERSION = "3.3.7"
default_port = 3000
health_path = "/health"

_QUANT = {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "int8": "eetq"}

METRICS: dict[str, str] = {
    "requests_running": "tgi_batch_current_size",
    "requests_waiting": "tgi_queue_size",
    "kv_cache_capacity_tokens": "tgi_batch_max_total_tokens",
    "kv_cache_used_tokens": "tgi_batch_current_max_tokens",
    "requests_finished_total": "tgi_request_success",  # TGI adds no _total (tgi.json)
}
HISTOGRAMS: dict[str, str] = {
    "queue_time_seconds": "tgi_request_queue_duration",
    "e2e_seconds": "tgi_request_duration",
    "tpot_seconds": "tgi_request_mean_time_per_token_duration",
    "generated_tokens": "tgi_request_generated_tokens",
    "prompt_tokens": "tgi_request_input_length",
}

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"error: unexpected argument|error: invalid value|error: unrecognized", "bad_flag"),
    (r"out of memory|Not enough memory", "oom"),
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
    """EngineConfig -> text-generation-launcher command (+ PREFIX_CACHING env). `pool` is
    not needed: --cuda-memory-fraction is a share of device memory, as in the plan."""
    port = default_port if port is None else port
    exe = list(prefix) if prefix else ["text-generation-launcher"]
    b = FlagBuilder(cfg, [*exe, "--model-id", model, "--hostname", host, "--port", str(port)])
    if cfg.dtype in ("float16", "bfloat16"):
        b.flag("--dtype", cfg.dtype, knob="dtype")
    elif cfg.dtype != "auto":
        b.unsupported_knob("dtype", "TGI serves float16 or bfloat16 only")
    if cfg.quantization in _QUANT:
        b.flag("--quantize", _QUANT[cfg.quantization], knob="quantization")
    elif cfg.quantization is not None:
        b.unsupported_knob("quantization", f"no TGI --quantize value for '{cfg.quantization}'")
    if cfg.kv_cache_dtype == "fp8":
        b.flag("--kv-cache-dtype", "fp8_e4m3fn", knob="kv_cache_dtype")
    elif cfg.kv_cache_dtype != "auto":
        b.unsupported_knob("kv_cache_dtype", "TGI's KV cache is the model dtype or fp8")
    b.map({"tensor_parallel_size": "--num-shard"})
    b.unsupported_if_set("pipeline_parallel_size", "TGI shards with tensor parallelism only")
    b.unsupported_if_set("data_parallel_size", "run one TGI per replica behind a balancer")
    b.map(
        {
            "max_model_len": "--max-total-tokens",
            "max_num_seqs": "--max-batch-size",
            "max_num_batched_tokens": "--max-batch-prefill-tokens",
            "kv_cache_tokens": "--max-batch-total-tokens",
        }
    )
    # Always given: TGI's own default is 1.0 (launcher/src/main.rs, `#[clap(default_value =
    # "1.0")] cuda_memory_fraction`; docs/source/reference/launcher.md), while the canonical
    # default (0.9) is the share servetune's plan budgets: left out, TGI took the whole GPU.
    b.flag(
        "--cuda-memory-fraction",
        fmt_float(cfg.gpu_memory_utilization),
        knob="gpu_memory_utilization",
    )
    b.unsupported_if_set("kv_cache_space_gib", "TGI sizes the pool in tokens: kv_cache_tokens")
    b.unsupported_if_set("block_size", "TGI's block size follows its attention backend")
    b.unsupported_if_set("enable_chunked_prefill", "TGI 3 always chunks prefills")
    if not cfg.enable_prefix_caching:
        b.env["PREFIX_CACHING"] = "0"
    b.unsupported_if_set("scheduling_policy", "TGI schedules first-come first-served")
    if cfg.enforce_eager:
        b.flag("--cuda-graphs", 0, knob="enforce_eager")
    for knob in (*LLAMACPP_ONLY, "n_gpu_layers"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    return b.finish(name, host, port)


# The socket name TGI's shards listen on (it appends `-<rank>`); Linux's sun_path holds 107
# bytes, so a run dir deeper than this falls back to the temp dir.
_UDS_MAX = 100


def instance_args(workdir: Path, port: int, free_port: Callable[[str], int]) -> list[str]:
    """Per-launch flags that keep two TGIs on one host apart (`engines.process` adds them;
    `build` stays the same on any machine). TGI's defaults are one per host (v3.3.7
    launcher/src/main.rs): the shards' gRPC socket `--shard-uds-path
    /tmp/text-generation-server`, torch.distributed's `--master-port 29500`, and the
    router's Prometheus listener `--prometheus-port 9000` on 0.0.0.0 (the clash is
    huggingface/text-generation-inference#3062; the flag is in data/engine_flags/tgi.json).
    A second launch took over the first one's sockets or failed to bind. A flag the user
    gave in --extra is left to them (`engines.process`)."""
    import tempfile

    uds = workdir / "tgi-server"
    if len(str(uds)) > _UDS_MAX:
        uds = Path(tempfile.gettempdir()) / f"servetune-tgi-{port}"
    return [
        "--shard-uds-path",
        str(uds),
        "--master-port",
        str(free_port("127.0.0.1")),
        "--prometheus-port",
        str(free_port("0.0.0.0")),
    ]
