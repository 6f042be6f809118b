"""Per-GPU memory budget: weights + KV cache + activation peak + fixed overheads
(seed 000 §1 and §2.3: memory = weights + KV cache + activations + framework overhead).

The KV pool follows vLLM's sizing (seed 003 §4, FIELD-NOTES "get KV block count right
first"): pool = gpu_memory_utilization x device memory - weights - activation peak of
the profiling prefill - the overheads the engine counts (`Overheads.total_bytes`: for
vLLM the cuBLAS workspace, CUDA graphs and NCCL buffers; the CUDA context sits in the
headroom). An explicit KV size (`kv_cache_space_gib`, as vLLM-CPU's VLLM_CPU_KVCACHE_SPACE
or TensorRT-LLM's max_tokens sizing) replaces that subtraction. `plan` and `simulate` both
take the pool from `memory_budget` (through `plan.planner.evaluate`).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from servetune.engines.config import EngineConfig
from servetune.engines.extra import extra_given, extra_number
from servetune.errors import InputError
from servetune.hardware.spec import MAX_MEMORY_GIB, HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.plan import kv as kvmath
from servetune.plan.quant import (
    WeightFormat,
    format_source,
    kv_dtype_bytes,
    resolved_kv_cache_dtype,
    served_format,
    weights_bytes,
)
from servetune.plan.sglang_pool import (
    HYBRID_SWA_ARCHITECTURES,
    MAX_PREFILL_TOKENS,
    SWA_FULL_TOKENS_RATIO,
    sglang_pool,
)
from servetune.units import GiB

# How far servetune's estimate of vLLM's own GPU KV pool may sit from the pool vLLM sizes
# from its memory profile, as a share. Where it was checked: Qwen3-32B TP1 on an H100 at
# 7.99 GiB against the 8.52 GiB vLLM 0.26 logged (-6%), Llama-3.1-8B within 0.1% of a
# recent log; CUDA reports 0.41-0.53 GiB less device memory than the nvidia-smi figure
# the hardware catalog holds (docs/fidelity-gpu.md, "The KV pool: vLLM's own memory
# profile"). `plan` shows the capacity of a pool this much smaller where it would hold
# fewer sequences; `simulate` runs a point that filled its pool again on one
# (`sim.pool_doubt`).
POOL_DOUBT = 0.06


def pool_in_doubt(cfg: EngineConfig, hw: HardwareSpec) -> bool:
    """vLLM on a GPU sizing its KV pool from its own memory profile, which servetune
    estimates to within POOL_DOUBT. A pool the user fixed (`kv_cache_tokens`, vLLM's
    --num-gpu-blocks-override, or `kv_cache_space_gib`, its --kv-cache-memory-bytes) is
    known, and so is every CPU engine's (its KV space is given)."""
    given = cfg.kv_cache_tokens is not None or cfg.kv_cache_space_gib is not None
    return hw.kind == "gpu" and cfg.engine == "vllm" and not given


class Overheads(BaseModel):
    """Fixed per-GPU costs, GiB. Defaults are stated estimates, overridable with
    `servetune plan --overhead name=GiB`. Seed 000 §2.3 advises reserving 1-2 GB in all.
    Each is finite and at most MAX_MEMORY_GIB (the hardware catalog's bound on a device's
    memory): an infinite one would make every pool -inf GiB."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # CUDA context + loaded kernels: ~0.3-0.6 GiB on Ampere/Hopper (measured by
    # nvidia-smi on an idle torch process); 0.5 used.
    cuda_context_gib: float = Field(0.5, ge=0, le=MAX_MEMORY_GIB)
    # cuBLAS/cuBLASLt workspaces and torch's allocator slack.
    cublas_workspace_gib: float = Field(0.25, ge=0, le=MAX_MEMORY_GIB)
    # vLLM logs "Graph capturing finished ... took 0.5-1.5 GiB" for 7-70B models.
    cuda_graphs_gib: float = Field(0.75, ge=0, le=MAX_MEMORY_GIB)
    # NCCL communicator buffers, only when the replica spans more than one GPU.
    nccl_gib: float = Field(0.5, ge=0, le=MAX_MEMORY_GIB)

    def total_bytes(self, hw: HardwareSpec, cfg: EngineConfig) -> float:
        """What the engine subtracts from its budget besides weights and activations.

        vLLM (V1 engine) sizes the pool as gpu_memory_utilization x total minus what grew
        after its start-up snapshot: weights, the profiling pass's torch peak (activations,
        cuBLAS workspace), the non-torch increase (NCCL and custom all-reduce buffers) and,
        in current releases, the CUDA graphs' estimate (0.8-0.11 captured them after
        allocating the pool, outside the budget). The CUDA context predates the snapshot,
        so it sits in the (1 - utilization) headroom (vllm/v1/worker/gpu_worker.py
        `determine_available_memory`, vllm/utils `memory_profiling`). An explicit KV size
        leaves no headroom, and other engines count everything: every term."""
        if hw.kind == "cpu":
            return 0.0  # no device context; the host runtime's memory is outside the pool
        headroom = context_in_headroom(cfg)
        gib = self.cublas_workspace_gib + (0.0 if headroom else self.cuda_context_gib)
        if not cfg.enforce_eager:
            gib += self.cuda_graphs_gib
        if cfg.world_size > 1:
            gib += self.nccl_gib
        return gib * GiB


def check_kv_cache_space(gib: float | None, field_name: str = "kv_cache_space_gib") -> None:
    """An explicit KV pool is a size a device can hold: at most MAX_MEMORY_GIB (the hardware
    catalog's bound), so 1e300 GiB is a one-line error, not a NaN block count."""
    if gib is not None and not 0 < gib <= MAX_MEMORY_GIB:
        raise InputError(
            field_name,
            f"{gib:g} GiB is not a KV pool a device holds",
            f"give the pool per GPU in GiB, more than 0 and at most {MAX_MEMORY_GIB:g}",
        )


def context_in_headroom(cfg: EngineConfig) -> bool:
    """Whether the CUDA context is left in vLLM's (1 - utilization) headroom rather than
    taken from the pool's budget (`Overheads.total_bytes` says why)."""
    return cfg.engine == "vllm" and cfg.kv_cache_space_gib is None


def _large_defaults(hw: HardwareSpec, engine: str) -> bool:
    """vLLM's test for its larger V1 defaults: a GPU of >= 70 GiB whose device name does not
    contain "a100" (vllm/engine/arg_utils.py usage-context defaults; the A100 exclusion is
    vllm-project/vllm PR #17885, "[Perf] Use small max_num_batched_tokens for A100", merged
    2025-05-09, in v0.9.0: 2048 tokens gave Llama-3.1-70B TP2 on A100 +36% token throughput
    over 8192; vLLM's tests/engine/test_arg_utils.py `test_defaults_with_usage_context`
    asserts the same rule: 8192 / 1024 for the server on >= 70 GiB non-A100 GPUs, else
    2048 / 256).

    Other engines take the same defaults for their profiling pass as before, without the
    A100 rule (it is vLLM's)."""
    named = f"{hw.name} {hw.display_name}".lower()
    a100 = engine == "vllm" and "a100" in named
    return hw.kind == "gpu" and hw.memory_gib >= 70 and not a100


def default_batched_tokens(hw: HardwareSpec, engine: str = "vllm") -> int:
    """vLLM v1 OpenAI-server default for max_num_batched_tokens: 8192 on devices with
    >= 70 GiB other than A100s, else 2048 (vLLM EngineArgs usage-context defaults, 0.9+)."""
    return 8192 if _large_defaults(hw, engine) else 2048


def default_max_num_seqs(hw: HardwareSpec, engine: str = "vllm") -> int:
    """vLLM v1 OpenAI-server default for max_num_seqs: 1024 on >= 70 GiB devices other than
    A100s, else 256 (same rule)."""
    return 1024 if _large_defaults(hw, engine) else 256


def activation_peak_bytes(
    model: ModelSpec, cfg: EngineConfig, batched_tokens: int, max_seqs: int
) -> float:
    """Peak activation memory of the profiling forward pass vLLM runs before sizing KV:
    one prefill of `max_num_batched_tokens` tokens.

    Estimate: per token, the live tensors of one layer at the widest point - the residual
    and normed hidden states (2 x hidden), the QKV output, and the gated MLP's gate+up
    output (2 x intermediate), sharded by TP - in 16-bit, plus fp32 logits for the
    sampled positions (one per sequence, max_num_seqs x vocab x 4 B).

    Under pipeline parallelism this is the most loaded stage's peak, not a 1/pp share:
    every stage pushes all `max_num_batched_tokens` through its layers (the per-token term
    is one layer's, whichever stage), and the last stage, which holds the LM head (and is
    the most loaded stage in `weights_per_gpu_bytes`), also holds the logits."""
    tp = cfg.tensor_parallel_size
    if model.moe is not None:
        inter = model.moe.experts_per_token * model.moe.expert_intermediate_size
        inter += model.moe.num_shared_experts * model.moe.shared_expert_intermediate_size
    else:
        inter = model.intermediate_size
    qkv = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    per_token = 2 * model.hidden_size + (qkv + 2 * inter) / tp
    logits = min(max_seqs, batched_tokens) * model.vocab_size * 4
    return batched_tokens * per_token * 2 + logits


def replicated_bytes(model: ModelSpec, fmt: WeightFormat) -> float:
    """Block weights vLLM keeps whole on every TP rank, all layers: MLA's down-projections
    (ModelSpec.params_attention_replicated, at the format's attention rate) and the MoE
    routers (`gate = ReplicatedLinear(hidden, n_experts, quant_config=None)` in
    vllm/model_executor/models/deepseek_v2.py, mixtral.py, qwen3_moe.py; GPT-OSS's router
    is a plain torch.nn.Linear), at the rate `weights_bytes` gives them."""
    attention_bits = fmt.class_bits.get("attention", fmt.body_bits)
    mla = model.params_attention_replicated * attention_bits
    return (mla + model.params_classes.router * fmt.body_bits) / 8


def weights_per_gpu_bytes(model: ModelSpec, fmt: WeightFormat, tp: int, pp: int) -> float:
    """Weights on the most loaded GPU: TP shards every matrix (vocab-parallel embedding
    and LM head too) except the replicated ones (`replicated_bytes`), which every rank
    holds whole; PP splits layers, the first stage also holds the embedding and the last
    the LM head (Megatron-LM / vLLM layout)."""
    total = weights_bytes(model, fmt)
    embed_bits = fmt.lm_head_bits if model.params_lm_head == 0 else fmt.embedding_bits
    embed = model.params_embedding * embed_bits / 8
    head = model.params_lm_head * fmt.lm_head_bits / 8
    body = total - embed - head
    # a TP shard of the replicated matrices is counted in total / tp; the rest of them too
    whole = replicated_bytes(model, fmt) * (1 - 1 / tp)
    if pp == 1:
        return total / tp + whole
    # A tied embedding is needed on both the first and the last stage.
    edge = max(embed, head) if model.params_lm_head else embed
    share = math.ceil(model.num_layers / pp) / model.num_layers
    return (body * share + edge) / tp + whole * share


class MemoryBudget(BaseModel):
    """One GPU's memory, term by term (bytes), and the KV pool it leaves."""

    device_bytes: float
    usable_bytes: float  # gpu_memory_utilization x device (or device, with an explicit pool)
    weights_bytes: float  # on this GPU
    weights_total_bytes: float  # whole model
    activation_bytes: float
    overhead_bytes: float
    kv_pool_bytes: float
    kv_bytes_per_token: int  # all layers on this GPU, every layer in full
    kv_effective_bytes_per_token: float  # at max_model_len (sliding windows capped)
    kv_dtype_bytes: int
    weight_format: str
    weight_format_note: str
    weight_format_source: str  # "quantization" (asked for), "checkpoint" or "dtype"
    max_num_batched_tokens: int
    max_num_seqs: int
    explicit_kv_pool: bool
    # vLLM sizing its own pool: the CUDA context, which must fit the (1 - utilization)
    # headroom (`memory_budget`); 0 where the budget holds it or there is none
    headroom_context_bytes: float = 0.0
    # the share of memory the engine sizes with: vLLM's gpu_memory_utilization, SGLang's
    # mem_fraction_static (given or its own default); None with an explicit pool
    memory_fraction: float | None = None
    # SGLang: the tokens its pool holds as SGLang counts them (`sglang_pool`, its
    # max_total_num_tokens), which its max_running_requests default is derived from; the
    # planner's capacity is this number. None: capacity is the pool over the bytes a token
    # takes (`planner.evaluate`).
    kv_pool_tokens: int | None = None
    # SGLang, a hybrid sliding-window model: its window layers' own pool (`sglang_pool`),
    # freed as tokens slide out of each window; None: one pool
    kv_window_pool_tokens: int | None = None

    @property
    def free_after_load_bytes(self) -> float:
        """Device memory left once weights, the profiling pass's activation peak and the
        fixed overheads are claimed: what TensorRT-LLM's KV fraction is a fraction of."""
        return self.device_bytes - (
            self.weights_bytes + self.activation_bytes + self.overhead_bytes
        )

    @property
    def free_after_kv_bytes(self) -> float:
        return self.free_after_load_bytes - self.kv_pool_bytes


def memory_budget(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    max_model_len: int,
    overheads: Overheads | None = None,
    given_knobs: frozenset[str] | None = None,
) -> MemoryBudget:
    """The per-GPU budget for one replica (TP x PP GPUs) of `model` under `cfg`.

    `given_knobs`: the EngineConfig knobs the user set (`plan` knows; None: unknown, and
    SGLang reads the canonical 0.9 and 16 as "not given", `sglang_pool`)."""
    overheads = overheads or Overheads()
    check_kv_cache_space(cfg.kv_cache_space_gib)
    fmt = served_format(cfg.dtype, cfg.quantization, model, hw)
    kv_bytes = kv_dtype_bytes(resolved_kv_cache_dtype(cfg.kv_cache_dtype, model, cfg.engine), fmt)
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    batched = cfg.max_num_batched_tokens or default_batched_tokens(hw, cfg.engine)
    seqs = cfg.max_num_seqs or default_max_num_seqs(hw, cfg.engine)
    weights = weights_per_gpu_bytes(model, fmt, tp, pp)
    activation = activation_peak_bytes(model, cfg, batched, seqs)  # the worst stage's
    overhead = overheads.total_bytes(hw, cfg)
    # vLLM's budget is gpu_memory_utilization x torch.cuda.mem_get_info()[1] (vllm/v1/worker/
    # gpu_worker.py `determine_available_memory`), CUDA's total, not nvidia-smi's
    device = float(hw.memory_bytes)
    headroom_context = 0.0
    pool_tokens: int | None = None
    window_tokens: int | None = None
    fraction: float | None = cfg.gpu_memory_utilization
    if cfg.kv_cache_space_gib is not None:
        usable = device
        pool = cfg.kv_cache_space_gib * GiB
        fraction = None
    elif cfg.engine == "sglang" and hw.kind == "gpu":
        # SGLang sizes by --mem-fraction-static (plan.sglang_pool); its 1 - f share is the
        # activation term, the CUDA context and NCCL taken before it measures the overhead.
        overhead = overheads.cuda_context_gib * GiB
        overhead += overheads.nccl_gib * GiB if cfg.world_size > 1 else 0.0
        per_token = kvmath.kv_bytes_per_token(model, kv_bytes, tp, pp)
        hybrid = (
            model.architecture in HYBRID_SWA_ARCHITECTURES
            and model.sliding_window_layers > 0
            and not extra_given(cfg.extra_args, "--disable-hybrid-swa-memory")
        )
        sg = sglang_pool(
            hw,
            cfg,
            weights,
            per_token,
            max_model_len,
            overhead,
            given_knobs,
            hybrid_swa=kvmath.stage_layers(model, pp) if hybrid else None,
            swa_ratio=extra_number(
                cfg.extra_args, "--swa-full-tokens-ratio", SWA_FULL_TOKENS_RATIO
            ),
        )
        usable, pool, activation = sg.usable_bytes, sg.kv_pool_bytes, sg.reserved_bytes
        batched, seqs = sg.chunked_prefill_size or MAX_PREFILL_TOKENS, sg.max_running_requests
        fraction, pool_tokens = sg.mem_fraction_static, sg.pool_tokens
        window_tokens = sg.window_pool_tokens or None
    else:
        usable = cfg.gpu_memory_utilization * device
        pool = usable - weights - activation - overhead
        if hw.kind == "gpu" and context_in_headroom(cfg):
            headroom_context = overheads.cuda_context_gib * GiB
    return MemoryBudget(
        device_bytes=device,
        usable_bytes=usable,
        weights_bytes=weights,
        weights_total_bytes=weights_bytes(model, fmt),
        activation_bytes=activation,
        overhead_bytes=overhead,
        kv_pool_bytes=pool,  # negative when the fixed terms already overflow
        kv_bytes_per_token=kvmath.kv_bytes_per_token(model, kv_bytes, tp, pp),
        kv_effective_bytes_per_token=kvmath.effective_kv_bytes_per_token(
            model, kv_bytes, max_model_len, tp, pp
        ),
        kv_dtype_bytes=kv_bytes,
        weight_format=fmt.name,
        weight_format_note=fmt.note,
        weight_format_source=format_source(cfg.quantization, model),
        max_num_batched_tokens=batched,
        max_num_seqs=seqs,
        explicit_kv_pool=cfg.kv_cache_space_gib is not None,
        headroom_context_bytes=headroom_context,
        memory_fraction=fraction,
        kv_pool_tokens=pool_tokens,
        kv_window_pool_tokens=window_tokens,
    )
