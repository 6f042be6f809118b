"""Scenario presets -> a starting EngineConfig and the workload shape the bounds use.

Values are seed 003 §12 (scenario starting points) and §5 (batch/scheduler ranges), taking
the middle of each recommended range; the engine choice follows seed 002 §4.1.
"""

from __future__ import annotations

from dataclasses import dataclass

from servetune.errors import InputError, closest
from servetune.hardware.spec import HardwareSpec


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    first_goal: str  # seed 003 §1: what this workload optimises first
    input_tokens: int
    output_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    prefix_caching: bool = True
    chunked_prefill: bool = True
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # a weight format the scenario implies (GGUF on CPU/edge)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # §12 online chat: context 8-16K, util 0.88-0.92, seqs 16-64, batched 2048-8192.
        Scenario(
            "chat",
            "online chat, latency first",
            "TTFT, then P99 and TPOT",
            1024,
            256,
            8192,
            64,
            4096,
            0.90,
        ),
        # §12 RAG: context 16-32K, output 512-2048, batched 4096-16384, prefix cache on.
        Scenario(
            "rag",
            "retrieval-augmented QA",
            "TTFT and prefix-cache hit rate",
            4096,
            512,
            16384,
            32,
            8192,
            0.90,
        ),
        # §1 agent/code: TPOT first, long outputs (2048-8192 max_new_tokens, §3).
        Scenario(
            "code",
            "code generation / agents",
            "TPOT, then long-context stability",
            2048,
            1024,
            16384,
            32,
            4096,
            0.90,
        ),
        # §12 offline batch: seqs 128-1024, batched 16384-65536+, util 0.92-0.97.
        Scenario(
            "batch",
            "offline batch generation",
            "total tokens/s and cost per token",
            1024,
            512,
            4096,
            256,
            16384,
            0.95,
            prefix_caching=False,
        ),
        # §12 long context: 32K+, seqs 4-32, batched 4096-32768, test FP8 KV.
        Scenario(
            "long-context",
            "long documents",
            "prefill throughput and KV capacity",
            16384,
            512,
            32768,
            8,
            8192,
            0.90,
            kv_cache_dtype="fp8",
        ),
        # §12 CPU/edge: GGUF Q4_K_M/Q5_K_M, strict context, batch 128-512.
        Scenario(
            "cpu-edge",
            "CPU or edge device",
            "fits in RAM, then TPOT",
            512,
            128,
            4096,
            4,
            512,
            0.90,
            prefix_caching=True,
            quantization="q4_k_m",
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    key = name.lower()
    if key == "agent":
        key = "code"
    if key not in SCENARIOS:
        hint = ", ".join(closest(key, SCENARIOS)) or ", ".join(SCENARIOS)
        raise InputError("--scenario", f"unknown scenario {name!r}", f"try {hint}")
    return SCENARIOS[key]


def recommend_engine(hw: HardwareSpec, scenario: Scenario) -> tuple[str, str]:
    """Seed 002 §4.1: vLLM for online high-concurrency serving; TensorRT-LLM for the
    lowest latency on fixed NVIDIA deployments; llama.cpp for CPU, edge and local use."""
    if hw.kind == "cpu" or scenario.name == "cpu-edge":
        return (
            "llamacpp",
            "CPU/edge: llama.cpp with GGUF runs in RAM, CPU+GPU mixed (seed 002 §4.4)",
        )
    if hw.vendor.lower() == "amd":
        return "vllm", "AMD GPU: vLLM's ROCm build; TensorRT-LLM is NVIDIA-only"
    if scenario.name in ("rag", "code"):
        return "vllm", (
            "shared prefixes and long outputs: vLLM with prefix caching (SGLang's radix cache "
            "is the alternative); TensorRT-LLM once the model and GPU are fixed"
        )
    return "vllm", (
        "online serving with many users: PagedAttention + continuous batching (seed 002 §4.2); "
        "move to TensorRT-LLM only for a fixed model/GPU and the last bit of latency (§4.3)"
    )
