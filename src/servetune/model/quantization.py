"""A checkpoint's own weight format, read from config.json's `quantization_config`.

Today's flagship checkpoints ship quantized (DeepSeek-V3 in block-wise FP8, GPT-OSS
with MXFP4 experts), and planning them as 16-bit overstates their weights 2-4x. This
module records what the config states - value bits, scale layout, which tensors - as
`CheckpointQuant`; `plan.quant` turns that into bytes. Supported `quant_method`s:

- `fp8` (transformers FineGrainedFP8Config, DeepSeek-V3): e4m3 values, one fp32 scale
  (`weight_scale_inv`) per `weight_block_size` block, or per tensor without it;
  activations quantized on the fly (`activation_scheme: dynamic`).
- `mxfp4` (GPT-OSS): OCP Microscaling Formats (MX) v1.0 - 32 FP4 e2m1 values share one
  E8M0 scale; transformers' Mxfp4 quantizer and vLLM's `mxfp4` method convert the MoE
  expert weights only.
- `awq` (AutoAWQ GEMM layout): packed int values, one fp16 scale and one packed
  zero point per `group_size` (`zero_point: false` drops the zero).
- `gptq` (AutoGPTQ / GPTQModel layout): packed int values, fp16 scales and packed
  `qzeros` per group, stored even when `sym` is true; `group_size: -1` is per row.
- `compressed-tensors` (llm-compressor): each `config_groups` entry names its `targets`
  and its `weights` (num_bits, type, strategy, group_size, block_structure, symmetric);
  `ignore` lists modules left unquantized.
- `modelopt` (NVIDIA TensorRT Model Optimizer, the `nvidia/*-FP8` checkpoints):
  `quant_algo` FP8 is per-tensor FP8 e4m3 weights and activations (W8A8), `exclude_modules`
  left in 16 bits; other algorithms (NVFP4) have no size rule. Its `kv_cache_quant_algo`
  FP8 (or a static 8-bit float `kv_cache_scheme`) declares an FP8 KV cache, which vLLM
  follows under `--kv-cache-dtype auto` (vllm#29980; `get_kv_cache_quant_algo_string` in
  vllm/utils/torch_utils.py). The fields sit in the config or in its `quantization` part.

Every method leaves the token embedding and the MoE routers in 16 bits (vLLM builds
each MoE gate with `quant_config=None`); the LM head is quantized only where the config
says so. An `ignore`/`modules_to_not_convert` entry removes the tensor class it names
(`self_attn`, `experts`, `lm_head`, ...); an entry for one layer (`layers.3.`) is not
modelled. An unknown method is kept with no schemes: the planner then asks for --quant.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.model.spec import CheckpointQuant, ModelSpec, QuantScheme, TensorClass

# The block matrices a weight-only or W8A8 method quantizes when nothing is excluded.
_BLOCK_MATRICES: tuple[TensorClass, ...] = ("attention", "mlp", "experts", "shared_experts")
_ALL_LINEAR: tuple[TensorClass, ...] = (*_BLOCK_MATRICES, "lm_head")

# OCP MX v1.0 MXFP4: FP4 (e2m1) elements, one shared E8M0 scale per block of 32.
MXFP4 = QuantScheme(classes=("experts",), bits=4, kind="float", group_size=32, scale_bits=8)

_ONE_LAYER = re.compile(r"layers\.\d+\.")
_ATTENTION = ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv", "kv_a", "kv_b")
_MLP = ("mlp", "feed_forward", "gate_proj", "up_proj", "down_proj")


_GROUP = re.compile(r"\(([^()]*)\)")


def tensor_classes(module: str) -> set[str]:
    """The tensor classes a module name or `re:` pattern names, its `(a|b|c)` groups
    taken one alternative at a time: `re:.*mlp.(down|gate|up)_proj$` (llm-compressor's
    own spelling) is the MLP's gate_proj, up_proj and down_proj; read whole, its `|gate|`
    was the router, and W4A16 on Llama-3.1-8B planned the MLP at 16 bits (13.1 GiB, not
    5.3)."""
    names, done = [module], []
    while names and len(done) < 256:  # a pattern's alternatives, expanded (bounded)
        name = names.pop()
        m = _GROUP.search(name)
        if m is None or "|" not in m.group(1):
            done.append(name if m is None else name[: m.start()] + m.group(1) + name[m.end() :])
            continue
        names += [name[: m.start()] + alt + name[m.end() :] for alt in m.group(1).split("|")]
    return {c for n in done if (c := tensor_class(n)) is not None}


def tensor_class(module: str) -> str | None:
    """The tensor class a module name or `re:` pattern from a quantization config names
    (HF module names: `self_attn`, `mlp.experts`, `mlp.shared_experts`, `mlp.gate` or
    `mlp.router` for the router, `embed_tokens`, `lm_head`); None for norms, unknown
    names and single-layer exceptions."""
    name = module.lower().removeprefix("re:")
    if _ONE_LAYER.search(name):
        return None
    if "lm_head" in name:
        return "lm_head"
    if "embed" in name:
        return "embedding"
    if "shared_expert" in name:
        return "shared_experts"
    if "expert" in name:
        return "experts"
    if "router" in name or re.search(r"\bgate\b", name):  # mlp.gate, not gate_proj
        return "router"
    if any(key in name for key in _ATTENTION):
        return "attention"
    if any(key in name for key in _MLP):
        return "mlp"
    return None


def checkpoint_quant(raw: Any, source: str) -> CheckpointQuant | None:
    """CheckpointQuant from a config's `quantization_config` (None when it has none)."""
    if raw is None:
        return None
    where = f"{source}: quantization_config"
    if not isinstance(raw, dict):
        raise InputError(where, "must be a JSON object", "remove it or give the checkpoint's own")
    method = raw.get("quant_method")
    if not isinstance(method, str) or not method:
        raise InputError(
            f"{where}.quant_method", "missing", "every HF quantization_config names its method"
        )
    parser = _PARSERS.get(method.lower())
    if parser is None:
        return CheckpointQuant(method=method, summary=f"{method} (no size rule in servetune)")
    try:
        return parser(raw, where)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=where) from None


def _names(raw: dict[str, Any], key: str, where: str) -> list[str]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{where}.{key}", f"must be a list of module names (got {value!r})")
    return value


def _keep(classes: tuple[TensorClass, ...], skipped: list[str]) -> tuple[TensorClass, ...]:
    """`classes` minus those an ignore / modules_to_not_convert list names."""
    gone = set().union(*(tensor_classes(name) for name in skipped))
    return tuple(c for c in classes if c not in gone)


def _positive(raw: dict[str, Any], keys: tuple[str, ...], where: str, default: int) -> int:
    """The first of `keys` present (AutoAWQ and HF spell some fields two ways), as an int."""
    for key in keys:
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int) or value == 0:
                raise InputError(f"{where}.{key}", f"must be a non-zero integer (got {value!r})")
            return value
    return default


def _fp8(raw: dict[str, Any], where: str) -> CheckpointQuant:
    block = raw.get("weight_block_size")
    if block is not None and not (
        isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) for b in block)
    ):
        raise InputError(f"{where}.weight_block_size", f"must be [rows, cols] (got {block!r})")
    scheme = QuantScheme(
        classes=_keep(_BLOCK_MATRICES, _names(raw, "modules_to_not_convert", where)),
        bits=8,
        kind="float",
        block=tuple(block) if block else None,
        scale_bits=32,
        activations="fp8",
    )
    layout = f"{block[0]}x{block[1]} block scales (fp32)" if block else "per-tensor scales"
    return CheckpointQuant(method="fp8", schemes=(scheme,), summary=f"FP8 e4m3, {layout}")


def _mxfp4(raw: dict[str, Any], where: str) -> CheckpointQuant:
    classes = _keep(MXFP4.classes, _names(raw, "modules_to_not_convert", where))
    return CheckpointQuant(
        method="mxfp4",
        schemes=(MXFP4.model_copy(update={"classes": classes}),),
        summary="MXFP4 MoE experts (e2m1, one e8m0 scale per 32); the rest 16-bit",
    )


def _awq(raw: dict[str, Any], where: str) -> CheckpointQuant:
    bits = _positive(raw, ("bits", "w_bit"), where, 4)
    group = _positive(raw, ("group_size", "q_group_size"), where, 128)
    zero = raw.get("zero_point", True) is not False
    scheme = QuantScheme(
        classes=_keep(_BLOCK_MATRICES, _names(raw, "modules_to_not_convert", where)),
        bits=bits,
        kind="int",
        group_size=group if group > 0 else None,
        zero_bits=bits if zero else 0,
    )
    return CheckpointQuant(
        method="awq", schemes=(scheme,), summary=f"AWQ int{bits}, group {group}, fp16 scales"
    )


def _gptq(raw: dict[str, Any], where: str) -> CheckpointQuant:
    bits = _positive(raw, ("bits",), where, 4)
    group = _positive(raw, ("group_size",), where, 128)
    classes = _ALL_LINEAR if raw.get("lm_head") is True else _BLOCK_MATRICES
    scheme = QuantScheme(
        classes=_keep(classes, _names(raw, "modules_to_not_convert", where)),
        bits=bits,
        kind="int",
        group_size=group if group > 0 else None,
        zero_bits=bits,
    )
    grouping = f"group {group}" if group > 0 else "per row"
    return CheckpointQuant(
        method="gptq", schemes=(scheme,), summary=f"GPTQ int{bits}, {grouping}, fp16 scales"
    )


def _compressed_tensors(raw: dict[str, Any], where: str) -> CheckpointQuant:
    groups = raw.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise InputError(
            f"{where}.config_groups",
            "missing or empty",
            "compressed-tensors configs list their schemes under config_groups",
        )
    ignored = _names(raw, "ignore", where)
    schemes, parts = [], []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if weights is None:
            continue  # an activation-only or KV-cache group stores no weights
        scheme = _ct_scheme(group, weights, ignored, f"{where}.config_groups.{name}")
        schemes.append(scheme)
        parts.append(f"{scheme.kind}{scheme.bits} {', '.join(scheme.classes)}")
    return CheckpointQuant(
        method="compressed-tensors",
        schemes=tuple(schemes),
        summary="compressed-tensors: " + "; ".join(parts),
    )


def _ct_scheme(group: dict[str, Any], weights: Any, ignored: list[str], where: str) -> QuantScheme:
    if not isinstance(weights, dict):
        raise InputError(f"{where}.weights", "must be a JSON object")
    targets = group.get("targets") or []
    if not isinstance(targets, list):
        raise InputError(f"{where}.targets", f"must be a list (got {targets!r})")
    if "Linear" in targets:
        covered = _ALL_LINEAR
    else:
        named = set().union(*(tensor_classes(t) for t in targets if isinstance(t, str)))
        covered = tuple(c for c in _ALL_LINEAR if c in named)
    bits = _positive(weights, ("num_bits",), f"{where}.weights", 8)
    kind = weights.get("type", "int")
    strategy = weights.get("strategy")
    block = weights.get("block_structure") if strategy == "block" else None
    acts = group.get("input_activations")
    act_bits = acts.get("num_bits") if isinstance(acts, dict) else None
    return QuantScheme(
        classes=_keep(covered, ignored),
        bits=bits,
        kind=kind,
        group_size=weights.get("group_size") if strategy in ("group", "tensor_group") else None,
        block=tuple(block) if block else None,
        # FP4 formats (NVFP4) store fp8 e4m3 group scales; the others the checkpoint dtype.
        scale_bits=8 if (kind, bits) == ("float", 4) else 16,
        zero_bits=0 if weights.get("symmetric", True) else bits,
        activations=(("fp8" if kind == "float" else "int8") if act_bits == 8 else None),
    )


def _modelopt(raw: dict[str, Any], where: str) -> CheckpointQuant:
    inner = raw.get("quantization")
    cfg = {**raw, **inner} if isinstance(inner, dict) else raw
    algo = str(cfg.get("quant_algo") or "").upper()
    kv = modelopt_kv_cache(cfg)
    if algo != "FP8":
        return CheckpointQuant(
            method=str(raw["quant_method"]),
            summary=f"modelopt {algo or '(no quant_algo)'} (no size rule in servetune)",
            kv_cache=kv,
        )
    scheme = QuantScheme(
        classes=_keep(_BLOCK_MATRICES, _names(cfg, "exclude_modules", where)),
        bits=8,
        kind="float",
        scale_bits=32,
        activations="fp8",
    )
    summary = "ModelOpt FP8 e4m3, per-tensor scales" + (", FP8 KV cache" if kv else "")
    return CheckpointQuant(method="modelopt", schemes=(scheme,), summary=summary, kv_cache=kv)


def modelopt_kv_cache(cfg: dict[str, Any]) -> Literal["fp8"] | None:
    """ "fp8" where a ModelOpt config declares an FP8 KV cache, as vLLM reads it: the string
    `kv_cache_quant_algo` "FP8", or a `kv_cache_scheme` of static 8-bit floats; None
    otherwise (vLLM then keeps `auto`: the model's dtype)."""
    algo = cfg.get("kv_cache_scheme") or cfg.get("kv_cache_quant_algo")
    if isinstance(algo, dict):
        static_fp8 = algo.get("dynamic") is False and algo.get("num_bits") == 8
        return "fp8" if static_fp8 and algo.get("type") == "float" else None
    return "fp8" if isinstance(algo, str) and algo.lower() == "fp8" else None


_PARSERS = {
    "fp8": _fp8,
    "mxfp4": _mxfp4,
    "awq": _awq,
    "gptq": _gptq,
    "compressed-tensors": _compressed_tensors,
    "modelopt": _modelopt,
    "modelopt_fp4": _modelopt,  # NVFP4: the KV cache declared, no size rule
}


def supported_methods() -> list[str]:
    """The `quant_method`s whose sizes servetune computes (modelopt_fp4: its KV cache only)."""
    return sorted(m for m in _PARSERS if m != "modelopt_fp4")


def shipped_method(model: ModelSpec) -> str | None:
    """The checkpoint's `quant_method` where servetune knows its format, for the engines'
    start-up rule (`engines.rules.check_quantization`); None for a 16-bit checkpoint and
    for a method with no size rule, which --quant stands in for."""
    q = model.quantization
    return q.method if q is not None and q.schemes else None


def names_checkpoint_method(asked: str, method: str) -> bool:
    """Whether an engine asked for `asked` loads a checkpoint whose config says `method` as
    it ships: the same name, or `fp8` on a ModelOpt FP8 checkpoint, which vLLM takes as
    `modelopt` (`ModelOptFp8Config.override_quantization_method`). Any other name vLLM and
    SGLang refuse at start-up ("Quantization method specified in the model config (X) does
    not match the quantization method specified in the `quantization` argument (Y)",
    `ModelConfig._verify_quantization`)."""
    return asked == method or (method == "modelopt" and asked == "fp8")
