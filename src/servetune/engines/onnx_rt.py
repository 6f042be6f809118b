"""ONNX Runtime adapter: `onnx-genai serve` from the `onnx-genai-server` wheel.

ONNX Runtime GenAI (`onnxruntime-genai`) has a generator and a model builder but no
server. Of the OpenAI-compatible servers for it on PyPI (checked 2026-12):
- `onnx-genai-server` 0.1.0.dev6 (pre-release; a Rust server over the `onnxruntime`
  wheel, loading the builder's output): continuous batching (`--max-batch`), a paged KV
  cache and a Prometheus `/metrics` (`onnx_genai_*`). It buffers every stream: all
  chunks leave together when the answer is done (measured here: 33 chunks within
  2-10 ms after 1.1-1.2 s), so TTFT/ITL of a run on it are not measurable
  (metrics/buffering.py).
- `prism-local` 0.2.0 streams token by token through onnxruntime-genai's own generator,
  but serialises requests behind one lock (its README, "Known limitations") and has
  no `/metrics`: a single-user server, nothing to tune or load-test.
servetune uses the first: batching, tunable knobs and server metrics outweigh a true
stream, and the buffering is detected and said in every result.

Flags from `onnx-genai serve --help` of 0.1.0.dev6 (data/engine_flags/onnx.json, checked
against the installed server by tests/test_engine_onnx.py). The model directory comes
from `servetune engine make-model --kind onnx` (engines/onnx_model.py): dtype,
quantization and context length are fixed there, at conversion, not at launch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from servetune.engines.base import (
    LLAMACPP_ONLY,
    Device,
    FlagBuilder,
    LaunchSpec,
    PlannedPool,
    host_port,
)
from servetune.engines.config import EngineConfig

name = "onnx"
default_port = 8080  # the server's own default (--addr 127.0.0.1:8080)
health_path = "/health"
COMMAND = "onnx-genai"  # console script of the onnx-genai-server wheel
TARGET_VERSION = "0.1.0.dev6"  # onnx-genai-server
NO_TOKENIZE = True  # no /tokenize: prompts use the model dir's tokenizer.json

METRICS: dict[str, str] = {
    "requests_running": "onnx_genai_batch_size_current",  # admitted generations
    "requests_waiting": "onnx_genai_requests_waiting",
    "prefix_cache_hit_rate": "onnx_genai_prefix_cache_hit_rate",  # per lookup, not per token
    "prompt_tokens_total": "onnx_genai_prompt_tokens_total",
    "generation_tokens_total": "onnx_genai_completion_tokens_total",
}
# No ttft_seconds: the server stamps its TTFT histogram when the buffered answer is
# released (measured here: TTFT sum 8.41 s vs E2E sum 8.44 s over 10 requests), so it is
# the E2E again, not a time to first token.
HISTOGRAMS: dict[str, str] = {
    "e2e_seconds": "onnx_genai_e2e_request_latency_seconds",
}
# Exported as parts, combined by `derived` (engines/metrics.py calls it).
_PAGES_IN_USE = "onnx_genai_kv_pages_in_use"
_PAGES_CAPACITY = "onnx_genai_kv_pages_capacity"
_PAGE_TOKENS = "onnx_genai_kv_page_size_tokens"
DERIVED_FROM = (_PAGES_IN_USE, _PAGES_CAPACITY, _PAGE_TOKENS)

FAILURE_PATTERNS: list[tuple[str, str]] = [
    # clap's messages for an unknown flag or a bad value
    (r"error: unexpected argument|error: invalid value", "bad_flag"),
    (r"Address already in use|address already in use", "port_in_use"),
    (r"error: failed to load model", "bad_model"),
    (r"out of memory|Cannot allocate memory", "oom"),
]

# The server's --kv-cache-dtype values for the canonical ones it has (f32 is its default).
_KV_DTYPE = {"fp8": "fp8_e4m3fn", "int8": "int8"}
_NO_FLAG = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_batched_tokens",
    "kv_cache_space_gib",
    "kv_cache_tokens",
    "scheduling_policy",
    "enforce_eager",
)
_AT_CONVERSION = ("dtype", "quantization", "max_model_len")


def executable(prefix: Sequence[str] | None) -> list[str]:
    """The `onnx-genai` command: servetune's install reports its venv's Python, and the
    wheel's console script sits next to it; any other prefix is the command itself."""
    if not prefix:
        return [COMMAND]
    first = Path(prefix[0])
    if first.name.startswith("python"):
        return [str(first.with_name(COMMAND)), *prefix[1:]]
    return list(prefix)


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
    """EngineConfig -> `onnx-genai serve MODEL_DIR --addr HOST:PORT ...`."""
    port = default_port if port is None else port
    argv = [*executable(prefix), "serve", model, "--addr", host_port(host, port)]
    b = FlagBuilder(cfg, argv)
    # --vram-limit: "memory ceiling for weights and KV cache ... a fraction of detected
    # capacity" (its --help), the meaning of vLLM's --gpu-memory-utilization.
    b.map({"max_num_seqs": "--max-batch", "gpu_memory_utilization": "--vram-limit"})
    if cfg.kv_cache_dtype in _KV_DTYPE:
        b.flag("--kv-cache-dtype", _KV_DTYPE[cfg.kv_cache_dtype], knob="kv_cache_dtype")
    elif cfg.kv_cache_dtype != "auto":
        b.unsupported_knob("kv_cache_dtype", "onnx-genai keeps KV in f32, int8 or fp8 only")
    if cfg.threads is not None:
        # decode workers, pinned to that many CPUs
        b.flag("--cpu-cores", cfg.threads, knob="threads")
    for knob in _NO_FLAG:
        b.unsupported_if_set(knob, "onnx-genai serve has no flag for it")
    for knob in _AT_CONVERSION:
        b.unsupported_if_set(knob, "fixed when the model is converted (engine make-model)")
    b.unsupported_if_set("block_size", "KV pages are 16 tokens, not configurable")
    b.unsupported_if_set("enable_chunked_prefill", "no chunked-prefill switch")
    b.unsupported_if_set("enable_prefix_caching", "its prefix cache is always on")
    for knob in (k for k in LLAMACPP_ONLY if k != "threads"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    b.unsupported_if_set("n_gpu_layers", "llama.cpp-only knob")
    if device == "gpu":
        b.notes.append(
            "GPU: install onnx-genai-server[cuda] and convert with the builder's -e cuda"
        )
    b.notes.append("streams are buffered to the end: TTFT/ITL are not measurable")
    return b.finish(name, host, port)


def derived(raw: Mapping[str, float]) -> dict[str, float]:
    """Canonical figures the server exports only as parts: the KV pool's use (pages held
    over capacity, capped at 1: its help says a page demoted to the cold tier keeps its
    reference, so in-use may pass capacity) and its size in tokens (pages x page size)."""
    out: dict[str, float] = {}
    capacity = raw.get(_PAGES_CAPACITY)
    if capacity:
        if (in_use := raw.get(_PAGES_IN_USE)) is not None:
            out["kv_cache_usage"] = min(1.0, in_use / capacity)
        if page := raw.get(_PAGE_TOKENS):
            out["kv_cache_capacity_tokens"] = capacity * page
    return out
