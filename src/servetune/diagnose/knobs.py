"""Which knob each engine turns for one purpose, and whether the engine has a knob at all.

The rules speak of purposes (the batch cap, an 8-bit KV cache, the KV pool); an engine
names them its own way: llama.cpp caps the batch with slots (-np), keeps an 8-bit KV cache
as q8_0 (int8) and sizes its pool in tokens (-c). One map serves every rule, and every
action goes through the engine adapter's own unsupported-knob report before it is shown,
so diagnose never suggests a knob `--set` would refuse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.sim.engine import LLAMACPP_DEFAULT_BATCH, LLAMACPP_DEFAULT_SLOTS

# (lowest, highest) default over devices; None: the engine's default is not known here.
Defaults = tuple[int, int] | None


@dataclass(frozen=True)
class Knobs:
    batch: str  # the cap on requests running together
    kv8: str  # the engine's 8-bit KV cache type
    pool: str  # what sizes the KV pool: a memory fraction, or tokens
    weights8: str  # the next weight quantisation down from 16-bit
    threads: str  # what pins the engine's CPU threads
    budget: str = "max_num_batched_tokens"  # the tokens one step may take (prefill chunk)
    # The engine's own defaults for the cap and the budget, for a config that leaves them
    # unset: a "smaller" action goes below the lowest, a "bigger" one above the highest
    # (rules._smaller/_bigger), or on some device it would be no change or the wrong way.
    batch_default: Defaults = None
    budget_default: Defaults = None


# vLLM's server defaults depend on the GPU: max_num_seqs 256 / max_num_batched_tokens 2048,
# or 1024 / 8192 on a >= 70 GiB GPU other than an A100 (vllm/engine/arg_utils.py
# usage-context defaults; plan.memory.default_max_num_seqs / default_batched_tokens).
_VLLM = Knobs(
    "max_num_seqs", "fp8", "gpu_memory_utilization", "fp8", "VLLM_CPU_OMP_THREADS_BIND",
    batch_default=(256, 1024), budget_default=(2048, 8192),
)  # fmt: skip
# llama-server: -np auto resolves to 4 slots, -b (its per-step budget: the adapter maps
# batch_size first, then max_num_batched_tokens) defaults to 2048 (tools/server README,
# common/arg.cpp; sim.engine's LLAMACPP_DEFAULT_SLOTS / LLAMACPP_DEFAULT_BATCH).
_LLAMACPP = Knobs(
    "parallel_slots", "int8", "kv_cache_tokens", "q4_k_m", "threads", budget="batch_size",
    batch_default=(LLAMACPP_DEFAULT_SLOTS,) * 2, budget_default=(LLAMACPP_DEFAULT_BATCH,) * 2,
)  # fmt: skip
_KNOBS = {"vllm": _VLLM, "llamacpp": _LLAMACPP}
# SGLang, TGI, TensorRT-LLM...: vLLM's canonical names (their adapters map them); no
# threads knob of their own, so the pinning is the OS's; their defaults are not vLLM's.
_OTHER = Knobs("max_num_seqs", "fp8", "gpu_memory_utilization", "fp8", "CPU affinity (taskset)")


def knobs(engine: str | None) -> Knobs:
    """The knobs of `engine` (vLLM's names when the engine is not known)."""
    return _VLLM if engine is None else _KNOBS.get(engine, _OTHER)


def engine_has(engine: str | None, knob: str, values: tuple[Any, ...]) -> bool:
    """False when `engine`'s adapter reports `knob` unsupported at any of `values` (what
    `--set` would refuse: `LaunchSpec.why_unsupported`). Knobs outside EngineConfig (load,
    replicas, the host), values it cannot hold ("default", a hint) and unknown engines are
    not the adapter's to judge."""
    if engine is None or knob not in EngineConfig.model_fields:
        return True
    from servetune.engines.registry import adapter

    for value in values:
        try:
            cfg = EngineConfig.model_validate({"engine": engine, knob: value})
            spec = adapter(engine).build(cfg, "model.gguf")
        except (ValidationError, InputError, ValueError):
            continue
        if spec.why_unsupported(knob) is not None:
            return False
    return True
