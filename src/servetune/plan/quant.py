"""Bytes per weight for each weight format, including scales and the tensors that
formats usually keep at higher precision.

Sources:
- 16-bit / fp8 / int8: vLLM quantizes Linear layers only; the token embedding and
  the LM head stay at 16 bits (vLLM docs, "FP8 W8A8" and "INT8 W8A8").
- AWQ / GPTQ int4, group 128: 4-bit weights + one fp16 scale and one packed 4-bit
  zero point per group of 128 => 4 + (16 + 4) / 128 bits (AWQ paper; AutoGPTQ format).
  Embedding and LM head unquantized.
- MXFP4 (OCP Microscaling Formats (MX) v1.0): 32 FP4 e2m1 values share one E8M0 scale,
  4 + 8/32 = 4.25 bpw; vLLM's `mxfp4` method (and GPT-OSS's checkpoint) quantizes the MoE
  expert matrices only, everything else stays 16-bit.
- A checkpoint's own format (config.json `quantization_config`, see model.quantization):
  each scheme's value bits plus its scales and zero points spread over the weights that
  share them, on the tensor classes it covers; routers, norms, biases and the embedding
  stay 16-bit. DeepSeek-V3's FP8 = 8 + 32/(128 x 128) bpw (one fp32 scale per block).
- GGUF block formats (llama.cpp ggml-quants block layouts): Q8_0 = 34 B / 32 w = 8.5 bpw,
  Q6_K = 6.5625, Q5_K = 5.5, Q4_K = 4.5, Q3_K = 3.4375, Q2_K = 2.625 bpw. The "_M" mixes
  raise some tensors (attn_v, ffn_down) a level; their body rate here is derived from
  llama.cpp's published file sizes for Llama-3-8B (`llama-quantize --help`: Q4_K_M 4.58G,
  Q5_K_M 5.33G, Q3_K_M 3.74G, Q2_K 2.96G, Q6_K 6.14G, Q8_0 7.96G) after removing the
  embedding (base type) and the output tensor (Q6_K, llama.cpp's rule for K-quants).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.model.quantization import (
    MXFP4,
    names_checkpoint_method,
    shipped_method,
    supported_methods,
)
from servetune.model.spec import ModelSpec, QuantScheme

# llama.cpp K-quants pack rows in super-blocks of 256 weights; a tensor whose rows are not
# a multiple of 256 falls back to a legacy type (llama-quant.cpp): Q2_K/Q3_K -> IQ4_NL
# (4.5 bpw), Q4_K -> Q5_0 (5.5), Q5_K -> Q5_1 (6.0), Q6_K -> Q8_0 (8.5).
QK_K = 256
GGUF_TYPES = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k")  # llama.cpp's files
K_QUANT_FALLBACK_BITS = {"q2_k": 4.5, "q3_k_m": 4.5, "q4_k_m": 5.5, "q5_k_m": 6.0, "q6_k": 8.5}


@dataclass(frozen=True)
class WeightFormat:
    """Effective bits per weight for the transformer body, embedding and LM head.

    `class_bits` gives some body tensor classes (ModelSpec.params_classes) their own
    rate; the rest of the body is at `body_bits`."""

    name: str
    body_bits: float
    embedding_bits: float
    lm_head_bits: float
    compute: str  # dtype the matmuls run in (for the FLOP/s peak)
    note: str
    class_bits: dict[str, float] = field(default_factory=dict, hash=False)
    # W8A8 FP8 with one scale per weight block (DeepSeek-V3, Qwen3-*-FP8): vLLM runs its
    # block-scaled GEMMs, slower at small batches than the per-tensor ones (sim.gpu_step)
    block_scaled: bool = False


def scheme_bits(scheme: QuantScheme) -> float:
    """Stored bits per weight: the value, plus each scale and zero point spread over the
    weights that share it (a `group_size` run of a row, or a `block` tile)."""
    shared = scheme.block[0] * scheme.block[1] if scheme.block else scheme.group_size
    extra = (scheme.scale_bits + scheme.zero_bits) / shared if shared else 0.0
    return scheme.bits + extra


def scheme_format(name: str, schemes: Iterable[QuantScheme], note: str) -> WeightFormat:
    """A format that stores the classes `schemes` cover at their rates and leaves the rest
    (embedding, routers, norms, biases, uncovered matrices) in 16 bits. Matmuls run in
    the schemes' activation type for W8A8 formats, else in 16-bit (weight-only formats
    dequantize on the fly)."""
    schemes = list(schemes)
    class_bits = {c: scheme_bits(s) for s in schemes for c in s.classes}
    head_bits = class_bits.pop("lm_head", 16.0)
    compute = next((s.activations for s in schemes if s.activations), "bf16")
    block = any(s.block and s.activations == "fp8" for s in schemes)
    return WeightFormat(
        name, 16, 16, head_bits, compute, note, class_bits=class_bits, block_scaled=block
    )


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
        scheme_format("mxfp4", [MXFP4], "MXFP4 MoE experts 4.25 bpw (OCP MX v1.0), rest 16-bit"),
        WeightFormat("q8_0", _Q8, _Q8, _Q8, "bf16", "GGUF Q8_0"),
        WeightFormat("q6_k", _Q6K, _Q6K, _Q6K, "bf16", "GGUF Q6_K"),
        WeightFormat("q5_k_m", 5.65, 5.5, _Q6K, "bf16", "GGUF Q5_K_M (embed Q5_K, output Q6_K)"),
        WeightFormat("q4_k_m", 4.80, 4.5, _Q6K, "bf16", "GGUF Q4_K_M (embed Q4_K, output Q6_K)"),
        WeightFormat("q3_k_m", 3.85, 3.4375, _Q6K, "bf16", "GGUF Q3_K_M (embed Q3_K, output Q6_K)"),
        WeightFormat("q2_k", 2.95, 2.625, _Q6K, "bf16", "GGUF Q2_K (embed Q2_K, output Q6_K)"),
    )
}

_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


def format_source(quantization: str | None, model: ModelSpec) -> str:
    """Where `weight_format`'s answer comes from: "quantization" (asked for), "checkpoint"
    (config.json's quantization_config) or "dtype"."""
    if quantization and not loads_as_shipped(quantization, model):
        return "quantization"
    return "checkpoint" if model.quantization is not None else "dtype"


def weight_format(dtype: str, quantization: str | None, model: ModelSpec) -> WeightFormat:
    """The format the weights are stored in: the quantization asked for (--quant or a
    scenario) if any, else the checkpoint's own (an engine loads a quantized checkpoint
    as it ships), else the dtype (`auto` = the checkpoint's torch_dtype, as vLLM does,
    except that vLLM serves a float32 checkpoint in 16 bits: bf16)."""
    if quantization and not loads_as_shipped(quantization, model):
        return _applicable(WEIGHT_FORMATS[quantization], model)
    if model.quantization is not None:
        return checkpoint_format(model)
    if dtype == "auto":
        dtype = model.torch_dtype
        if _DTYPE_ALIASES.get(dtype, dtype) == "fp32":
            dtype = "bf16"
    fmt = WEIGHT_FORMATS.get(_DTYPE_ALIASES.get(dtype, dtype))
    if fmt is None:  # a config.json's torch_dtype: an explicit dtype is checked where given
        raise InputError(
            f"{model.name}: torch_dtype",
            f"{dtype!r} is not a dtype servetune can size (known: {', '.join(_DTYPE_ALIASES)})",
            "override it with --dtype bfloat16, or simulate's --set dtype=bfloat16",
        )
    return fmt


# vLLM's FP8 rule (vllm/model_executor/layers/quantization/fp8.py): Fp8Config's
# get_min_capability() is 80, so below compute capability 8.0 vLLM refuses the method at
# start-up ("not supported for the current GPU. Minimum capability: 80"); Fp8LinearMethod
# sets use_marlin when the device lacks capability 89, running FP8 weights weight-only
# (Marlin W8A16: dequantized to 16 bits before 16-bit matmuls).
FP8_MIN_CAPABILITY = 8.0
FP8_W8A8_CAPABILITY = 8.9


@dataclass(frozen=True)
class MethodRule:
    """What vLLM's QuantizationConfig for one method demands of the GPU at start-up:
    `get_min_capability()` (compute capability x 10 there) and `get_supported_act_dtypes()`.
    vLLM checks both when it builds the config (`_get_quantization_config`: "The
    quantization method X is not supported for the current GPU. Minimum capability: N",
    "<dtype> is not supported for quantization method X. Supported dtypes: [...]")."""

    min_capability: float
    act_dtypes: tuple[str, ...]  # servetune's dtype names (bf16, fp16)
    config: str  # vLLM's class and file, vllm/model_executor/layers/quantization/<file>
    # vLLM quantizes a 16-bit checkpoint to this method at load (`--quantization fp8`:
    # Fp8Config with is_checkpoint_fp8_serialized False quantizes the weights in
    # Fp8LinearMethod.process_weights_after_loading); False: its create_weights allocates
    # the packed weights and scales a checkpoint in that method ships (AWQ/GPTQ qweight,
    # qzeros, scales; MXFP4's uint8 experts), so only such a checkpoint loads
    quantizes_at_load: bool = False

    @property
    def source(self) -> str:
        return f"{self.config}.get_min_capability() = {round(self.min_capability * 10)}"


VLLM_METHOD_RULES: dict[str, MethodRule] = {
    "fp8": MethodRule(8.0, ("bf16", "fp16"), "fp8.py Fp8Config", quantizes_at_load=True),
    "modelopt": MethodRule(8.9, ("bf16", "fp16"), "modelopt.py ModelOptFp8Config"),
    "mxfp4": MethodRule(8.0, ("bf16",), "mxfp4.py Mxfp4Config"),
    "awq": MethodRule(7.5, ("fp16",), "awq.py AWQConfig"),
    "gptq": MethodRule(6.0, ("fp16",), "gptq.py GPTQConfig"),
}
# The engines whose start-up applies VLLM_METHOD_RULES: vLLM, and SGLang, whose
# QuantizationConfig classes carry the same get_min_capability / get_supported_act_dtypes.
RULE_ENGINES = ("vllm", "sglang")
# The formats a 16-bit model can be planned in to save memory, in the order offered.
QUANTIZE_CHOICES = ("fp8", "awq", "gptq")


def method_runs_on(method: str, hw: HardwareSpec) -> bool:
    """Whether vLLM starts `method` on `hw` (VLLM_METHOD_RULES' minimum capability). No
    recorded capability (AMD, CPU hosts): fp8 where the device lists FP8 matmuls (the
    hardware catalog's tflops), the others unchecked."""
    rule = VLLM_METHOD_RULES.get(method)
    cc = hw.compute_capability
    if rule is None:
        return True
    if cc is None:
        return method != "fp8" or "fp8" in hw.tflops
    return cc >= rule.min_capability


def needs_prequantized(method: str | None, model: ModelSpec) -> bool:
    """Whether `method` asked of `model` needs a checkpoint already quantized in it: vLLM
    quantizes only to fp8 at load (MethodRule.quantizes_at_load), so AWQ, GPTQ or MXFP4
    on a 16-bit checkpoint start no engine (their kernels read packed weights and scales
    the 16-bit release does not have)."""
    if not method or loads_as_shipped(method, model) or model.quantization is not None:
        return False
    rule = VLLM_METHOD_RULES.get(method)
    return rule is not None and not rule.quantizes_at_load


def quantize_choice(hw: HardwareSpec) -> str | None:
    """The format to offer a 16-bit model that does not fit: fp8 where vLLM runs it (W8A8
    from capability 8.9, Marlin W8A16 on 8.0-8.8 such as the A100), else the first
    pre-quantized format the GPU runs (T4: awq; V100: gptq); None if none does."""
    return next((m for m in QUANTIZE_CHOICES if method_runs_on(m, hw)), None)


def on_hardware(fmt: WeightFormat, hw: HardwareSpec) -> WeightFormat:
    """`fmt` as vLLM runs it on `hw`: FP8 weights on compute capability 8.0-8.8 run
    weight-only (16-bit matmuls, FP8_W8A8_CAPABILITY says why); anything else as is.
    Hardware with no recorded compute capability (AMD, CPU hosts, a --hardware-file entry
    without it) keeps `fmt`."""
    cc = hw.compute_capability
    if fmt.compute != "fp8" or cc is None or cc >= FP8_W8A8_CAPABILITY:
        return fmt
    return replace(
        fmt,
        compute="bf16",
        block_scaled=False,
        note=f"FP8 weights run weight-only (vLLM's Marlin W8A16: compute capability {cc} "
        f"< {FP8_W8A8_CAPABILITY} has no FP8 tensor cores); embed/head 16-bit",
    )


def served_format(
    dtype: str, quantization: str | None, model: ModelSpec, hw: HardwareSpec
) -> WeightFormat:
    """The weight format a config asks for, as vLLM runs it on `hw` (`on_hardware`): what
    the memory budget, the planner's bounds and the simulator's step times all read."""
    return on_hardware(weight_format(dtype, quantization, model), hw)


def _runs_here(hw: HardwareSpec, shipped: bool) -> str:
    """The fix naming the formats `hw` runs (`method_runs_on`), pre-quantized ones said so;
    `shipped`: the refused format is the checkpoint's own, so the others start from the
    model's 16-bit release."""
    ok = [m for m in QUANTIZE_CHOICES if method_runs_on(m, hw)]
    newer = "a GPU of a newer compute capability"
    if not ok:
        return f"plan 16-bit weights, or {newer}"
    at_load = [f"--quant {m}" for m in ok if VLLM_METHOD_RULES[m].quantizes_at_load]
    released = [m for m in ok if not VLLM_METHOD_RULES[m].quantizes_at_load]
    named = at_load + ([f"{' or '.join(released)} (a pre-quantized release)"] if released else [])
    start = "plan the model's 16-bit release with " if shipped else "use "
    return f"{start}{', or '.join(named)}, or {newer}"


def check_runs_on(
    fmt: WeightFormat,
    hw: HardwareSpec,
    field_name: str,
    *,
    dtype: str = "auto",
    engine: str = "vllm",
    shipped: bool = False,
    dtype_field: str = "--dtype",
) -> None:
    """A one-line error for weights vLLM refuses on `hw` at start-up: a method below its
    minimum compute capability (VLLM_METHOD_RULES: modelopt FP8 89, fp8 and mxfp4 80, awq
    75, gptq 60), or an explicit `dtype` the method does not run its activations in
    (mxfp4: bfloat16 only; awq, gptq: float16 only). Formats without a rule keep the FP8
    rule (W8A8 FP8 needs 8.0, FP8_MIN_CAPABILITY), for every engine. `dtype` auto is not
    checked: vLLM resolves it from the checkpoint, which a quantized release ships in its
    method's dtype. `shipped`: `fmt` is the checkpoint's own (the fix then starts from the
    16-bit release). `dtype_field`: the flag that set `dtype` (`simulate`: --set dtype)."""
    cc = hw.compute_capability
    rule = VLLM_METHOD_RULES.get(fmt.name) if engine in RULE_ENGINES else None
    if rule is not None and cc is not None and cc < rule.min_capability:
        raise InputError(
            field_name,
            f"{fmt.name} weights need compute capability >= {rule.min_capability}, and "
            f"{hw.display_name} has {cc} (vLLM's {rule.source})",
            _runs_here(hw, shipped),
        )
    if rule is None and fmt.compute == "fp8" and cc is not None and cc < FP8_MIN_CAPABILITY:
        raise InputError(
            field_name,
            f"{fmt.name} weights need compute capability >= {FP8_MIN_CAPABILITY}, and "
            f"{hw.display_name} has {cc} (vLLM refuses FP8 below it)",
            _runs_here(hw, shipped),
        )
    asked = _DTYPE_ALIASES.get(dtype, dtype)
    if rule is not None and dtype != "auto" and asked not in rule.act_dtypes:
        names = {"bf16": "bfloat16", "fp16": "float16"}
        allowed = " or ".join(names.get(d, d) for d in rule.act_dtypes)
        fix = names.get(rule.act_dtypes[0], rule.act_dtypes[0])
        raise InputError(
            dtype_field,
            f"{fmt.name} runs its activations in {allowed} only, not {names.get(asked, asked)} "
            f"(vLLM's {rule.config}.get_supported_act_dtypes())",
            f"use {_given(dtype_field, fix)}, or {_given(dtype_field, 'auto')}",
        )


def _given(flag: str, value: str) -> str:
    """`value` as the command takes it: `--dtype float16`, or `--set dtype=float16`."""
    return f"{flag}={value}" if flag.startswith("--set") else f"{flag} {value}"


# vLLM's bfloat16 rule (vllm/platforms/cuda.py `check_if_supports_dtype`, formerly the
# worker's `_check_if_gpu_supports_dtype`): "Bfloat16 is only supported on GPUs with
# compute capability of at least 8.0. Your ... GPU has compute capability 7.5. You can use
# float16 instead by explicitly setting the `dtype` flag in CLI, for example: --dtype=half."
BF16_MIN_CAPABILITY = 8.0


def check_dtype_runs_on(dtype: str, hw: HardwareSpec, field_name: str = "--dtype") -> None:
    """A one-line error for an explicit bfloat16 on a GPU below compute capability 8.0
    (V100, T4), which vLLM refuses at start-up (BF16_MIN_CAPABILITY). `auto` is not
    checked: vLLM serves a bfloat16 checkpoint there in float16 itself."""
    cc = hw.compute_capability
    if _DTYPE_ALIASES.get(dtype, dtype) == "bf16" and cc is not None and cc < BF16_MIN_CAPABILITY:
        raise InputError(
            field_name,
            f"bfloat16 needs compute capability >= {BF16_MIN_CAPABILITY}, and "
            f"{hw.display_name} has {cc} (vLLM refuses bfloat16 below it)",
            f"use {_given(field_name, 'float16')}",
        )


def loads_as_shipped(quantization: str, model: ModelSpec) -> bool:
    """Whether asking `quantization` of a quantized checkpoint loads it as it ships
    (`names_checkpoint_method`): Qwen3-32B-FP8 under `--quantization fp8` keeps its
    128 x 128 block scales and vLLM's block-scaled GEMMs. Another method on a quantized
    checkpoint is refused where a config meets the engine's start-up rules
    (`engines.rules.check_quantization`)."""
    method = shipped_method(model)
    return method is not None and names_checkpoint_method(quantization, method)


def checkpoint_format(model: ModelSpec) -> WeightFormat:
    """The checkpoint's own format, or a one-line error when its method has no size rule."""
    q = model.quantization
    if q is None or not q.schemes:
        method = q.method if q else "none"
        known = supported_methods()
        # a known method whose variant has no rule (modelopt's NVFP4) names the variant: it
        # had read "'modelopt' has no size rule (known: ..., modelopt, ...)"
        what = q.summary.split(" (")[0] if q and method in known else repr(method)
        field = "quant_algo" if q and method == "modelopt" else "quant_method"
        raise InputError(
            f"{model.name}: quantization_config.{field}",
            f"{what} has no size rule in servetune (known: {', '.join(known)})",
            "plan it with --quant in the nearest format (fp8, int8, awq, gptq, mxfp4, q4_k_m)",
        )
    return _applicable(scheme_format(q.method, q.schemes, q.summary), model)


def _applicable(fmt: WeightFormat, model: ModelSpec) -> WeightFormat:
    """Refuse a format that quantizes only tensor classes the model lacks (MXFP4 on a
    dense model would silently plan 16-bit weights)."""
    counts = model.params_classes
    if fmt.class_bits and not any(getattr(counts, c) for c in fmt.class_bits):
        raise InputError(
            "--quant",
            f"{fmt.name} quantizes {', '.join(fmt.class_bits)} only, and {model.name} has none",
            "use fp8, int8, awq or gptq for a dense model",
        )
    return fmt


def resolved_kv_cache_dtype(kv_cache_dtype: str, model: ModelSpec, engine: str) -> str:
    """The KV cache dtype the engine runs: vLLM resolves `auto` to the KV cache a ModelOpt
    checkpoint declares (`kv_cache_quant_algo` FP8: vllm#29980, vLLM's
    `resolve_kv_cache_dtype_string`), so an `nvidia/*-FP8` checkpoint gets an FP8 pool
    unasked; anything else keeps `kv_cache_dtype`."""
    declared = model.quantization.kv_cache if model.quantization is not None else None
    if kv_cache_dtype == "auto" and engine == "vllm" and declared:
        return declared
    return kv_cache_dtype


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
    parameters x bytes per parameter, made exact per tensor class), and the body classes
    a format rates apart (MXFP4 experts, a checkpoint's schemes) at theirs.

    A tied embedding is also the output layer: in a GGUF file it is stored at the LM
    head's rate (llama.cpp's rule); vLLM ties the LM head to the embedding, which no
    checkpoint scheme quantizes (a W4A16 `Linear` target on tied Llama-3.2-1B had planned
    it at 4 bits: 0.59 GiB, not 0.96). GGUF K-quant tensors whose rows are not a multiple
    of 256 use the fallback type (see K_QUANT_FALLBACK_BITS)."""
    tied = model.params_lm_head == 0
    gguf = fmt.name in GGUF_TYPES
    embedding_bits = fmt.lm_head_bits if tied and gguf else fmt.embedding_bits
    head_bits = fmt.lm_head_bits
    body_bits = model.params_body * fmt.body_bits
    for name, bits in fmt.class_bits.items():
        body_bits += getattr(model.params_classes, name) * (bits - fmt.body_bits)
    if fmt.name in K_QUANT_FALLBACK_BITS:
        body_bits += misaligned_row_params(model) * (
            K_QUANT_FALLBACK_BITS[fmt.name] - fmt.body_bits
        )
        if model.hidden_size % QK_K:  # embedding and output rows are hidden_size long
            head_bits = K_QUANT_FALLBACK_BITS["q6_k"]
            embedding_bits = head_bits if tied else K_QUANT_FALLBACK_BITS[fmt.name]
    return (
        body_bits + model.params_embedding * embedding_bits + model.params_lm_head * head_bits
    ) / 8


def misaligned_row_params(model: ModelSpec) -> int:
    """Body parameters in matrices whose rows (input dim) are not a multiple of 256: the
    Q/K/V and gate/up projections read hidden_size, the output projection reads
    heads x head_dim, the down projection reads the MLP width."""
    h, hd = model.hidden_size, model.head_dim
    qkv = h * (model.num_attention_heads + 2 * model.num_kv_heads) * hd
    o = model.num_attention_heads * hd * h
    if model.moe is not None:
        width, n = model.moe.expert_intermediate_size, model.moe.num_experts
    else:
        width, n = model.intermediate_size, 1
    gate_up, down = 2 * h * width * n, width * h * n
    odd = (qkv + gate_up if h % QK_K else 0) + (o if (model.num_attention_heads * hd) % QK_K else 0)
    odd += down if width % QK_K else 0
    return min(odd * model.num_layers, model.params_body)
