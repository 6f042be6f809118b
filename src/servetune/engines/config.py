"""EngineConfig: the canonical serving knobs, the same for every engine.

Each engine adapter (`engines/<engine>.py`) maps these to its own flags and
environment and reports knobs it has no equivalent for. Defaults follow vLLM's
(the most common reference), `None` means "leave the engine's own default".
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from servetune.errors import refuse_bool

# A release as engines print it: 0.15 or 0.15.1, with any suffix (0.16.0rc1, 0.18.0+cu129).
RELEASE_PATTERN = r"^v?\d+\.\d+(\.\d+)?([.+-]?[0-9A-Za-z]+)*$"

# The planner's engines (ENGINES: what `plan` prints a command for), then the ones servetune
# launches, benchmarks and tunes without a planner command of their own (engines.registry).
EngineName = Literal["vllm", "sglang", "tgi", "trtllm", "llamacpp", "mlx", "transformers", "onnx"]
ENGINES: tuple[str, ...] = ("vllm", "sglang", "tgi", "trtllm", "llamacpp")

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
KVDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]
# Weight formats servetune knows the size of (see plan.quant). None = unquantized dtype.
Quantization = Literal[
    "fp8", "int8", "awq", "gptq", "mxfp4", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k"
]


class EngineConfig(BaseModel):
    """Canonical engine knobs (seed 003 §2-§8 parameter tables)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    engine: EngineName = "vllm"
    dtype: Dtype = "auto"
    quantization: Quantization | None = None
    kv_cache_dtype: KVDtype = "auto"
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    data_parallel_size: PositiveInt = 1
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    # Fraction of device memory the engine may use (vLLM/SGLang); seed 003 §4.
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    # An explicit KV pool in GiB instead of a fraction (vLLM CPU's
    # VLLM_CPU_KVCACHE_SPACE, TensorRT-LLM's max_tokens sizing).
    kv_cache_space_gib: float | None = Field(None, gt=0.0)
    # An explicit KV pool in tokens (SGLang --max-total-tokens, TGI
    # --max-batch-total-tokens, TensorRT-LLM kv_cache_config.max_tokens, llama.cpp -c).
    kv_cache_tokens: PositiveInt | None = None
    block_size: PositiveInt = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    # lpm: SGLang's longest-prefix-match order (--schedule-policy lpm); SGLang only
    scheduling_policy: Literal["fcfs", "priority", "lpm"] = "fcfs"
    enforce_eager: bool = False
    # llama.cpp knobs (also meaningful for the slot scheduler in the simulator).
    parallel_slots: PositiveInt | None = None  # -np
    batch_size: PositiveInt | None = None  # -b (logical batch)
    ubatch_size: PositiveInt | None = None  # -ub (physical batch)
    threads: PositiveInt | None = None  # -t
    kv_unified: bool = False  # --kv-unified: slots share one KV buffer
    n_gpu_layers: int | None = Field(None, ge=-1)  # -ngl
    extra_args: tuple[str, ...] = ()
    # The engine release the simulator prices the CPU side of (front end, per step), e.g.
    # "0.15.1": releases differ there by tens of ms (data/gpu/kernels.yaml `releases`).
    # Not a flag: a launched engine is the installed one. None: the figures' own release.
    engine_version: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_bool(cls, data: Any) -> Any:
        return refuse_bool(cls.model_fields, data)  # `max_num_seqs: true` is not 1

    @field_validator("engine_version", mode="before")
    @classmethod
    def _release_as_text(cls, v: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool):
            # `--set engine_version=0.10` would read as the number 0.1
            raise ValueError(f"write the release with its patch number, e.g. {v}.0, not {v}")
        if isinstance(v, str) and not re.match(RELEASE_PATTERN, v):
            raise ValueError("a release such as 0.15.1 (major.minor[.patch])")
        return v

    @model_validator(mode="after")
    def _check_batching(self) -> EngineConfig:
        if (
            self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and not self.enable_chunked_prefill
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when chunked prefill is off"
            )
        return self

    @property
    def world_size(self) -> int:
        """GPUs one replica uses (TP x PP)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def with_(self, **changes: object) -> EngineConfig:
        """A validated copy with some knobs changed (the tuner's one-change-at-a-time step)."""
        return EngineConfig.model_validate({**self.model_dump(), **changes})
