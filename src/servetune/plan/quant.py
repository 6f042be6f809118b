"""Bytes per weight for each weight format, including scales and the tensors that
formats usually keep at higher precision.

Sources:
- 16-bit / fp8 / int8: vLLM quantizes Linear layers only; the token embedding and
  the LM head stay at 16 bits (vLLM docs, "FP8 W8A8" and "INT8 W8A8").
- AWQ / GPTQ int4, group 128: 4-bit weights + one fp16 scale and one packed 4-bit
  zero point per group of 128 => 4 + (16 + 4) / 128 bits (AWQ paper; AutoGPTQ format).
  Embedding and LM head unquantized.
- GGUF block formats (llama.cpp ggml-quants block layouts): Q8_0 = 34 B / 32 w = 8.5 bpw,
  Q6_K = 6.5625, Q5_K = 5.5, Q4_K = 4.5, Q3_K = 3.4375, Q2_K = 2.625 bpw. The "_M" mixes
  raise some tensors (attn_v, ffn_down) a level; their body rate here is derived from
  llama.cpp's published file sizes for Llama-3-8B (`llama-quantize --help`: Q4_K_M 4.58G,
  Q5_K_M 5.33G, Q3_K_M 3.74G, Q2_K 2.96G, Q6_K 6.14G, Q8_0 7.96G) after removing the
  embedding (base type) and the output tensor (Q6_K, llama.cpp's rule for K-quants).
"""

from __future__ import annotations

from dataclasses import dataclass

from servetune.model.spec import ModelSpec


@dataclass(frozen=True)
class WeightFormat:
    """Effective bits per weight for the transformer body, embedding and LM head."""

    name: str
    body_bits: float
    embedding_bits: float
    lm_head_bits: float
    compute: str  # dtype the matmuls run in (for the FLOP/s peak)
    note: str


_Q6K, _Q8 = 6.5625, 8.5

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("fp32", 32, 32, 32, "fp32", "full precision"),
        WeightFormat("bf16", 16, 16, 16, "bf16", "bfloat16"),
        WeightFormat("fp16", 16, 16, 16, "fp16", "float16"),
        WeightFormat("fp8", 8.0, 16, 16, "fp8", "FP8 W8A8, per-tensor scales; embed/head 16-bit"),
        WeightFormat("int8", 8.0, 16, 16, "int8", "INT8 W8A8, per-channel scales"),
        WeightFormat("awq", 4 + 20 / 128, 16, 16, "bf16", "AWQ int4 g128 (+fp16 scale, int4 zero)"),
        WeightFormat(
            "gptq", 4 + 20 / 128, 16, 16, "bf16", "GPTQ int4 g128 (+fp16 scale, int4 zero)"
        ),
        WeightFormat("q8_0", _Q8, _Q8, _Q8, "bf16", "GGUF Q8_0"),
        WeightFormat("q6_k", _Q6K, _Q6K, _Q6K, "bf16", "GGUF Q6_K"),
        WeightFormat("q5_k_m", 5.65, 5.5, _Q6K, "bf16", "GGUF Q5_K_M (embed Q5_K, output Q6_K)"),
        WeightFormat("q4_k_m", 4.80, 4.5, _Q6K, "bf16", "GGUF Q4_K_M (embed Q4_K, output Q6_K)"),
        WeightFormat("q3_k_m", 3.85, 3.4375, _Q6K, "bf16", "GGUF Q3_K_M (embed Q3_K, output Q6_K)"),
        WeightFormat("q2_k", 2.95, 2.625, _Q6K, "bf16", "GGUF Q2_K (embed Q2_K, output Q6_K)"),
    )
}

_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


def weight_format(dtype: str, quantization: str | None, model: ModelSpec) -> WeightFormat:
    """The format the weights are stored in: the quantization if any, else the dtype
    (`auto` = the checkpoint's torch_dtype, as vLLM does, except that vLLM serves a
    float32 checkpoint in 16 bits: bf16)."""
    if quantization:
        return WEIGHT_FORMATS[quantization]
    if dtype == "auto":
        dtype = model.torch_dtype
        if _DTYPE_ALIASES.get(dtype, dtype) == "fp32":
            dtype = "bf16"
    return WEIGHT_FORMATS[_DTYPE_ALIASES.get(dtype, dtype)]


def kv_dtype_bytes(kv_cache_dtype: str, weights: WeightFormat) -> int:
    """Bytes per KV element: fp8/int8 = 1; `auto` follows the activation dtype (2 bytes
    for every 16-bit or quantized model, 4 for fp32) as vLLM's `--kv-cache-dtype auto`."""
    if kv_cache_dtype in ("fp8", "int8"):
        return 1
    if kv_cache_dtype in ("fp16", "bf16"):
        return 2
    return 4 if weights.name == "fp32" else 2


def weights_bytes(model: ModelSpec, fmt: WeightFormat) -> float:
    """Total weight bytes: body + embedding + LM head at their own rates (seed 000 §2.1:
    parameters x bytes per parameter, made exact per tensor class)."""
    return (
        model.params_body * fmt.body_bits
        + model.params_embedding * fmt.embedding_bits
        + model.params_lm_head * fmt.lm_head_bits
    ) / 8
