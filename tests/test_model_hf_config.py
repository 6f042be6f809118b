"""Parsing HF config.json files into ModelSpec, family by family, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servetune.errors import InputError
from servetune.model.catalog import catalog_entry, get_model
from servetune.model.hf_config import load_hf_config, spec_from_hf_dict


def _strip(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def _write(tmp_path: Path, cfg: dict | str, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return path


# ---------------------------------------------------------------- families


def test_gemma3_nested_text_config_uses_class_defaults() -> None:
    spec = get_model("gemma-3-27b")
    assert spec.architecture == "Gemma3ForConditionalGeneration"
    assert spec.model_type == "gemma3_text"
    assert (spec.num_layers, spec.hidden_size, spec.head_dim) == (62, 5376, 128)
    assert spec.vocab_size == 262208  # Gemma3TextConfig default; the file omits it
    assert spec.max_position_embeddings == 131072
    assert spec.tie_word_embeddings and spec.params_lm_head == 0


def test_wrapper_dtype_wins_over_text_config() -> None:
    cfg = _strip(catalog_entry("gemma-3-27b"))
    cfg["text_config"] = {**cfg["text_config"], "torch_dtype": "float32"}
    assert spec_from_hf_dict(cfg, "g").torch_dtype == "bfloat16"


def test_gemma1_ties_embeddings_by_default() -> None:
    # google/gemma-7b shapes; GemmaConfig defaults tie_word_embeddings to True.
    cfg = {
        "architectures": ["GemmaForCausalLM"],
        "hidden_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "intermediate_size": 24576,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
    }
    spec = spec_from_hf_dict(cfg, "gemma-7b")
    assert spec.model_type == "gemma" and spec.params_lm_head == 0
    assert abs(spec.params_total - 8.54e9) / 8.54e9 < 0.02  # Gemma report: 8.54B


def test_gemma3_sliding_five_of_six() -> None:
    spec = get_model("gemma-3-27b")  # sliding_window_pattern 6 (default)
    assert spec.sliding_window == 1024
    assert (spec.sliding_window_layers, spec.full_attention_layers) == (52, 10)
    small = get_model("gemma-3-270m")  # explicit layer_types
    assert (small.sliding_window_layers, small.full_attention_layers) == (15, 3)


def test_gemma3_pattern_and_layer_types_agree() -> None:
    cfg = _strip(catalog_entry("gemma-3-270m"))
    pattern_only = {k: v for k, v in cfg.items() if k != "layer_types"}
    pattern_only["sliding_window_pattern"] = 6
    assert spec_from_hf_dict(pattern_only, "x").sliding_window_layers == 15


def test_gemma2_alternates() -> None:
    for name, layers in [("gemma-2-9b", 42), ("gemma-2-27b", 46)]:
        spec = get_model(name)
        assert spec.num_layers == layers
        assert spec.sliding_window == 4096
        assert spec.sliding_window_layers == layers // 2


def test_mistral_sliding_window() -> None:
    v01 = get_model("mistral-7b-v0.1")
    assert (v01.sliding_window, v01.sliding_window_layers) == (4096, 32)
    v03 = get_model("mistral-7b")
    assert (v03.sliding_window, v03.sliding_window_layers) == (None, 0)


def test_qwen_window_only_when_enabled() -> None:
    cfg = _strip(catalog_entry("qwen2.5-7b"))
    assert spec_from_hf_dict(cfg, "q").sliding_window_layers == 0
    enabled = {**cfg, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    spec = spec_from_hf_dict(enabled, "q")
    assert (spec.sliding_window, spec.sliding_window_layers) == (4096, 8)


def test_window_as_long_as_context_is_no_window() -> None:
    cfg = {**_strip(catalog_entry("phi-3-mini")), "sliding_window": 262144}
    spec = spec_from_hf_dict(cfg, "phi")
    assert (spec.sliding_window, spec.sliding_window_layers) == (None, 0)


def test_deepseek_mla_and_moe() -> None:
    spec = get_model("deepseek-v3")
    assert spec.mla is not None and spec.moe is not None
    assert (spec.mla.kv_lora_rank, spec.mla.q_lora_rank) == (512, 1536)
    assert spec.head_dim == 128 + 64
    assert (spec.moe.num_experts, spec.moe.experts_per_token) == (256, 8)
    assert (spec.moe.num_shared_experts, spec.moe.first_dense_layers) == (1, 3)
    lite = get_model("deepseek-v2-lite")
    assert lite.mla is not None and lite.mla.q_lora_rank is None
    assert lite.moe is not None and lite.moe.num_shared_experts == 2


def test_qwen3_moe() -> None:
    spec = get_model("qwen3-30b-a3b")
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.experts_per_token) == (128, 8)
    assert spec.moe.expert_intermediate_size == 768
    assert (spec.num_kv_heads, spec.head_dim) == (4, 128)


def test_qwen3_moe_partial_layers_rejected() -> None:
    cfg = {**_strip(catalog_entry("qwen3-30b-a3b")), "mlp_only_layers": [0]}
    with pytest.raises(InputError, match="decoder_sparse_step"):
        spec_from_hf_dict(cfg, "q")


def test_minimax_m2() -> None:
    """MiniMax-M2.5's config.json (Mixtral's MoE keys, every layer MoE), its block-scaled
    FP8 checkpoint, and its q/k norm over all heads (`qk_norm_type: per_layer`), which
    only a config that says so (and keeps `use_qk_norm`) gets."""
    spec = get_model("MiniMaxAI/MiniMax-M2.5")
    assert spec.name == "minimax-m2.5" and spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.experts_per_token) == (256, 8)
    assert spec.moe.expert_intermediate_size == 1536 and spec.moe.first_dense_layers == 0
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (48, 8, 128)
    assert spec.quantization is not None and spec.quantization.method == "fp8"
    assert spec.qk_norm_across_heads
    cfg = _strip(catalog_entry("minimax-m2.5"))
    assert not spec_from_hf_dict({**cfg, "use_qk_norm": False}, "m").qk_norm_across_heads
    del cfg["qk_norm_type"]
    assert not spec_from_hf_dict(cfg, "m").qk_norm_across_heads


def test_phi3() -> None:
    spec = get_model("phi-3-mini")
    assert spec.architecture == "Phi3ForCausalLM"
    assert (spec.head_dim, spec.num_kv_heads) == (96, 32)
    assert (spec.sliding_window, spec.sliding_window_layers) == (2047, 32)


def test_gpt_oss() -> None:
    spec = get_model("gpt-oss-120b")
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.experts_per_token) == (128, 4)
    assert (spec.sliding_window, spec.sliding_window_layers) == (128, 18)
    cfg = _strip(catalog_entry("gpt-oss-20b"))
    del cfg["layer_types"], cfg["num_experts_per_tok"]  # falls back to alternation / alias
    spec = spec_from_hf_dict(cfg, "g")
    assert spec.sliding_window_layers == 12 and spec.moe is not None
    assert spec.moe.experts_per_token == 4


def test_defaults_head_dim_and_kv_heads() -> None:
    cfg = _strip(catalog_entry("llama-2-7b"))
    cfg.pop("num_key_value_heads")
    spec = spec_from_hf_dict(cfg, "l")
    assert (spec.head_dim, spec.num_kv_heads) == (128, 32)


@pytest.mark.parametrize(
    ("name", "drop", "expect"),
    [
        # Qwen3Config's head_dim is 128 (5,120 / 64 would be 80)
        ("qwen3-32b", ("head_dim",), {"head_dim": 128}),
        # MistralConfig's num_key_value_heads is 8, not the heads
        ("mistral-7b", ("num_key_value_heads",), {"num_kv_heads": 8}),
        # Gemma2Config's 4 KV heads (gemma-2-9b's config gives its own 8)
        ("gemma-2-9b", ("num_key_value_heads",), {"num_kv_heads": 4}),
    ],
)
def test_a_field_a_config_leaves_out_is_its_hf_class_default(name, drop, expect) -> None:
    """What transformers' config class would fill in, not what servetune would derive."""
    cfg = _strip(catalog_entry(name))
    for key in drop:
        cfg.pop(key, None)
        cfg.get("text_config", {}).pop(key, None)
    spec = spec_from_hf_dict(cfg, "c")
    assert {k: getattr(spec, k) for k in expect} == expect


def test_gemma3_4b_it_text_config_as_shipped_reads_the_class_defaults() -> None:
    """google/gemma-3-4b-it's text_config gives no heads, KV heads nor head_dim: 8, 4 and
    256 by Gemma3TextConfig (34 x 2 x 4 x 256 x 2 = 139,264 B a token); it was refused,
    and with the heads added, derived at 348,160 B."""
    text = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 34, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}  # fmt: skip
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": text, "torch_dtype": "bfloat16"}  # fmt: skip
    spec = spec_from_hf_dict(cfg, "g")
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (8, 4, 256)
    assert spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 2 == 139_264


def test_architecture_only_config() -> None:
    cfg = _strip(catalog_entry("llama-3.1-8b"))
    del cfg["model_type"]
    assert spec_from_hf_dict(cfg, "l").model_type == "llama"


def test_llama_attention_bias_switch() -> None:
    cfg = _strip(catalog_entry("llama-3.2-1b"))
    plain = spec_from_hf_dict(cfg, "a")
    biased = spec_from_hf_dict({**cfg, "attention_bias": True}, "b")
    q, kv, hidden = 32 * 64, 8 * 64, 2048
    assert biased.params_total - plain.params_total == 16 * (q + 2 * kv + hidden)


# ---------------------------------------------------------------- files


def test_load_file_and_directory(tmp_path: Path) -> None:
    model_dir = tmp_path / "My-Model"
    model_dir.mkdir()
    _write(model_dir, _strip(catalog_entry("qwen3-8b")))
    by_dir = load_hf_config(model_dir)
    by_file = load_hf_config(model_dir / "config.json")
    assert by_dir == by_file
    assert by_dir.name == "My-Model"
    assert by_dir.params_total == get_model("qwen3-8b").params_total


def test_bad_json(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"hidden_size": 4096,')
    with pytest.raises(InputError, match="not valid JSON") as info:
        load_hf_config(path)
    assert "\n" not in str(info.value)


def test_json_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not an object"):
        load_hf_config(_write(tmp_path, "[1, 2]"))


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no config.json"):
        load_hf_config(tmp_path)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_hf_config(tmp_path / "nope" / "config.json")


# ---------------------------------------------------------------- errors


def test_missing_fields_named_in_one_line() -> None:
    cfg = {"model_type": "llama", "num_attention_heads": 32, "vocab_size": 32000}
    with pytest.raises(InputError) as info:
        spec_from_hf_dict(cfg, "x")
    msg = str(info.value)
    assert msg == (
        "config.json: missing fields num_hidden_layers, hidden_size, intermediate_size, "
        "max_position_embeddings (a decoder-only HF config is needed)"
    )


def test_missing_family_fields() -> None:
    cfg = _strip(catalog_entry("deepseek-v3"))
    del cfg["kv_lora_rank"], cfg["n_routed_experts"]
    with pytest.raises(InputError, match="missing fields kv_lora_rank, n_routed_experts"):
        spec_from_hf_dict(cfg, "x")


def test_empty_config_names_model_type() -> None:
    with pytest.raises(InputError, match=r"missing fields model_type, num_hidden_layers"):
        spec_from_hf_dict({}, "x")


def test_unknown_architecture() -> None:
    cfg = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768}
    with pytest.raises(InputError, match="unsupported architecture 'bert'") as info:
        spec_from_hf_dict(cfg, "x")
    assert "llama" in str(info.value)


@pytest.mark.parametrize("bad", ["4096", 40.5, True, -1, 0])
def test_bad_values_are_input_errors(bad: object) -> None:
    cfg = {**_strip(catalog_entry("llama-2-7b")), "hidden_size": bad}
    with pytest.raises(InputError, match="hidden_size"):
        spec_from_hf_dict(cfg, "x")
