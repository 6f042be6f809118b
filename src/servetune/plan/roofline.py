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
Sliding-window layers attend to at most `sliding_window` keys (`attention_pairs`).
PP (`pp`): every cost here is one stage's, the most loaded one (ceil(layers / pp) layers,
the LM head's matmul, its all-reduces); a token passes the stages in turn, so the planner
multiplies a stage by pp (docs/plan.md "Roofline bounds").
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.plan.kv import stage_layers
from servetune.plan.quant import WeightFormat

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


def expert_bytes_per_gpu(model: ModelSpec, fmt: WeightFormat, tp: int = 1, pp: int = 1) -> float:
    """Routed-expert weight bytes on one GPU: the expert matrices (ModelSpec.params_classes)
    at the format's expert rate (MXFP4: 4.25 bpw, a checkpoint's scheme, else the body
    rate), sharded by TP (vLLM splits every expert across the TP ranks), the most loaded
    PP stage holding ceil(layers / pp) of the MoE layers."""
    if model.moe is None:
        return 0.0
    bits = fmt.class_bits.get("experts", fmt.body_bits)
    moe_layers = model.num_layers - model.moe.first_dense_layers
    if moe_layers <= 0:
        return 0.0
    share = min(math.ceil(model.num_layers / pp), moe_layers) / moe_layers
    return model.params_classes.experts * bits / 8 / tp * share


def weight_bytes_read(
    model: ModelSpec,
    weights_bytes: float,
    batch: int,
    weight_format: WeightFormat | None = None,
    tp: int = 1,
    pp: int = 1,
) -> float:
    """Weight bytes one decode step reads: all of them for dense models; for MoE the
    non-expert part plus the experts the batch touches:
    `non-expert + expert_bytes x E(1 - (1 - k/E)^b) / E` (docs/plan.md).

    With `weight_format` (and the `tp`, `pp` that `weights_bytes` is per GPU of), the
    expert bytes are the experts' own (`expert_bytes_per_gpu`): a format that stores the
    experts apart (MXFP4 at 4.25 bpw, the rest 16-bit) makes their share of the bytes far
    smaller than their share of the parameters. Without it the share is the parameters'
    (the simulator's step-time tiers call it so)."""
    if model.moe is None or model.params_total == 0:
        return weights_bytes
    moe = model.moe
    if weight_format is not None:
        experts = expert_bytes_per_gpu(model, weight_format, tp, pp)
        share = min(experts / weights_bytes, 1.0) if weights_bytes > 0 else 0.0
    else:
        moe_layers = model.num_layers - moe.first_dense_layers
        expert_params = moe_layers * moe.num_experts * 3 * model.hidden_size
        expert_params *= moe.expert_intermediate_size
        share = min(expert_params / model.params_total, 1.0)
    touched = expected_experts_touched(moe.num_experts, moe.experts_per_token, batch)
    return weights_bytes * ((1 - share) + share * touched / moe.num_experts)


def stage_matmul_params(model: ModelSpec, pp: int = 1) -> float:
    """Active matmul weights one token meets on the most loaded PP stage: ceil(layers / pp)
    of the layers' share and the LM head (the last stage's; a tied embedding is the head),
    as `memory.weights_per_gpu_bytes` places the weights."""
    if pp <= 1:
        return model.params_matmul_active
    head = model.params_lm_head or model.params_embedding
    body = model.params_matmul_active - head
    return body * math.ceil(model.num_layers / pp) / model.num_layers + head


def attention_pairs(context: int, window: int | None, prefill: bool) -> float:
    """(query, key) pairs one layer's attention scores: decode, one query over `context`
    keys, min(context, window) for a sliding-window layer; prefill of `context` tokens,
    causal, sum over i of min(i, window) ~ context^2 / 2, or window x context - window^2 / 2
    once the prompt outgrows the window."""
    w = context if window is None else min(window, context)
    if not prefill:
        return w
    return context * context / 2 if w == context else w * context - w * w / 2


def attention_flops(model: ModelSpec, context: int, prefill: bool = False, pp: int = 1) -> float:
    """Attention FLOPs of one sequence on the most loaded PP stage: QK^T and AV, each
    2 x head_dim per (query, key) pair per query head (`attention_pairs`), full layers over
    every key, sliding-window layers over at most `sliding_window` of them."""
    full, swa = stage_layers(model, pp)
    per_pair = 4 * model.num_attention_heads * model.head_dim
    pairs = full * attention_pairs(context, None, prefill)
    if swa:
        pairs += swa * attention_pairs(context, model.sliding_window, prefill)
    return per_pair * pairs


def tp_allreduces(model: ModelSpec, pp: int = 1) -> tuple[tuple[int, int, int], ...]:
    """The all-reduces a forward pass runs under tensor parallelism, as (calls, elements a
    token, bytes an element): Megatron-LM's two a layer on the hidden state, in 16 bits
    (after the attention output and the MLP or MoE down projection); a model whose q/k
    RMSNorm spans all heads adds one a layer of two fp32 numbers a token (vLLM's
    `MiniMaxText01RMSNormTP.forward_qk` in vllm/model_executor/layers/mamba/linear_attn.py,
    which models/minimax_m2.py's attention calls, sums each token's q and k variance
    across the ranks). `pp`: the most loaded stage's, ceil(layers / pp) layers."""
    layers = math.ceil(model.num_layers / pp)
    megatron = (2 * layers, model.hidden_size, 2)
    if not model.qk_norm_across_heads:
        return (megatron,)
    return (megatron, (layers, 2, 4))


def comm_s(model: ModelSpec, hw: HardwareSpec, tp: int, tokens: int, pp: int = 1) -> float:
    """Seconds of a `tokens`-token forward pass's all-reduces (`tp_allreduces`) on one PP
    stage (`pp` 1: the whole model), each a ring all-reduce (`allreduce_s`)."""
    calls = tp_allreduces(model, pp)
    return sum(n * allreduce_s(hw, tp, tokens, w, b) for n, w, b in calls)


def allreduce_s(hw: HardwareSpec, tp: int, tokens: int, hidden: int, act_bytes: int = 2) -> float:
    """Ring all-reduce of a tokens x hidden activation across tp GPUs, over the links a
    group of tp reaches its peers by (`HardwareSpec.allreduce_gbs`: on MI300X's mesh one
    64 GB/s link at TP 2, all seven at TP 8)."""
    if tp <= 1:
        return 0.0
    gbs = hw.allreduce_gbs(tp)
    link = gbs * 1e9 if gbs > 0 else 16e9
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
    pp: int = 1,
    weight_format: WeightFormat | None = None,
) -> StepCost:
    """Lower bound of one decode step (batch sequences, each `context` tokens deep) on one
    GPU of the most loaded PP stage: `weights_per_gpu` and `kv_bytes_per_token` are that
    GPU's (for a sliding-window model, pass the per-token average at `context`:
    `kv.effective_kv_bytes_per_token`). `weight_format`: MoE experts' bytes read apart
    (`weight_bytes_read`)."""
    weights = weight_bytes_read(model, weights_per_gpu, batch, weight_format, tp, pp)
    memory = weights + batch * context * kv_bytes_per_token
    attn = attention_flops(model, context, prefill=False, pp=pp)
    flops = batch * (2 * stage_matmul_params(model, pp) + attn) / tp
    return _step(model, hw, memory, flops, compute_dtype, tp, tokens=batch, pp=pp)


def prefill_time(
    model: ModelSpec,
    hw: HardwareSpec,
    weights_per_gpu: float,
    kv_bytes_per_token: float,
    prompt_tokens: int,
    compute_dtype: str,
    tp: int = 1,
    pp: int = 1,
) -> StepCost:
    """Lower bound of prefilling one prompt (the TTFT floor with no queueing) on the most
    loaded PP stage (`decode_step` says what the per-GPU inputs are)."""
    memory = weights_per_gpu + prompt_tokens * kv_bytes_per_token
    attn = attention_flops(model, prompt_tokens, prefill=True, pp=pp)
    flops = (prompt_tokens * 2 * stage_matmul_params(model, pp) + attn) / tp
    return _step(model, hw, memory, flops, compute_dtype, tp, tokens=prompt_tokens, pp=pp)


def _step(
    model: ModelSpec,
    hw: HardwareSpec,
    memory_bytes: float,
    flops: float,
    compute_dtype: str,
    tp: int,
    tokens: int,
    pp: int = 1,
) -> StepCost:
    """Bytes and FLOPs -> times, plus the stage's all-reduces (`tp_allreduces`)."""
    return StepCost(
        memory_s=memory_bytes / hw.bandwidth_bytes_s,
        compute_s=flops / hw.peak_flops(compute_dtype),
        comm_s=comm_s(model, hw, tp, tokens, pp),
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
    pp: int = 1,
    weight_format: WeightFormat | None = None,
) -> int | None:
    """Smallest batch at which a decode step turns compute-bound: where seed 000 §3.1's
    saturation region starts. None if it stays memory-bound up to `limit` (long contexts:
    KV reads grow with the batch as fast as FLOPs do)."""

    def compute_bound(b: int) -> bool:
        step = decode_step(
            model,
            hw,
            weights_per_gpu,
            kv_bytes_per_token,
            b,
            context,
            compute_dtype,
            tp,
            pp=pp,
            weight_format=weight_format,
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
    pp: int = 1,
    weight_format: WeightFormat | None = None,
) -> list[tuple[int, float, float]]:
    """(batch, step ms, output tok/s ceiling) at batch 1, 2, 4, ... up to max_batch, for
    one stage (the planner multiplies by pp)."""
    points = []
    batches = [2**i for i in range(int(math.log2(max(max_batch, 1))) + 1)]
    if batches[-1] != max_batch and max_batch > 0:
        batches.append(max_batch)
    for b in batches:
        step = decode_step(
            model,
            hw,
            weights_per_gpu,
            kv_bytes_per_token,
            b,
            context,
            compute_dtype,
            tp,
            pp=pp,
            weight_format=weight_format,
        )
        points.append((b, step.time_s * 1e3, b / step.time_s))
    return points
