"""SGLang's memory defaults and KV pool: the one place `plan` and `simulate` size it from.

SGLang does not profile an activation peak as vLLM does. `--mem-fraction-static` f is the
share of the GPU memory free at start-up (after the CUDA context and NCCL) that weights plus
the KV pool may take; the rest, 1 - f, is left for activations and CUDA graphs. So

    KV pool = free_at_start x (1 - (1 - f)) - weights = f x free_at_start - weights

(model_runner `profile_max_num_token`: rest_memory = available_after_load - total x (1 - f)),
and the pool holds KV pool // bytes per token tokens, in pages of `--page-size` tokens (1 by
default: RadixAttention's prefix cache works token by token).

When f is not given, SGLang derives it from the device's memory, with the chunked-prefill
size and the CUDA-graph batch size (server_args.py `_handle_gpu_memory_settings`):

    reserved MiB = 512 + max(chunked_prefill_size, 2048) x 1.5 + cuda_graph_max_bs x 2
                   + tp x pp / 8 x 1024,   at least 10 GiB on devices over 60 GiB
    f = round((device MiB - reserved) / device MiB, 3)

and max_running_requests defaults to min(clamp(pool tokens / context length x 512, 2048,
4096), pool tokens // 2) (model_runner `max_num_reqs`, scheduler `max_running_requests`).

Hybrid sliding-window models (SGLang's `is_hybrid_swa_model`: GPT-OSS, Llama 4, MiMo-V2,
Step-3.5, Gemma 4; not Gemma 2/3, whose every layer keeps the full length there) get two
pools: the full-attention layers' and the sliding-window layers', the latter
`--swa-full-tokens-ratio` r (0.8) times the former's tokens. The profiled count T above
prices every layer at full cost; the same bytes split into the two pools give the full
pool T x (n_full + n_swa) / (n_full + r x n_swa) tokens (layers of equal per-token bytes),
and SGLang's max_total_num_tokens and max_running_requests are the full pool's
(model_runner_kv_cache_mixin `_resolve_hybrid_swa_tokens`, `_resolve_memory_pool_config`;
--max-total-tokens caps T before the split). The window pool frees the tokens that slide
out of a request's window as it runs (`_evict_swa`), so with requests longer than the
window (GPT-OSS: 128 tokens) the full pool is the one that binds; the simulator keeps that
one pool. (Earlier SGLang releases turned the hybrid pool off for GPT-OSS, at first always,
later with the trtllm_mha attention backend; its current GPT-OSS handler does not.)

Facts from sgl-project/sglang at the commits read: python/sglang/srt/server_args.py
469c63e54e7d, model_runner's profile_max_num_token and max_num_reqs as quoted there.
"""

from __future__ import annotations

from dataclasses import dataclass

from servetune.engines.config import EngineConfig
from servetune.hardware.spec import HardwareSpec
from servetune.units import GiB, MiB

# (device memory below, GiB; default --chunked-prefill-size; cuda_graph_max_bs at tp < 4,
# at tp >= 4): server_args.py `_handle_gpu_memory_settings`, the tiers it names
# (T4/4080, A10/4090, A100-40G/L40, H100/A100-80G, H20/H200, B200/MI300).
MEMORY_TIERS: tuple[tuple[float, int, int, int], ...] = (
    (20, 2048, 8, 8),
    (35, 2048, 24, 80),
    (60, 4096, 32, 160),
    (90, 8192, 256, 512),
    (160, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
)
# --max-prefill-tokens default (server_args.py): the prompt tokens one prefill batch takes.
MAX_PREFILL_TOKENS = 16384
# --swa-full-tokens-ratio default (server_args.py): window-pool tokens per full-pool token.
SWA_FULL_TOKENS_RATIO = 0.8
# Architectures SGLang gives a hybrid sliding-window pool (model_config.py
# `is_hybrid_swa_model`); other sliding-window models are pooled as full attention there.
HYBRID_SWA_ARCHITECTURES = frozenset(
    {
        "GptOssForCausalLM",
        "Llama4ForConditionalGeneration",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
    }
)
# EngineConfig's block_size default (vLLM's 16) means "the engine's own page size" for
# SGLang (the adapter emits --page-size only when it differs), which is 1.
CANONICAL_BLOCK = 16
SGLANG_PAGE = 1
# EngineConfig's gpu_memory_utilization default: left to SGLang's own rule when unchanged
# (the adapter emits --mem-fraction-static only when it differs).
CANONICAL_UTILIZATION = 0.9
# Those two "unchanged means not given" readings hold for callers that only have an
# EngineConfig (simulate, the tuner: docs/sglang-sim.md). A caller that knows which knobs
# the user set (`plan`) passes them as `given_knobs`, so an explicit 0.9 or 16 is the
# user's value and a default nobody gave (a scenario's vLLM utilization) is not.


@dataclass(frozen=True)
class SglangPool:
    """One GPU's SGLang memory split and the scheduler limits that follow from it."""

    mem_fraction_static: float
    fraction_given: bool  # the user's --mem-fraction-static, else SGLang's rule
    free_at_start_bytes: float  # device - CUDA context (and NCCL with TP/PP)
    usable_bytes: float  # f x free_at_start: weights + KV pool
    reserved_bytes: float  # (1 - f) x free_at_start: activations, CUDA graphs
    kv_pool_bytes: float
    pool_tokens: int  # whole pages x page size (a hybrid model's full-attention pool)
    page_size: int
    chunked_prefill_size: int  # 0: chunked prefill off (--chunked-prefill-size -1)
    max_running_requests: int
    # a hybrid sliding-window model's window-layer pool (module docstring); 0: one pool
    window_pool_tokens: int = 0


def page_tokens(cfg: EngineConfig, given_knobs: frozenset[str] | None = None) -> int:
    """Tokens per KV page the engine allocates: SGLang's --page-size (1 unless block_size
    is given, or without `given_knobs` set to something other than vLLM's 16), every other
    engine's block_size."""
    if cfg.engine != "sglang":
        return cfg.block_size
    given = _given(given_knobs, "block_size", cfg.block_size != CANONICAL_BLOCK)
    return cfg.block_size if given else SGLANG_PAGE


def _given(given_knobs: frozenset[str] | None, knob: str, differs: bool) -> bool:
    """Whether the user set `knob`: from `given_knobs` when the caller knows, else whether
    it differs from the canonical default (the sentinel above)."""
    return differs if given_knobs is None else knob in given_knobs


def memory_tier(device_gib: float, tp: int) -> tuple[int, int]:
    """SGLang's default chunked-prefill size and cuda_graph_max_bs for a device."""
    for below, chunk, graphs_small, graphs_large in MEMORY_TIERS:
        if device_gib < below:
            return chunk, graphs_small if tp < 4 else graphs_large
    raise AssertionError("the last tier is unbounded")


def default_fraction(device_mib: float, chunk: int, graph_bs: int, tp: int, pp: int) -> float:
    """SGLang's --mem-fraction-static rule (module docstring); `chunk` <= 0: chunked
    prefill off, when --max-prefill-tokens stands in for it."""
    reserved = 512 + max(chunk if chunk > 0 else MAX_PREFILL_TOKENS, 2048) * 1.5
    reserved += graph_bs * 2 + tp * pp / 8 * 1024
    if device_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((device_mib - reserved) / device_mib, 3)


def max_running(pool_tokens: int, context_len: int) -> int:
    """SGLang's default max_running_requests: the request pool (pool tokens / context
    length x 512, within 2048..4096) and at most half the token pool."""
    reqs = min(max(int(pool_tokens / context_len * 512), 2048), 4096)
    return max(1, min(reqs, pool_tokens // 2))


def hybrid_swa_scale(
    full_layers: int, swa_layers: int, ratio: float = SWA_FULL_TOKENS_RATIO
) -> float:
    """Full-pool tokens per token of the all-layers-full count, for a hybrid
    sliding-window model whose layers take equal bytes a token (module docstring): the same
    bytes, with the window layers holding `ratio` tokens per full-pool token."""
    return (full_layers + swa_layers) / (full_layers + ratio * swa_layers)


def sglang_pool(
    hw: HardwareSpec,
    cfg: EngineConfig,
    weights_bytes: float,
    kv_bytes_per_token: float,
    context_len: int,
    start_overhead_bytes: float,
    given_knobs: frozenset[str] | None = None,
    hybrid_swa: tuple[int, int] | None = None,
    swa_ratio: float = SWA_FULL_TOKENS_RATIO,
) -> SglangPool:
    """The KV pool SGLang sizes on one GPU of `hw` under `cfg` (module docstring).
    `start_overhead_bytes`: what is taken before SGLang measures free memory (CUDA context,
    NCCL buffers). `given_knobs`: the knobs the user set, when the caller knows (`_given`);
    SGLang's own fraction is used unless gpu_memory_utilization is one of them.
    `hybrid_swa`: (full-attention, sliding-window) layers of a model SGLang pools apart
    (`HYBRID_SWA_ARCHITECTURES`; None under --disable-hybrid-swa-memory), its window pool
    `swa_ratio` (--swa-full-tokens-ratio) tokens per full-pool token; `kv_bytes_per_token`
    prices every layer at full length, as SGLang's profile does."""
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    chunk, graph_bs = memory_tier(hw.memory_gib, tp)
    if not cfg.enable_chunked_prefill:
        chunk = 0
    elif cfg.max_num_batched_tokens is not None:
        chunk = cfg.max_num_batched_tokens  # the adapter's --chunked-prefill-size
    differs = cfg.gpu_memory_utilization != CANONICAL_UTILIZATION
    given = _given(given_knobs, "gpu_memory_utilization", differs)
    if given:
        fraction = cfg.gpu_memory_utilization
    else:
        fraction = default_fraction(hw.memory_bytes / MiB, chunk, graph_bs, tp, pp)
    free = hw.memory_bytes - start_overhead_bytes
    usable = fraction * free
    pool = usable - weights_bytes
    page = page_tokens(cfg, given_knobs)
    tokens = int(max(pool, 0) // (kv_bytes_per_token * page)) * page
    if cfg.kv_cache_tokens is not None:  # --max-total-tokens caps the profiled pool
        tokens = min(tokens, cfg.kv_cache_tokens // page * page)
    window = 0
    if hybrid_swa is not None:  # the same bytes as a full pool and a window pool
        tokens = int(tokens * hybrid_swa_scale(*hybrid_swa, swa_ratio)) // page * page
        window = int(tokens * swa_ratio) // page * page
    seqs = cfg.max_num_seqs or max_running(tokens, context_len)
    return SglangPool(
        mem_fraction_static=fraction,
        fraction_given=given,
        free_at_start_bytes=free,
        usable_bytes=usable,
        reserved_bytes=free - usable,
        kv_pool_bytes=pool,
        pool_tokens=tokens,
        page_size=page,
        chunked_prefill_size=chunk,
        max_running_requests=max(1, min(seqs, max(tokens // 2, 1))),
        window_pool_tokens=window,
    )


def describe(p: SglangPool) -> str:
    """One line for people: the fraction and where it comes from, the pool in tokens."""
    src = "given" if p.fraction_given else "SGLang's default for this GPU"
    chunk = p.chunked_prefill_size or "off"
    pools = f"KV pool {p.pool_tokens:,} tokens"
    if p.window_pool_tokens:
        pools = (
            f"KV pools {p.pool_tokens:,} tokens (full-attention layers) and "
            f"{p.window_pool_tokens:,} (sliding-window layers)"
        )
    return (
        f"--mem-fraction-static {p.mem_fraction_static:g} ({src}): weights + KV pool "
        f"{p.usable_bytes / GiB:.1f} GiB, {pools} (page {p.page_size}); chunked prefill "
        f"{chunk}; max running requests {p.max_running_requests:,}"
    )
