"""What an engine refuses at start-up that EngineConfig alone cannot tell: rules that
depend on the device or on the model. Checked where a config meets them (the vLLM adapter,
the simulator's setup, the planner), so a config the engine would refuse is one line and
exit 2 instead of a run that silently predicts or measures something else.
"""

from __future__ import annotations

from collections.abc import Collection

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.model.quantization import names_checkpoint_method, shipped_method
from servetune.model.spec import ModelSpec

# Engines that shard attention heads over tensor-parallel ranks (llama.cpp has no TP).
TP_ENGINES = ("vllm", "sglang", "tgi", "trtllm")


# vLLM's CacheConfig.block_size type (vllm/config/cache.py `BlockSize = Literal[1, 8, 16,
# 32, 64, 128, 256]`): `--block-size` takes these values and no other.
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


def block_multiple(engine: str, device: str) -> int | None:
    """The multiple vLLM's attention kernels need of block_size: 16 on GPU (FlashAttention,
    `get_supported_kernel_block_sizes` -> MultipleOf(16) in v1/attention/backends/
    flash_attn.py), 32 on CPU (cpu_attn.py: MultipleOf(32)). None: no paged-block rule."""
    if engine != "vllm":
        return None
    return 32 if device == "cpu" else 16


def vllm_block_sizes(device: str) -> list[int]:
    """The block sizes vLLM starts with on `device`: one of its BlockSize values
    (VLLM_BLOCK_SIZES) that its kernels also take (`block_multiple`)."""
    multiple = block_multiple("vllm", device) or 1
    return [b for b in VLLM_BLOCK_SIZES if b % multiple == 0]


def check_block_size(cfg: EngineConfig, device: str) -> None:
    """InputError when the engine cannot run `cfg.block_size`: vLLM takes only its
    BlockSize values (VLLM_BLOCK_SIZES: 48 or 512 fail its argument parser), and of those
    the ones its kernels run (`block_multiple`). On CPU, 16 is EngineConfig's default and
    means "vLLM CPU's own default (128)" (engines.vllm)."""
    multiple = block_multiple(cfg.engine, device)
    if multiple is None:
        return
    if device == "cpu" and cfg.block_size == 16:
        return
    sizes = vllm_block_sizes(device)
    if cfg.block_size in sizes:
        return
    needs = "vLLM's CPU backend needs" if device == "cpu" else "vLLM's GPU kernels need"
    problem = (
        f"{cfg.block_size} is not a multiple of {multiple}, which {needs}"
        if cfg.block_size % multiple
        else f"{cfg.block_size} is not one of vLLM's block sizes "
        f"({', '.join(map(str, VLLM_BLOCK_SIZES))}: vllm/config/cache.py BlockSize)"
    )
    raise InputError("block_size", problem, f"use one of {', '.join(map(str, sizes))}")


def tp_splits_heads(tp: int, attention_heads: int, kv_heads: int | None = None) -> bool:
    """Whether `tp` ranks can split the model's heads as vLLM does: each rank holds
    heads / TP query heads (config/model.py, verify_with_parallel_config: "Total number of
    attention heads ... must be divisible by tensor parallel size"), and KV heads / TP of
    the KV heads, or one KV head copied to TP / KV-heads ranks when there are fewer of them
    than ranks (QKVParallelLinear: `divide(total_num_kv_heads, tp_size)` or
    `divide(tp_size, total_num_kv_heads)`, which fails at load otherwise)."""
    if attention_heads % tp:
        return False
    if kv_heads is None:
        return True
    return kv_heads % tp == 0 if tp < kv_heads else tp % kv_heads == 0


def check_tensor_parallel(
    cfg: EngineConfig, attention_heads: int, kv_heads: int | None = None
) -> None:
    """InputError when TP cannot split the model's heads (`tp_splits_heads`), which vLLM
    refuses at start-up."""
    tp = cfg.tensor_parallel_size
    if cfg.engine not in TP_ENGINES or tp_splits_heads(tp, attention_heads, kv_heads):
        return
    fits = [t for t in range(1, 17) if tp_splits_heads(t, attention_heads, kv_heads)]
    problem = (
        f"{tp} does not divide the model's {attention_heads} attention heads"
        if attention_heads % tp
        else f"{tp} neither divides the model's {kv_heads} KV heads nor is a multiple of them"
    )
    raise InputError("tensor_parallel_size", problem, f"use one of {', '.join(map(str, fits))}")


def check_pipeline_parallel(cfg: EngineConfig, layers: int) -> None:
    """InputError when there are more pipeline stages than decoder layers: each stage holds
    at least one (vLLM's `get_pp_indices` splits the layers over the stages)."""
    pp = cfg.pipeline_parallel_size
    if pp > layers:
        raise InputError(
            "pipeline_parallel_size",
            f"{pp} stages for the model's {layers} layers",
            f"use at most {layers}",
        )


def check_batch_limits(
    cfg: EngineConfig, seqs: int, batched: int, given: Collection[str] | None = None
) -> None:
    """InputError when vLLM's token budget per step is below its sequence cap, which its
    SchedulerConfig refuses at start-up. `seqs` and `batched` are the values in force;
    the knob named is the one the user set (`given`; by default the ones `cfg` sets)."""
    if cfg.engine != "vllm" or batched >= seqs:
        return
    knobs = ("max_num_seqs", "max_num_batched_tokens")
    given = {k for k in knobs if getattr(cfg, k) is not None} if given is None else set(given)
    if "max_num_seqs" in given and "max_num_batched_tokens" not in given:
        raise InputError(
            "max_num_seqs",
            f"{seqs:,} is above max_num_batched_tokens {batched:,}",
            f"use at most {batched:,}, or raise max_num_batched_tokens with it",
        )
    raise InputError(
        "max_num_batched_tokens",
        f"{batched:,} is below max_num_seqs {seqs:,}",
        "vLLM requires max_num_batched_tokens >= max_num_seqs",
    )


def check_scheduling_policy(cfg: EngineConfig) -> None:
    """InputError for `lpm` off SGLang: longest-prefix-match ordering is SGLang's
    (--schedule-policy lpm); vLLM's --scheduling-policy takes fcfs or priority."""
    if cfg.scheduling_policy == "lpm" and cfg.engine != "sglang":
        raise InputError(
            "scheduling_policy", f"lpm is SGLang's policy, not {cfg.engine}'s", "use fcfs"
        )


def check_quantization(cfg: EngineConfig, checkpoint_method: str | None) -> None:
    """InputError when vLLM or SGLang would refuse `cfg.quantization` on a checkpoint whose
    config.json ships `checkpoint_method` (`names_checkpoint_method`)."""
    asked = cfg.quantization
    if cfg.engine not in ("vllm", "sglang") or not asked or checkpoint_method is None:
        return
    if not names_checkpoint_method(asked, checkpoint_method):
        raise InputError(
            "quantization",
            f"{cfg.engine} refuses {asked} on a checkpoint whose config.json ships "
            f"{checkpoint_method}",
            "drop it to load the checkpoint as it ships, or plan the 16-bit model with it",
        )


def check_config(
    cfg: EngineConfig,
    *,
    device: str,
    attention_heads: int | None = None,
    kv_heads: int | None = None,
    checkpoint_method: str | None = None,
    layers: int | None = None,
) -> None:
    """Every start-up rule above that applies (`attention_heads`, `kv_heads`,
    `checkpoint_method`, `layers`: the model's, when known)."""
    check_block_size(cfg, device)
    check_scheduling_policy(cfg)
    check_quantization(cfg, checkpoint_method)
    if attention_heads is not None:
        check_tensor_parallel(cfg, attention_heads, kv_heads)
    if layers is not None:
        check_pipeline_parallel(cfg, layers)


def check_model_config(cfg: EngineConfig, model: ModelSpec, *, device: str) -> None:
    """`check_config` with `model`'s own facts (its query and KV heads, the method its
    checkpoint ships in): what the planner and the simulator's setup both check."""
    check_config(
        cfg,
        device=device,
        attention_heads=model.num_attention_heads,
        kv_heads=model.num_kv_heads,
        checkpoint_method=shipped_method(model),
        layers=model.num_layers,
    )
