"""ModelSpec: the architecture facts every planner, simulator and report needs.

A ModelSpec is built from a HuggingFace `config.json` (see `model.hf_config`) or
from the built-in catalog (`model.catalog`), which stores facts in the same
config.json form. Parameter counts are computed from the shapes, never typed in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

# Body tensor classes a checkpoint can quantize separately (HF module names in model.quantization).
TensorClass = Literal["attention", "mlp", "experts", "shared_experts", "lm_head"]


class MoESpec(BaseModel):
    """Mixture-of-experts shape (Mixtral, Qwen-MoE, DeepSeek, GPT-OSS)."""

    model_config = ConfigDict(frozen=True)

    num_experts: PositiveInt
    experts_per_token: PositiveInt
    expert_intermediate_size: PositiveInt
    num_shared_experts: int = Field(0, ge=0)
    shared_expert_intermediate_size: int = Field(0, ge=0)
    # DeepSeek's first_k_dense_replace: the first k layers use a dense MLP.
    first_dense_layers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _picks_at_most_all(self) -> MoESpec:
        """A token's router picks experts_per_token of the num_experts (top-k of the
        router's logits: transformers' `torch.topk(router_logits, top_k)` fails for k > E),
        so more picks than experts is a typo no engine runs; left in, the roofline's
        (1 - k/E)^batch overflows."""
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token {self.experts_per_token} is more than num_experts "
                f"{self.num_experts}: the router picks k of the E experts"
            )
        return self


class MLASpec(BaseModel):
    """Multi-head latent attention dims (DeepSeek-V2/V3)."""

    model_config = ConfigDict(frozen=True)

    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    qk_nope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    q_lora_rank: int | None = None


class ParamClasses(BaseModel):
    """Weight-matrix parameters of the transformer blocks by class, all layers.

    Formats that quantize only some tensors (MXFP4 experts, a checkpoint's `ignore`
    list) need them apart; what `params_body` holds beyond their sum is routers, norms,
    biases and attention sinks, which every format keeps at 16 bits."""

    model_config = ConfigDict(frozen=True)

    attention: int = Field(0, ge=0)  # q/k/v/o (or MLA) projection matrices
    mlp: int = Field(0, ge=0)  # dense gated-MLP matrices
    experts: int = Field(0, ge=0)  # routed-expert gate/up/down matrices
    shared_experts: int = Field(0, ge=0)  # always-on expert matrices (DeepSeek)
    router: int = Field(0, ge=0)  # expert-choice matrices


class QuantScheme(BaseModel):
    """How one group of a checkpoint's tensors is stored: values, scales, zero points.

    Facts only, as config.json's `quantization_config` states them; the bytes they
    take are computed in plan.quant."""

    model_config = ConfigDict(frozen=True)

    classes: tuple[TensorClass, ...]  # the tensors stored this way
    bits: PositiveInt  # bits per stored value
    kind: Literal["int", "float"]
    group_size: PositiveInt | None = None  # values per scale along a row; None: per row/tensor
    block: tuple[PositiveInt, PositiveInt] | None = None  # 2-D scale blocks (fp8 block-wise)
    scale_bits: int = Field(16, ge=0)  # bits of each scale
    zero_bits: int = Field(0, ge=0)  # bits of each zero point (asymmetric int formats)
    activations: Literal["fp8", "int8"] | None = None  # W8A8: activations quantized too


class CheckpointQuant(BaseModel):
    """The weight format a checkpoint ships in (config.json `quantization_config`).

    `schemes` is empty for a `quant_method` servetune has no size rule for; the planner
    then asks for `--quant`."""

    model_config = ConfigDict(frozen=True)

    method: str  # quant_method as written: fp8, mxfp4, compressed-tensors, awq, gptq, ...
    schemes: tuple[QuantScheme, ...] = ()
    summary: str = ""  # one line for plans: "FP8 e4m3, 128x128 block scales (fp32)"
    # the KV cache the checkpoint declares (ModelOpt's kv_cache_quant_algo), which vLLM's
    # --kv-cache-dtype auto follows (plan.quant.resolved_kv_cache_dtype)
    kv_cache: Literal["fp8"] | None = None


class ModelSpec(BaseModel):
    """Shapes of a decoder-only transformer, as the serving maths needs them."""

    model_config = ConfigDict(frozen=True)

    name: str
    architecture: str
    model_type: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab_size: PositiveInt
    intermediate_size: PositiveInt
    max_position_embeddings: PositiveInt
    # The context vLLM derives from config.json (`_get_and_verify_max_len`: rope_scaling's
    # factor applied, `model.hf_config.derived_max_model_len`); None: max_position_embeddings.
    derived_max_model_len: PositiveInt | None = None
    # What set `derived_max_model_len`, for messages: "rope_scaling yarn: 32768 x 4.0".
    max_model_len_origin: str = ""
    tie_word_embeddings: bool = False
    # Sliding-window attention: `sliding_window_layers` of `num_layers` keep only
    # the last `sliding_window` tokens of KV (Gemma 2/3 interleave, Mistral v0.1 all).
    sliding_window: int | None = None
    sliding_window_layers: int = Field(0, ge=0)
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # q/k RMSNorm over all heads at once (MiniMax-M2's `qk_norm_type: per_layer`), not per
    # head: under tensor parallelism each layer all-reduces the norm's variance
    # (plan.roofline.tp_allreduces).
    qk_norm_across_heads: bool = False
    torch_dtype: str = "bfloat16"
    # The checkpoint's own quantized format (config.json quantization_config), if any.
    quantization: CheckpointQuant | None = None
    # Computed from the shapes by model.params (not typed in).
    params_total: int = Field(0, ge=0)
    params_active: int = Field(0, ge=0)
    params_embedding: int = Field(0, ge=0)  # input embedding table
    params_lm_head: int = Field(0, ge=0)  # 0 when tied to the embedding
    params_classes: ParamClasses = ParamClasses()  # block matrices by class
    # Of params_classes.attention: the matrices vLLM builds as ReplicatedLinear, whole on
    # every TP rank (MLA's q_a_proj and kv_a_proj_with_mqa, model.params.
    # mla_replicated_params); the MoE router is replicated too (`plan.memory.
    # replicated_bytes` keeps both whole per rank).
    params_attention_replicated: int = Field(0, ge=0)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def context_limit(self) -> int:
        """The longest max_model_len vLLM accepts for this model (and its default):
        `derived_max_model_len`, else max_position_embeddings."""
        return self.derived_max_model_len or self.max_position_embeddings

    @property
    def context_limit_origin(self) -> str:
        """Where `context_limit` comes from, in config.json's terms."""
        if self.derived_max_model_len is None:
            return f"{self.name}'s max_position_embeddings"
        return f"{self.name}'s {self.max_model_len_origin or 'derived context'}"

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers - self.sliding_window_layers

    @property
    def params_matmul_active(self) -> int:
        """Weights that take part in a matmul per token (2 FLOPs each): the active
        parameters minus the embedding lookup (unless it doubles as the LM head)."""
        if self.params_lm_head == 0:
            return self.params_active
        return self.params_active - self.params_embedding

    @property
    def params_body(self) -> int:
        """Transformer-block parameters (everything but embedding and LM head)."""
        return self.params_total - self.params_embedding - self.params_lm_head
