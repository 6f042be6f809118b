"""Parameter counts computed from a model's shapes, never typed in.

Weights decide memory (weights in GPU memory) and the decode roofline (bytes read
per token), so they are counted term by term from the shapes, following the HF
`modeling_<family>.py` module structure. Pure functions; `Traits` carries the
per-family details (biases, extra norms) that `ModelSpec` does not store.

Conventions:
- `total` counts every weight of the decoder: embedding, blocks, final norm, LM
  head (0 extra when tied). DeepSeek's multi-token-prediction module is not part
  of the HF decoder (`num_nextn_predict_layers`) and is not counted.
- `active` is the weights one token touches: everything except the routed
  experts the router did not pick. It includes the embedding table, as the
  Mixtral and Qwen figures do (DeepSeek and OpenAI publish active counts
  without it; subtract `params_embedding` to compare).
"""

from __future__ import annotations

from dataclasses import dataclass

from servetune.model.spec import ModelSpec, ParamClasses


@dataclass(frozen=True)
class Traits:
    """Per-family weights the shapes alone do not say (from each HF modeling file)."""

    qkv_bias: bool = False  # Qwen2 q/k/v biases; Llama `attention_bias`; GPT-OSS
    o_bias: bool = False  # Llama `attention_bias` (o_proj too); GPT-OSS
    qk_norm: bool = False  # Qwen3 / Gemma 3 per-head RMSNorm on q and k (head_dim each)
    norms_per_layer: int = 2  # Gemma 2/3 add pre/post-feedforward norms: 4
    mlp_bias: bool = False  # Llama `mlp_bias`, on gate/up/down
    expert_bias: bool = False  # GPT-OSS experts: gate_up_proj_bias, down_proj_bias
    router_bias: bool = False  # GPT-OSS router: Linear(hidden, experts, bias=True)
    router_score_bias: bool = False  # DeepSeek-V3 `e_score_correction_bias` (noaux_tc)
    attention_sinks: bool = False  # GPT-OSS: one learned sink logit per query head


@dataclass(frozen=True)
class ParamCounts:
    """The counts `ModelSpec` carries."""

    total: int
    active: int
    embedding: int
    lm_head: int
    classes: ParamClasses = ParamClasses()
    attention_replicated: int = 0  # of classes.attention: whole on every TP rank in vLLM


def gated_mlp_params(hidden: int, intermediate: int, bias: bool = False) -> int:
    """SwiGLU/GeGLU MLP: gate_proj and up_proj (hidden->inter), down_proj (inter->hidden)."""
    weights = 3 * hidden * intermediate
    biases = (2 * intermediate + hidden) if bias else 0
    return weights + biases


def gqa_attention_params(spec: ModelSpec, traits: Traits) -> int:
    """q/k/v/o projections of (grouped-query) attention, one layer.

    q_proj: hidden -> heads*head_dim; k_proj, v_proj: hidden -> kv_heads*head_dim;
    o_proj: heads*head_dim -> hidden (LlamaAttention and its descendants).
    """
    q_dim = spec.num_attention_heads * spec.head_dim
    kv_dim = spec.num_kv_heads * spec.head_dim
    count = gqa_matrix_params(spec)
    if traits.qkv_bias:
        count += q_dim + 2 * kv_dim
    if traits.o_bias:
        count += spec.hidden_size
    if traits.qk_norm:
        count += 2 * spec.head_dim  # q_norm, k_norm: RMSNorm(head_dim), shared by heads
    if traits.attention_sinks:
        count += spec.num_attention_heads  # GptOssAttention.sinks
    return count


def gqa_matrix_params(spec: ModelSpec) -> int:
    """The four projection matrices of (grouped-query) attention, one layer."""
    q_dim = spec.num_attention_heads * spec.head_dim
    kv_dim = spec.num_kv_heads * spec.head_dim
    return spec.hidden_size * (q_dim + 2 * kv_dim) + q_dim * spec.hidden_size


def mla_attention_params(spec: ModelSpec) -> int:
    """Multi-head latent attention, one layer (DeepSeek-V2 paper sec. 2.1, HF DeepseekV3Attention).

    Queries: q_proj (hidden -> heads*(nope+rope)), or with q_lora_rank the low-rank
    pair q_a_proj (hidden -> q_lora) + q_a_layernorm + q_b_proj (q_lora -> heads*(nope+rope)).
    Keys/values: kv_a_proj_with_mqa (hidden -> kv_lora + rope, the rope part is the
    shared decoupled key) + kv_a_layernorm + kv_b_proj (kv_lora -> heads*(nope+v)).
    Output: o_proj (heads*v -> hidden).
    """
    mla = spec.mla
    if mla is None:
        raise ValueError("mla_attention_params needs a spec with MLA dims")
    heads, hidden = spec.num_attention_heads, spec.hidden_size
    q_out = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    if mla.q_lora_rank:
        q = hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * q_out
    else:
        q = hidden * q_out
    kv = (
        hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        + mla.kv_lora_rank
        + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    )
    o = heads * mla.v_head_dim * hidden
    return q + kv + o


def mla_replicated_params(spec: ModelSpec) -> int:
    """MLA's down-projections, one layer: q_a_proj (hidden -> q_lora, when q_lora_rank is
    set) and kv_a_proj_with_mqa (hidden -> kv_lora + rope). vLLM builds both as
    ReplicatedLinear (vllm/model_executor/models/deepseek_v2.py, DeepseekV2MLAAttention;
    fused as one MergedReplicatedLinear in later releases): every TP rank holds them
    whole. 0 for other attention."""
    mla = spec.mla
    if mla is None:
        return 0
    return spec.hidden_size * ((mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim)


def attention_params(spec: ModelSpec, traits: Traits) -> int:
    """One layer's attention block, MLA or (G)QA."""
    if spec.mla is not None:
        return mla_attention_params(spec)
    return gqa_attention_params(spec, traits)


def attention_matrix_params(spec: ModelSpec) -> int:
    """One layer's attention projection matrices: MLA's without its two low-rank
    layernorms (q_a_layernorm when q_lora_rank is set, kv_a_layernorm), GQA's without
    biases, q/k norms or sinks."""
    if spec.mla is not None:
        norms = (spec.mla.q_lora_rank or 0) + spec.mla.kv_lora_rank
        return mla_attention_params(spec) - norms
    return gqa_matrix_params(spec)


def layer_split(spec: ModelSpec) -> tuple[int, int]:
    """(dense-MLP layers, MoE layers): DeepSeek's first_k_dense_replace keeps the first k
    layers dense; every other MoE family is MoE throughout."""
    if spec.moe is None:
        return spec.num_layers, 0
    dense = min(spec.moe.first_dense_layers, spec.num_layers)
    return dense, spec.num_layers - dense


def param_classes(spec: ModelSpec) -> ParamClasses:
    """Block weight matrices by class, all layers (the shapes of `count_params`' terms,
    without their biases and norms)."""
    hidden = spec.hidden_size
    dense_layers, moe_layers = layer_split(spec)
    classes = {
        "attention": spec.num_layers * attention_matrix_params(spec),
        "mlp": dense_layers * gated_mlp_params(hidden, spec.intermediate_size),
    }
    if spec.moe is not None:
        moe = spec.moe
        expert = gated_mlp_params(hidden, moe.expert_intermediate_size)
        shared = gated_mlp_params(hidden, moe.shared_expert_intermediate_size)
        classes["experts"] = moe_layers * moe.num_experts * expert
        classes["shared_experts"] = moe_layers * moe.num_shared_experts * shared
        classes["router"] = moe_layers * hidden * moe.num_experts
    return ParamClasses(**classes)


def moe_layer_params(spec: ModelSpec, traits: Traits) -> tuple[int, int]:
    """(total, active) weights of one MoE feed-forward layer.

    Routed experts are gated MLPs of `expert_intermediate_size` (Mixtral's
    block_sparse_moe.experts, Qwen3-MoE / DeepSeek `mlp.experts`, GPT-OSS's fused
    gate_up_proj/down_proj); the router is Linear(hidden, num_experts); shared
    experts (DeepSeek, Qwen2-MoE) run for every token.
    """
    moe = spec.moe
    if moe is None:
        raise ValueError("moe_layer_params needs a spec with an MoE shape")
    hidden = spec.hidden_size
    expert = gated_mlp_params(hidden, moe.expert_intermediate_size, traits.expert_bias)
    router = hidden * moe.num_experts
    if traits.router_bias:
        router += moe.num_experts
    if traits.router_score_bias:
        router += moe.num_experts
    shared = moe.num_shared_experts * gated_mlp_params(hidden, moe.shared_expert_intermediate_size)
    total = moe.num_experts * expert + router + shared
    active = moe.experts_per_token * expert + router + shared
    return total, active


def embedding_params(spec: ModelSpec) -> int:
    """Input embedding table: vocab x hidden."""
    return spec.vocab_size * spec.hidden_size


def lm_head_params(spec: ModelSpec) -> int:
    """Output projection hidden -> vocab; 0 when tied to the embedding (Gemma, Llama 3.2)."""
    return 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size


def count_params(spec: ModelSpec, traits: Traits) -> ParamCounts:
    """Total, active, embedding and LM-head parameter counts of a decoder-only model,
    and its block matrices by class."""
    hidden, layers = spec.hidden_size, spec.num_layers
    attn = attention_params(spec, traits)
    norms = traits.norms_per_layer * hidden  # RMSNorm weight vectors, no bias
    dense_mlp = gated_mlp_params(hidden, spec.intermediate_size, traits.mlp_bias)

    dense_layers, moe_layers = layer_split(spec)
    moe_total, moe_active = moe_layer_params(spec, traits) if spec.moe else (0, 0)

    shared_per_layer = attn + norms
    body_total = layers * shared_per_layer + dense_layers * dense_mlp + moe_layers * moe_total
    body_active = layers * shared_per_layer + dense_layers * dense_mlp + moe_layers * moe_active
    final_norm = hidden
    embedding = embedding_params(spec)
    lm_head = lm_head_params(spec)
    outer = embedding + lm_head + final_norm
    return ParamCounts(
        total=body_total + outer,
        active=body_active + outer,
        embedding=embedding,
        lm_head=lm_head,
        classes=param_classes(spec),
        attention_replicated=layers * mla_replicated_params(spec),
    )
