"""KV-cache sizes and capacity.

Per token, per layer (seed 003 §4, seed 000 §2.2):
    standard / GQA / MQA:  2 (K and V) x kv_heads x head_dim x kv_dtype_bytes
    MLA (DeepSeek-V2/V3):  (kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes
                           (the compressed latent and the shared RoPE key are cached,
                           DeepSeek-V2 paper §2.1; vLLM caches exactly this)
Sliding-window layers hold at most `sliding_window` tokens of a sequence.
Paged KV (vLLM PagedAttention): the pool is cut into blocks of `block_size` tokens,
a sequence holds ceil(len / block_size) blocks.
"""

from __future__ import annotations

import math

from servetune.model.spec import ModelSpec


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU of a TP group holds: the heads split across GPUs, and one
    (replicated) head each when tp > kv_heads, as vLLM does."""
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token_layer(model: ModelSpec, dtype_bytes: int, tp: int = 1) -> int:
    """KV bytes one token occupies in one layer on one GPU of a TP group
    (`kv_heads_per_gpu`). MLA's latent is not split: every rank caches it."""
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * dtype_bytes
    return 2 * kv_heads_per_gpu(model, tp) * model.head_dim * dtype_bytes


def kv_bytes_per_token(model: ModelSpec, dtype_bytes: int, tp: int = 1, pp: int = 1) -> int:
    """KV bytes per token over all layers held by one GPU (every layer counted in full).

    Llama-2-7B at fp16: 2 x 32 layers x 32 heads x 128 x 2 B = 524,288 B (seed 000 §2.2)."""
    layers_per_gpu = math.ceil(model.num_layers / pp)
    return layers_per_gpu * kv_bytes_per_token_layer(model, dtype_bytes, tp)


def stage_layers(model: ModelSpec, pp: int = 1) -> tuple[int, int]:
    """(full-attention, sliding-window) layers on the most loaded pipeline stage: PP splits
    the layers, ceil(layers / pp) a stage, and the sliding ones as evenly (`pp` 1: all)."""
    swa_layers = math.ceil(model.sliding_window_layers / pp)
    return math.ceil(model.num_layers / pp) - swa_layers, swa_layers


def kv_bytes_for_sequence(
    model: ModelSpec, dtype_bytes: int, tokens: int, tp: int = 1, pp: int = 1
) -> int:
    """KV bytes of one sequence of `tokens` tokens on one GPU, sliding-window layers capped."""
    per_layer = kv_bytes_per_token_layer(model, dtype_bytes, tp)
    window = model.sliding_window or tokens
    full_layers, swa_layers = stage_layers(model, pp)
    return per_layer * (full_layers * tokens + swa_layers * min(tokens, window))


def effective_kv_bytes_per_token(
    model: ModelSpec, dtype_bytes: int, context: int, tp: int = 1, pp: int = 1
) -> float:
    """Average KV bytes per token for sequences of length `context` (differs from
    kv_bytes_per_token only for sliding-window models)."""
    return kv_bytes_for_sequence(model, dtype_bytes, context, tp, pp) / context


def pool_blocks(pool_bytes: float, block_size: int, bytes_per_token: float) -> int:
    """Whole blocks that fit in the pool (vLLM: num_blocks = available // page_size)."""
    if pool_bytes <= 0:
        return 0
    return int(pool_bytes // (block_size * bytes_per_token))


def max_sequences(blocks: int, block_size: int, context: int) -> int:
    """Sequences of `context` tokens the pool holds at once (each needs ceil(ctx/block) blocks)."""
    return blocks // math.ceil(context / block_size)
