"""Build a ModelSpec from a HuggingFace `config.json`.

Users point servetune at the model they serve, and its `config.json` is the one
file every checkpoint ships; the catalog stores facts in the same form. Each
supported family is described once in `_FAMILIES` (its HF config keys, biases,
norms, sliding-window layout), so a new family is a table entry, not new code.
Anything unusable becomes a one-line `InputError`, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.model.params import Traits, count_params
from servetune.model.quantization import checkpoint_quant
from servetune.model.spec import MLASpec, ModelSpec, MoESpec

# Fields every decoder-only config must give (after family defaults are applied).
_BASE_REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class _Family:
    """How one HF model_type maps onto ModelSpec."""

    architecture: str  # default class name when `architectures` is absent
    traits: Traits = Traits()
    # Where sliding-window attention applies when the config enables it:
    # "all" (Mistral v0.1, Phi-3), "alternate" (even layers: Gemma 2, GPT-OSS),
    # "pattern" (every Nth layer global: Gemma 3), "qwen" (opt-in via
    # use_sliding_window, layers >= max_window_layers), "none".
    sliding: str = "none"
    moe: str | None = None  # key of _MOE_BUILDERS
    mla: bool = False
    tied_default: bool = False  # the HF config class default for tie_word_embeddings
    required: tuple[str, ...] = ()
    # HF config-class defaults for fields released checkpoints omit (Gemma 3 27B's
    # text_config has no vocab_size or max_position_embeddings).
    defaults: Mapping[str, Any] = field(default_factory=dict)


_GEMMA_TRAITS = Traits(norms_per_layer=4)  # input, post_attention, pre/post_feedforward
_QWEN_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
_MIXTRAL_KEYS = ("num_local_experts", "num_experts_per_tok")
_MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_DEEPSEEK_MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
# The attention shape Gemma2Config / Gemma3TextConfig default to (transformers):
# google/gemma-3-4b-it's text_config gives none of it, and read as missing (then
# derived) its KV cache came out 2.5x.
_GEMMA_HEADS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}
_GEMMA3_DEFAULTS = {
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    **_GEMMA_HEADS,
}

_FAMILIES: dict[str, _Family] = {
    "llama": _Family("LlamaForCausalLM"),  # attention_bias / mlp_bias read per config
    # MistralConfig's num_key_value_heads is 8 (not the heads); its sliding_window
    # default is not taken: v0.2+ configs write `null` to turn it off
    "mistral": _Family("MistralForCausalLM", sliding="all", defaults={"num_key_value_heads": 8}),
    "mixtral": _Family("MixtralForCausalLM", sliding="all", moe="mixtral", required=_MIXTRAL_KEYS),
    "qwen2": _Family("Qwen2ForCausalLM", Traits(qkv_bias=True), sliding="qwen"),
    # Qwen3Config's head_dim is 128 (Qwen3-32B: 5,120 / 64 would be 80)
    "qwen3": _Family(
        "Qwen3ForCausalLM", Traits(qk_norm=True), sliding="qwen", defaults={"head_dim": 128}
    ),
    "qwen3_moe": _Family(
        "Qwen3MoeForCausalLM",
        Traits(qk_norm=True),
        sliding="qwen",
        moe="qwen_moe",
        required=_QWEN_MOE_KEYS,
    ),
    "gemma": _Family("GemmaForCausalLM", tied_default=True),
    "gemma2": _Family(
        "Gemma2ForCausalLM",
        _GEMMA_TRAITS,
        sliding="alternate",
        tied_default=True,
        defaults=_GEMMA_HEADS,
    ),
    "gemma3_text": _Family(
        "Gemma3ForCausalLM",
        Traits(norms_per_layer=4, qk_norm=True),
        sliding="pattern",
        tied_default=True,
        defaults=_GEMMA3_DEFAULTS,
    ),
    "phi3": _Family("Phi3ForCausalLM", sliding="all"),  # fused qkv_proj/gate_up_proj
    "deepseek_v2": _Family(
        "DeepseekV2ForCausalLM", moe="deepseek", mla=True, required=_MLA_KEYS + _DEEPSEEK_MOE_KEYS
    ),
    "deepseek_v3": _Family(
        "DeepseekV3ForCausalLM",
        Traits(router_score_bias=True),
        moe="deepseek",
        mla=True,
        required=_MLA_KEYS + _DEEPSEEK_MOE_KEYS,
    ),
    # MiniMax-M2 (configuration/modeling_minimax_m2.py): every layer MoE, Mixtral's keys,
    # sigmoid routing with a per-expert score bias, q/k RMSNorm over all heads ("per_layer":
    # 6,144 + 1,024 weights where the trait counts a head's 2 x 128; a few K of 230 B).
    "minimax_m2": _Family(
        "MiniMaxM2ForCausalLM",
        Traits(qk_norm=True, router_score_bias=True),
        moe="mixtral",
        required=_MIXTRAL_KEYS,
    ),
    "gpt_oss": _Family(
        "GptOssForCausalLM",
        Traits(
            qkv_bias=True,
            o_bias=True,
            expert_bias=True,
            router_bias=True,
            attention_sinks=True,
        ),
        sliding="alternate",
        moe="gpt_oss",
        required=("num_local_experts",),
    ),
}
# Wrapper model_types whose text part is one of the families above.
_ALIASES = {"gemma3": "gemma3_text"}
_ARCH_TO_TYPE = {fam.architecture: mt for mt, fam in _FAMILIES.items()} | {
    "Gemma3ForConditionalGeneration": "gemma3_text",
}


def supported_model_types() -> list[str]:
    """The HF `model_type`s servetune can read."""
    return sorted(_FAMILIES)


# ---------------------------------------------------------------- reading files


def load_hf_config(path: str | Path) -> ModelSpec:
    """Read a `config.json` (or a model directory holding one) into a ModelSpec."""
    p = Path(path).expanduser()
    if p.is_dir():
        name = p.resolve().name
        p = p / "config.json"
        if not p.is_file():
            raise InputError(
                str(path),
                "no config.json in this directory",
                "give a HF model directory or the path to its config.json",
            )
    elif p.is_file():
        name = p.resolve().parent.name if p.name == "config.json" else p.stem
    else:
        raise InputError(
            str(path),
            "no such file or directory",
            "give a HF model directory or the path to its config.json",
        )
    cfg = _read_json(p)
    return spec_from_hf_dict(cfg, name, source=str(p))


def _read_json(p: Path) -> dict[str, Any]:
    """Parse a JSON object from a file, turning every failure into an InputError."""
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(p), f"cannot read file ({exc.__class__.__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            str(p),
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            "a HF config.json is needed",
        ) from None
    if not isinstance(data, dict):
        raise InputError(str(p), "JSON top level is not an object", "a HF config.json is needed")
    return data


# ---------------------------------------------------------------- dict -> spec


def spec_from_hf_dict(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelSpec:
    """Build a ModelSpec (params included) from a HF config dict.

    `source` labels error messages (a path, or a catalog entry).
    """
    if not isinstance(cfg, dict):
        raise InputError(source, "config is not a JSON object", "a HF config.json is needed")
    flat, architecture = _flatten(cfg)
    model_type = _model_type(flat, architecture)
    if model_type is None:
        missing = ["model_type", *[k for k in _BASE_REQUIRED if flat.get(k) is None]]
        _raise_missing(source, missing)
    family = _FAMILIES.get(model_type)
    if family is None:
        raise InputError(
            f"{source}: model_type",
            f"unsupported architecture {model_type!r}"
            + (f" ({architecture})" if architecture and architecture != model_type else ""),
            f"supported model_types: {', '.join(supported_model_types())}",
        )
    flat = {**family.defaults, **{k: v for k, v in flat.items() if v is not None}}
    missing = [k for k in (*_BASE_REQUIRED, *family.required) if flat.get(k) is None]
    if missing:
        _raise_missing(source, missing)

    spec = _build_spec(flat, family, name, model_type, architecture or family.architecture, source)
    traits = _traits(flat, family)
    counts = count_params(spec, traits)
    return spec.model_copy(
        update={
            "params_total": counts.total,
            "params_active": counts.active,
            "params_embedding": counts.embedding,
            "params_lm_head": counts.lm_head,
            "params_classes": counts.classes,
            "params_attention_replicated": counts.attention_replicated,
        }
    )


def _raise_missing(source: str, missing: list[str]) -> NoReturn:
    raise InputError(
        source,
        f"missing fields {', '.join(missing)}",
        "a decoder-only HF config is needed",
    )


def _flatten(cfg: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Lift a nested `text_config` (Gemma3ForConditionalGeneration, VLM wrappers).

    The text config's keys win; the wrapper keeps `architectures` and dtype.
    """
    archs = cfg.get("architectures")
    architecture = (
        archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    )
    text = cfg.get("text_config")
    if isinstance(text, dict) and cfg.get("num_hidden_layers") is None:
        outer = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
        flat = {**outer, **text}
        if "model_type" not in text:
            flat["model_type"] = cfg.get("model_type")
        for key in ("torch_dtype", "dtype"):  # the checkpoint's dtype is the wrapper's
            if outer.get(key):
                flat[key] = outer[key]
        return flat, architecture
    return dict(cfg), architecture


def _model_type(flat: dict[str, Any], architecture: str | None) -> str | None:
    """The family to read the config as: its model_type, or, when that names no family
    servetune knows, the family of its `architectures` class. A release with its own
    model_type on a known architecture (Kimi-K2: model_type `kimi_k2`, architectures
    `DeepseekV3ForCausalLM`) is built as that class, as vLLM does: it picks the model
    class from `architectures` (vllm/model_executor/models/registry.py), not model_type."""
    mt = flat.get("model_type")
    if isinstance(mt, str) and mt:
        mt = _ALIASES.get(mt, mt)
        if mt in _FAMILIES or not architecture:
            return mt
        return _ARCH_TO_TYPE.get(architecture, mt)
    if architecture:
        return _ARCH_TO_TYPE.get(architecture, architecture)
    return None


def _traits(flat: dict[str, Any], family: _Family) -> Traits:
    """Family traits, plus Llama-style configs that switch biases on per checkpoint."""
    traits = family.traits
    if flat.get("attention_bias") is True and not traits.qkv_bias:
        traits = replace(traits, qkv_bias=True, o_bias=True)
    if flat.get("mlp_bias") is True:
        traits = replace(traits, mlp_bias=True)
    if family.mla and flat.get("topk_method") not in (None, "noaux_tc"):
        # DeepSeek-V2's greedy routers have no e_score_correction_bias.
        traits = replace(traits, router_score_bias=False)
    return traits


def _int(flat: dict[str, Any], key: str, source: str, minimum: int = 1) -> int:
    """An integer field of at least `minimum`; floats like 4096.0 pass, anything else is named."""
    value = flat[key]
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise InputError(f"{source}: {key}", f"must be {kind} (got {value!r})")
    return int(value)


def _opt_int(
    flat: dict[str, Any], key: str, source: str, default: int | None = None, minimum: int = 1
) -> int | None:
    return default if flat.get(key) is None else _int(flat, key, source, minimum)


def _build_spec(
    flat: dict[str, Any],
    family: _Family,
    name: str,
    model_type: str,
    architecture: str,
    source: str,
) -> ModelSpec:
    def get(key: str) -> int:
        return _int(flat, key, source)

    layers, hidden, heads = get("num_hidden_layers"), get("hidden_size"), get("num_attention_heads")
    max_pos = get("max_position_embeddings")
    mla = _mla(flat, source) if family.mla else None
    if mla is not None:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim  # the q.k dot-product width
    else:
        head_dim = _opt_int(flat, "head_dim", source) or _default_head_dim(hidden, heads, source)
    window, sliding_layers = _sliding(flat, family.sliding, layers, max_pos, source)
    tied = _tied(flat, family, source)
    derived, derived_origin = derived_max_model_len(flat, max_pos, source)
    dtype = flat.get("torch_dtype") or flat.get("dtype") or "bfloat16"
    try:
        return ModelSpec(
            name=name,
            architecture=architecture,
            model_type=model_type,
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=_kv_heads(flat, heads, source),
            head_dim=head_dim,
            vocab_size=get("vocab_size"),
            intermediate_size=get("intermediate_size"),
            max_position_embeddings=max_pos,
            derived_max_model_len=derived,
            max_model_len_origin=derived_origin,
            tie_word_embeddings=tied,
            sliding_window=window,
            sliding_window_layers=sliding_layers,
            moe=_MOE_BUILDERS[family.moe](flat, source) if family.moe else None,
            mla=mla,
            qk_norm_across_heads=flat.get("qk_norm_type") == "per_layer"
            and flat.get("use_qk_norm", True) is not False,
            torch_dtype=str(dtype),
            quantization=checkpoint_quant(flat.get("quantization_config"), source),
        )
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=source) from None


def _tied(flat: dict[str, Any], family: _Family, source: str) -> bool:
    """tie_word_embeddings as a JSON bool (absent: the family's HF default). A string is
    refused: Python reads any non-empty one, "false" included, as true, which would drop
    the LM head from the weights (transformers' PretrainedConfig takes the value as given)."""
    value = flat.get("tie_word_embeddings")
    if value is None:
        return family.tied_default
    if not isinstance(value, bool):
        raise InputError(
            f"{source}: tie_word_embeddings",
            f"must be true or false (a JSON bool), got {value!r}",
            'write it without quotes: "tie_word_embeddings": false',
        )
    return value


# vLLM's rule for the context a config allows (vllm/config/model.py
# `_get_and_verify_max_len`): the smallest of the length keys (max_position_embeddings
# here), then, unless the model_type contains "gemma3" (its 128K is already scaled) or the
# rope type is su / longrope / llama3, x rope_scaling["factor"] (1 when absent: "default"
# defines none), a yarn config starting from original_max_position_embeddings instead.
# transformers' patch_rope_scaling reads "type" as "rope_type"; v5 configs spell the
# mapping rope_parameters.
_ROPE_UNSCALED = ("su", "longrope", "llama3")


def derived_max_model_len(
    flat: dict[str, Any], max_pos: int, source: str
) -> tuple[int | None, str]:
    """(the context vLLM derives, what set it) from rope_scaling; (None, "") where that is
    max_position_embeddings itself."""
    key = "rope_scaling" if flat.get("rope_scaling") is not None else "rope_parameters"
    rope = flat.get(key)
    if rope is None:
        return None, ""
    where = f"{source}: {key}"
    if not isinstance(rope, dict):
        raise InputError(
            where,
            f"must be a JSON object, got {rope!r}",
            'give {"rope_type": "yarn", "factor": 4.0, ...} as the model\'s release does, '
            "or remove it",
        )
    model_type = str(flat.get("model_type") or "")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if "gemma3" in model_type or rope_type in _ROPE_UNSCALED:
        return None, ""
    factor = rope.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise InputError(f"{where}.factor", f"must be a positive number, got {factor!r}")
    start, start_key = max_pos, "max_position_embeddings"
    if rope_type == "yarn" and rope.get("original_max_position_embeddings") is not None:
        start = _int(rope, "original_max_position_embeddings", where)
        start_key = "original_max_position_embeddings"
    derived = int(start * factor)
    if derived == max_pos or derived < 1:
        return None, ""
    return derived, f"rope_scaling {rope_type}: {start_key} {start:,} x factor {factor:g}"


def _default_head_dim(hidden: int, heads: int, source: str) -> int:
    if heads <= 0 or hidden % heads:
        raise InputError(
            f"{source}: head_dim",
            f"missing, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
            "add head_dim to the config",
        )
    return hidden // heads


def _kv_heads(flat: dict[str, Any], heads: int, source: str) -> int:
    """num_key_value_heads (default: heads). Grouped-query attention repeats each KV head
    for heads / kv_heads query heads (transformers' `repeat_kv`), so it must divide the
    heads, and so be no more of them: any other count is a typo no engine can run, and
    would size a KV cache for a model that does not exist."""
    kv = _opt_int(flat, "num_key_value_heads", source, heads) or heads
    if heads % kv:
        raise InputError(
            f"{source}: num_key_value_heads",
            f"{kv} does not divide num_attention_heads {heads}",
            "give a divisor of num_attention_heads: each KV head serves a whole group of them",
        )
    return kv


def _sliding(
    flat: dict[str, Any], kind: str, layers: int, max_pos: int, source: str
) -> tuple[int | None, int]:
    """(window, how many layers use it); (None, 0) when no layer's KV is ever capped."""
    if kind == "none" or (kind == "qwen" and not flat.get("use_sliding_window", False)):
        return None, 0
    window = _opt_int(flat, "sliding_window", source, minimum=0)
    if not window or window >= max_pos:
        return None, 0  # a window as long as the context never drops a token
    layer_types = flat.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types if t == "sliding_attention")
    elif kind == "alternate":
        count = (layers + 1) // 2  # layers 0, 2, 4, ... slide (Gemma2DecoderLayer, GPT-OSS)
    elif kind == "pattern":
        # Gemma 3: layer i is global when (i + 1) % pattern == 0, so 5 of every 6 slide.
        pattern = _opt_int(flat, "sliding_window_pattern", source, 6) or 6
        count = layers - layers // pattern
    elif kind == "qwen":
        start = _opt_int(flat, "max_window_layers", source, 28, minimum=0) or 0
        count = layers - min(layers, start)
    else:
        count = layers
    count = min(count, layers)
    return (window, count) if count else (None, 0)


def _mla(flat: dict[str, Any], source: str) -> MLASpec:
    try:
        return MLASpec(
            kv_lora_rank=_int(flat, "kv_lora_rank", source),
            qk_rope_head_dim=_int(flat, "qk_rope_head_dim", source),
            qk_nope_head_dim=_int(flat, "qk_nope_head_dim", source),
            v_head_dim=_int(flat, "v_head_dim", source),
            q_lora_rank=_opt_int(flat, "q_lora_rank", source),
        )
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=source) from None


def _moe(flat: dict[str, Any], source: str, **keys: str | int) -> MoESpec:
    """MoESpec from config keys: each kwarg names the config key (str) or is a value (int)."""
    values = {k: _int(flat, v, source) if isinstance(v, str) else v for k, v in keys.items()}
    if values["experts_per_token"] > values["num_experts"]:
        k_key, e_key = keys["experts_per_token"], keys["num_experts"]
        raise InputError(
            f"{source}: {k_key}",
            f"{values['experts_per_token']} is more than {e_key} {values['num_experts']}: "
            "the router picks that many of the experts",
            f"give at most {values['num_experts']}",
        )
    try:
        return MoESpec(**values)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=source) from None


def _experts_per_token_key(flat: dict[str, Any]) -> str:
    # GPT-OSS configs carry both spellings; HF reads num_experts_per_tok.
    return (
        "num_experts_per_tok"
        if flat.get("num_experts_per_tok") is not None
        else "experts_per_token"
    )


def _mixtral_moe(flat: dict[str, Any], source: str) -> MoESpec:
    # Mixtral / GPT-OSS: every layer is MoE; intermediate_size is the expert width.
    if flat.get(_experts_per_token_key(flat)) is None:
        _raise_missing(source, ["num_experts_per_tok"])
    return _moe(
        flat,
        source,
        num_experts="num_local_experts",
        experts_per_token=_experts_per_token_key(flat),
        expert_intermediate_size="intermediate_size",
    )


def _qwen_moe(flat: dict[str, Any], source: str) -> MoESpec:
    step = _opt_int(flat, "decoder_sparse_step", source, 1)
    if step != 1 or flat.get("mlp_only_layers"):
        raise InputError(
            f"{source}: decoder_sparse_step",
            "MoE on only some layers (decoder_sparse_step != 1 or mlp_only_layers) is unsupported",
        )
    return _moe(
        flat,
        source,
        num_experts="num_experts",
        experts_per_token="num_experts_per_tok",
        expert_intermediate_size="moe_intermediate_size",
    )


def _deepseek_moe(flat: dict[str, Any], source: str) -> MoESpec:
    # DeepseekV2/V3MoE: routed experts + n_shared_experts always-on experts of the same
    # width (HF fuses them into one MLP of n_shared * moe_intermediate_size);
    # the first first_k_dense_replace layers keep a dense MLP of intermediate_size.
    if _opt_int(flat, "moe_layer_freq", source, 1) != 1:
        raise InputError(f"{source}: moe_layer_freq", "only moe_layer_freq 1 is supported")
    shared = _opt_int(flat, "n_shared_experts", source, 0, minimum=0) or 0
    return _moe(
        flat,
        source,
        num_experts="n_routed_experts",
        experts_per_token="num_experts_per_tok",
        expert_intermediate_size="moe_intermediate_size",
        num_shared_experts=shared,
        shared_expert_intermediate_size="moe_intermediate_size" if shared else 0,
        first_dense_layers=_opt_int(flat, "first_k_dense_replace", source, 0, minimum=0) or 0,
    )


_MOE_BUILDERS: dict[str, Callable[[dict[str, Any], str], MoESpec]] = {
    "mixtral": _mixtral_moe,
    "gpt_oss": _mixtral_moe,
    "qwen_moe": _qwen_moe,
    "deepseek": _deepseek_moe,
}
