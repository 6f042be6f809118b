"""Roofline bounds for decode and prefill (seed 000 §4.2, Williams et al. "Roofline", 2009).

A step takes at least max(bytes moved / memory bandwidth, FLOPs / peak FLOP/s):
- decode at batch b, context c: bytes = weights read once + b x c x KV bytes/token;
  FLOPs = b x (2 x active matmul params + 4 x layers x q_heads x head_dim x c)
  (2 FLOPs per weight per token; attention QK^T and AV each 2 x c x head_dim per head).
- prefill of p tokens: bytes = weights + KV written; FLOPs = p x 2 x active matmul params +
  causal attention 2 x layers x q_heads x head_dim x p^2.
Seed 000 §4.2's worked number: Llama-2-7B fp16 on A100 (2.0 TB/s) -> 14 GB / 2 TB/s = 7 ms.
MoE: a decode step at batch b touches E x (1 - (1 - k/E)^b) experts per layer on average
(uniform routing), so expert bytes grow with the batch until all experts are read.
TP adds two all-reduces per layer (after attention and after the MLP, Megatron-LM):
ring all-reduce time = 2 (tp - 1) / tp x bytes / link bandwidth + a fixed latency.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec

ALLREDUCE_LATENCY_S = {"nvlink": 5e-6, "infinity-fabric": 8e-6, "pcie": 15e-6, "none": 0.0}


class StepCost(BaseModel):
    """One step's bounds on one GPU, seconds."""

    memory_s: float
    compute_s: float
    comm_s: float

    @property
    def time_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.comm_s

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def expected_experts_touched(num_experts: int, per_token: int, batch: int) -> float:
    """Expected distinct experts a batch routes to, uniform routing (balls into bins)."""
    return num_experts * (1 - (1 - per_token / num_experts) ** batch)


def weight_bytes_read(model: ModelSpec, weights_bytes: float, batch: int) -> float:
    """Weight bytes one decode step reads: all of them for dense models; for MoE the
    non-expert part plus the experts the batch touches."""
    if model.moe is None or model.params_total == 0:
        return weights_bytes
    moe = model.moe
    moe_layers = model.num_layers - moe.first_dense_layers
    expert_params = moe_layers * moe.num_experts * 3 * model.hidden_size
    expert_params *= moe.expert_intermediate_size
    share = min(expert_params / model.params_total, 1.0)
    touched = expected_experts_touched(moe.num_experts, moe.experts_per_token, batch)
    return weights_bytes * ((1 - share) + share * touched / moe.num_experts)


def tp_allreduces(model: ModelSpec) -> tuple[tuple[int, int, int], ...]:
    """The all-reduces a forward pass runs under tensor parallelism, as (calls, elements a
    token, bytes an element): Megatron-LM's two a layer on the hidden state, in 16 bits
    (after the attention output and the MLP or MoE down projection); a model whose q/k
    RMSNorm spans all heads adds one a layer of two fp32 numbers a token (vLLM's
    `MiniMaxText01RMSNormTP.forward_qk` in vllm/model_executor/layers/mamba/linear_attn.py,
    which models/minimax_m2.py's attention calls, sums each token's q and k variance
    across the ranks)."""
    megatron = (2 * model.num_layers, model.hidden_size, 2)
    if not model.qk_norm_across_heads:
        return (megatron,)
    return (megatron, (model.num_layers, 2, 4))


def comm_s(model: ModelSpec, hw: HardwareSpec, tp: int, tokens: int) -> float:
    """Seconds of a `tokens`-token forward pass's all-reduces (`tp_allreduces`), each a
    ring all-reduce (`allreduce_s`)."""
    return sum(n * allreduce_s(hw, tp, tokens, w, b) for n, w, b in tp_allreduces(model))


def allreduce_s(hw: HardwareSpec, tp: int, tokens: int, hidden: int, act_bytes: int = 2) -> float:
    """Ring all-reduce of a tokens x hidden activation across tp GPUs."""
    if tp <= 1:
        return 0.0
    link = hw.interconnect_gbs * 1e9 if hw.interconnect_gbs > 0 else 16e9
    size = tokens * hidden * act_bytes
    return 2 * (tp - 1) / tp * size / link + ALLREDUCE_LATENCY_S.get(hw.interconnect, 1e-5)


def decode_step(
    model: ModelSpec,
    hw: HardwareSpec,
    weights_per_gpu: float,
    kv_bytes_per_token: float,
    batch: int,
    context: int,
    compute_dtype: str,
    tp: int = 1,
) -> StepCost:
    """Lower bound of one decode step (batch sequences, each `context` tokens deep)."""
    memory = weight_bytes_read(model, weights_per_gpu, batch) + batch * context * kv_bytes_per_token
    attn = 4 * model.num_layers * model.num_attention_heads * model.head_dim * context
    flops = batch * (2 * model.params_matmul_active + attn) / tp
    return _step(model, hw, memory, flops, compute_dtype, tp, tokens=batch)


def prefill_time(
    model: ModelSpec,
    hw: HardwareSpec,
    weights_per_gpu: float,
    kv_bytes_per_token: float,
    prompt_tokens: int,
    compute_dtype: str,
    tp: int = 1,
) -> StepCost:
    """Lower bound of prefilling one prompt (the TTFT floor with no queueing)."""
    memory = weights_per_gpu + prompt_tokens * kv_bytes_per_token
    attn = 2 * model.num_layers * model.num_attention_heads * model.head_dim * prompt_tokens**2
    flops = (prompt_tokens * 2 * model.params_matmul_active + attn) / tp
    return _step(model, hw, memory, flops, compute_dtype, tp, tokens=prompt_tokens)


def _step(
    model: ModelSpec,
    hw: HardwareSpec,
    memory_bytes: float,
    flops: float,
    compute_dtype: str,
    tp: int,
    tokens: int,
) -> StepCost:
    """Bytes and FLOPs -> times, plus the step's all-reduces (`tp_allreduces`)."""
    return StepCost(
        memory_s=memory_bytes / hw.bandwidth_bytes_s,
        compute_s=flops / hw.peak_flops(compute_dtype),
        comm_s=comm_s(model, hw, tp, tokens),
    )


def compute_bound_batch(
    model: ModelSpec,
    hw: HardwareSpec,
    weights_per_gpu: float,
    kv_bytes_per_token: float,
    context: int,
    compute_dtype: str,
    tp: int = 1,
    limit: int = 1 << 16,
) -> int | None:
    """Smallest batch at which a decode step turns compute-bound: where seed 000 §3.1's
    saturation region starts. None if it stays memory-bound up to `limit` (long contexts:
    KV reads grow with the batch as fast as FLOPs do)."""

    def compute_bound(b: int) -> bool:
        step = decode_step(
            model, hw, weights_per_gpu, kv_bytes_per_token, b, context, compute_dtype, tp
        )
        return step.compute_s >= step.memory_s

    if not compute_bound(limit):
        return None
    lo, hi = 1, limit
    if compute_bound(lo):
        return 1
    while hi - lo > 1:  # bisection: compute_bound is monotone in b
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def throughput_curve(
    model: ModelSpec,
    hw: HardwareSpec,
    weights_per_gpu: float,
    kv_bytes_per_token: float,
    context: int,
    compute_dtype: str,
    max_batch: int,
    tp: int = 1,
) -> list[tuple[int, float, float]]:
    """(batch, step ms, output tok/s ceiling) at batch 1, 2, 4, ... up to max_batch."""
    points = []
    batches = [2**i for i in range(int(math.log2(max(max_batch, 1))) + 1)]
    if batches[-1] != max_batch and max_batch > 0:
        batches.append(max_batch)
    for b in batches:
        step = decode_step(
            model, hw, weights_per_gpu, kv_bytes_per_token, b, context, compute_dtype, tp
        )
        points.append((b, step.time_s * 1e3, b / step.time_s))
    return points
