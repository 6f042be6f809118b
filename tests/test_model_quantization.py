"""A checkpoint's own weight format, read from config.json's `quantization_config`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servetune.errors import InputError
from servetune.model.catalog import catalog_entry, catalog_names, get_model
from servetune.model.hf_config import spec_from_hf_dict
from servetune.model.quantization import tensor_class

LINEAR = ("attention", "mlp", "experts", "shared_experts")


def _with_quant(name: str, quant: object) -> dict:
    cfg = {k: v for k, v in catalog_entry(name).items() if not k.startswith("_")}
    return {**cfg, "quantization_config": quant}


def test_deepseek_v3_ships_block_wise_fp8() -> None:
    q = get_model("deepseek-v3").quantization
    assert q is not None and q.method == "fp8"
    (scheme,) = q.schemes
    assert (scheme.bits, scheme.kind, scheme.block, scheme.scale_bits) == (
        8,
        "float",
        (128, 128),
        32,
    )
    assert scheme.classes == LINEAR  # the LM head and embedding stay bf16
    assert scheme.activations == "fp8"


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_gpt_oss_ships_mxfp4_experts(name: str) -> None:
    q = get_model(name).quantization
    assert q is not None and q.method == "mxfp4"
    (scheme,) = q.schemes
    assert scheme.classes == ("experts",)
    assert (scheme.bits, scheme.kind, scheme.group_size, scheme.scale_bits) == (4, "float", 32, 8)


def test_only_the_natively_quantized_catalog_entries_carry_a_format() -> None:
    quantized = {n for n in catalog_names() if get_model(n).quantization is not None}
    qwen_fp8 = {f"qwen3-{s}-fp8" for s in ("8b", "32b", "30b-a3b", "235b-a22b")}
    nvidia_fp8 = {f"llama-3.1-{s}-fp8" for s in ("8b", "70b", "405b")}
    own = {"deepseek-v3", "gpt-oss-20b", "gpt-oss-120b", "minimax-m2.5"}
    assert quantized == {*own, *qwen_fp8, *nvidia_fp8}
    # MiniMax ships block-scaled FP8 only; the router gate (`gate`) and lm_head stay 16-bit
    (scheme,) = get_model("minimax-m2.5").quantization.schemes
    assert (scheme.bits, scheme.block) == (8, (128, 128))
    assert "lm_head" not in scheme.classes and "router" not in scheme.classes
    # Qwen's FP8 release: the bf16 model's shape, fine-grained FP8 weights
    fp8, bf16 = get_model("qwen3-235b-a22b-fp8"), get_model("qwen3-235b-a22b")
    assert fp8.params_total == bf16.params_total
    (scheme,) = fp8.quantization.schemes
    assert (scheme.bits, scheme.block, scheme.activations) == (8, (128, 128), "fp8")


@pytest.mark.parametrize(("size", "kv"), [("8B", None), ("70B", "fp8"), ("405B", None)])
def test_nvidia_llama_fp8_releases_resolve_from_their_repo_ids(size: str, kv: str | None) -> None:
    """NVIDIA's ModelOpt FP8 releases of Llama 3.1: the 16-bit model's shape, per-tensor FP8
    in the blocks' linear layers, the LM head 16-bit; only the 70B's config declares an FP8
    KV cache (the copy AIConfigurator keeps), the others leave it null (TensorRT-LLM's guide)."""
    spec = get_model(f"nvidia/Llama-3.1-{size}-Instruct-FP8")
    bf16 = get_model(f"llama-3.1-{size.lower()}")
    assert spec.name == f"llama-3.1-{size.lower()}-fp8"
    assert spec.params_total == bf16.params_total
    q = spec.quantization
    assert q is not None and q.method == "modelopt" and q.kv_cache == kv
    (scheme,) = q.schemes
    assert (scheme.bits, scheme.block, scheme.activations) == (8, None, "fp8")
    assert scheme.classes == LINEAR  # every linear class but the LM head


@pytest.mark.parametrize(
    ("module", "cls"),
    [
        ("model.layers.*.self_attn", "attention"),
        ("model.layers.*.mlp.router", "router"),
        ("re:.*mlp.gate$", "router"),
        ("block_sparse_moe.gate", "router"),
        ("re:.*mlp.experts.*", "experts"),
        ("model.layers.*.mlp.shared_experts", "shared_experts"),
        ("re:.*gate_proj", "mlp"),
        ("model.embed_tokens", "embedding"),
        ("lm_head", "lm_head"),
        ("model.layers.0.mlp.down_proj", None),  # one layer's exception: not a class
        ("model.norm", None),
    ],
)
def test_module_names_map_to_tensor_classes(module: str, cls: str | None) -> None:
    assert tensor_class(module) == cls


def test_compressed_tensors_groups_targets_and_ignore() -> None:
    # llm-compressor W4A16 on the experts, FP8 dynamic elsewhere, LM head ignored.
    quant = {
        "quant_method": "compressed-tensors",
        "format": "mixed-precision",
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "config_groups": {
            "group_0": {
                "targets": ["re:.*mlp.experts.*"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                            "group_size": 128, "symmetric": False},
            },
            "group_1": {
                "targets": ["re:.*self_attn.*"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
            },
        },
    }  # fmt: skip
    q = spec_from_hf_dict(_with_quant("qwen3-30b-a3b", quant), "q").quantization
    assert q is not None and q.method == "compressed-tensors"
    experts, attention = q.schemes
    assert (experts.classes, experts.bits, experts.group_size) == (("experts",), 4, 128)
    assert experts.zero_bits == 4 and experts.scale_bits == 16  # asymmetric: a zero per group
    assert (attention.classes, attention.bits, attention.group_size) == (("attention",), 8, None)
    assert attention.activations == "fp8"


def test_compressed_tensors_linear_target_covers_the_lm_head_unless_ignored() -> None:
    weights = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
    group = {"targets": ["Linear"], "weights": weights}
    base = {"quant_method": "compressed-tensors", "config_groups": {"g": group}}
    kept = spec_from_hf_dict(_with_quant("llama-3.1-8b", base), "a").quantization
    dropped = spec_from_hf_dict(
        _with_quant("llama-3.1-8b", {**base, "ignore": ["lm_head"]}), "b"
    ).quantization
    assert kept is not None and dropped is not None
    assert kept.schemes[0].classes == (*LINEAR, "lm_head")
    assert dropped.schemes[0].classes == LINEAR
    assert kept.schemes[0].scale_bits == 8  # NVFP4: fp8 e4m3 scale per 16 values


def test_awq_and_gptq_read_bits_and_groups() -> None:
    awq = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
           "modules_to_not_convert": ["gate"]}  # fmt: skip
    q = spec_from_hf_dict(_with_quant("mixtral-8x7b", awq), "m").quantization
    assert q is not None
    assert (q.schemes[0].bits, q.schemes[0].group_size, q.schemes[0].zero_bits) == (4, 64, 4)
    gptq = {"quant_method": "gptq", "bits": 8, "group_size": -1, "lm_head": True}
    g = spec_from_hf_dict(_with_quant("llama-3.1-8b", gptq), "l").quantization
    assert g is not None
    assert (g.schemes[0].bits, g.schemes[0].group_size) == (8, None)  # -1: one scale per row
    assert "lm_head" in g.schemes[0].classes


def test_unknown_method_is_kept_without_a_size_rule() -> None:
    q = spec_from_hf_dict(_with_quant("llama-3.1-8b", {"quant_method": "bitsandbytes"}), "l")
    assert q.quantization is not None
    assert q.quantization.method == "bitsandbytes" and q.quantization.schemes == ()


@pytest.mark.parametrize(
    ("quant", "field"),
    [
        ("fp8", "quantization_config"),
        ({"bits": 4}, "quantization_config.quant_method"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
        ({"quant_method": "awq", "bits": "four"}, "quantization_config.bits"),
        ({"quant_method": "compressed-tensors"}, "config_groups"),
        ({"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
    ],
)
def test_bad_quantization_config_is_one_line_naming_the_field(quant: object, field: str) -> None:
    with pytest.raises(InputError) as info:
        spec_from_hf_dict(_with_quant("llama-3.1-8b", quant), "m", source="config.json")
    assert field in info.value.field and "\n" not in str(info.value)


# NVIDIA's ModelOpt FP8 checkpoints (nvidia/Llama-3.1-8B-Instruct-FP8 and kin): the config
# form, and the hf_quant_config.json form with the fields under "quantization"
MODELOPT_FP8 = {
    "quant_method": "modelopt",
    "quant_algo": "FP8",
    "kv_cache_quant_algo": "FP8",
    "exclude_modules": ["lm_head"],
}


@pytest.mark.parametrize(
    "quant",
    [
        MODELOPT_FP8,
        {
            "quant_method": "modelopt",
            "quantization": {k: v for k, v in MODELOPT_FP8.items() if k != "quant_method"},
        },
    ],
)
def test_modelopt_fp8_is_per_tensor_w8a8_and_declares_its_kv_cache(quant: dict) -> None:
    q = spec_from_hf_dict(_with_quant("llama-3.1-8b", quant), "l").quantization
    assert q is not None and q.method == "modelopt" and q.kv_cache == "fp8"
    (scheme,) = q.schemes
    assert (scheme.bits, scheme.kind, scheme.block, scheme.activations) == (8, "float", None, "fp8")
    assert scheme.classes == LINEAR  # the LM head excluded, as the checkpoint says


@pytest.mark.parametrize(
    ("kv", "declared"),
    [
        ({"kv_cache_quant_algo": None}, None),
        ({"kv_cache_quant_algo": "fp8"}, "fp8"),
        ({"kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}}, "fp8"),
        ({"kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": True}}, None),
        ({"kv_cache_quant_algo": "NVFP4"}, None),  # vLLM falls back to auto
    ],
)
def test_the_kv_cache_a_modelopt_config_declares_as_vllm_reads_it(
    kv: dict, declared: str | None
) -> None:
    quant = {"quant_method": "modelopt", "quant_algo": "FP8", **kv}
    q = spec_from_hf_dict(_with_quant("llama-3.1-8b", quant), "l").quantization
    assert q is not None and q.kv_cache == declared


def test_modelopt_nvfp4_keeps_its_kv_cache_but_has_no_size_rule() -> None:
    quant = {"quant_method": "modelopt_fp4", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}
    q = spec_from_hf_dict(_with_quant("llama-3.1-8b", quant), "l").quantization
    assert q is not None and q.schemes == () and q.kv_cache == "fp8"
    assert "no size rule" in q.summary


def test_a_targets_alternation_names_each_alternative() -> None:
    """llm-compressor spells targets `re:.*mlp.(down|gate|up)_proj$`: the MLP's three
    projections. Read whole, its `|gate|` was the router and the MLP stayed 16-bit
    (Llama-3.1-8B W4A16 planned at 13.1 GiB, not 5.3)."""
    from servetune.model.quantization import tensor_classes

    assert tensor_classes("re:.*mlp.(down|gate|up)_proj$") == {"mlp"}
    assert tensor_classes("re:.*self_attn.(k|q|o|v)_proj$") == {"attention"}
    assert tensor_classes("re:.*(self_attn|mlp).*") == {"attention", "mlp"}
    assert tensor_classes("re:.*mlp.gate$") == {"router"}
    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
    spelled = ["re:.*self_attn.(k|q|o|v)_proj$", "re:.*mlp.(down|gate|up)_proj$"]
    quant = {"quant_method": "compressed-tensors", "ignore": ["lm_head"],
             "config_groups": {"g": {"targets": spelled, "weights": weights}}}  # fmt: skip
    q = spec_from_hf_dict(_with_quant("llama-3.1-8b", quant), "q").quantization
    assert q is not None and set(q.schemes[0].classes) == {"attention", "mlp"}


def test_a_checkpoints_own_weight_only_format_runs_at_marlin_speed() -> None:
    """Llama-3.1-8B shipped as AWQ: the simulator priced its 16-bit body at bf16's GEMMs
    (TPOT 8.66 ms, as bf16); it now runs as `--set quantization=awq` does."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.sim.engine import simulate
    from servetune.workload.spec import parse_workload

    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    shipped = spec_from_hf_dict(_with_quant("llama-3.1-8b", awq), "awq")
    wl = parse_workload({"count": 16, "arrival": {"kind": "closed", "concurrency": 8},
                         "input_tokens": 1000, "output_tokens": 50})  # fmt: skip
    hw = get_hardware("h100-sxm")

    def tpot(model, cfg):
        return simulate(model, hw, cfg, wl)[0].metrics.tpot_ms.p50

    own = tpot(shipped, EngineConfig())
    asked = tpot(get_model("llama-3.1-8b"), EngineConfig(quantization="awq"))
    bf16 = tpot(get_model("llama-3.1-8b"), EngineConfig())
    assert own == pytest.approx(asked, rel=0.02) and own < 0.8 * bf16


def test_a_known_method_whose_variant_has_no_rule_names_the_variant() -> None:
    """ModelOpt NVFP4 read "'modelopt' has no size rule (known: ..., modelopt, ...)"."""
    from servetune.plan.quant import checkpoint_format

    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}
    with pytest.raises(InputError) as exc:
        checkpoint_format(spec_from_hf_dict(_with_quant("llama-3.1-8b", quant), "nv"))
    assert exc.value.field == "nv: quantization_config.quant_algo"
    assert exc.value.problem.startswith("modelopt NVFP4 has no size rule")
    with pytest.raises(InputError) as exc:
        checkpoint_format(
            spec_from_hf_dict(_with_quant("llama-3.1-8b", {"quant_method": "hqq"}), "h")
        )
    assert exc.value.problem.startswith("'hqq' has no size rule")


def test_a_tied_embedding_stays_16_bit_under_a_scheme_that_names_the_lm_head() -> None:
    """vLLM ties Llama-3.2-1B's LM head to its embedding, which no checkpoint scheme
    quantizes: a W4A16 `Linear` target (LM head included) planned it at 4 bits, 0.59 GiB
    against 0.96 with the head ignored. A GGUF still stores it at the head's type."""
    from servetune.plan.quant import WEIGHT_FORMATS, checkpoint_format, weights_bytes

    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
    base = {"quant_method": "compressed-tensors",
            "config_groups": {"g": {"targets": ["Linear"], "weights": weights}}}  # fmt: skip

    def size(quant: dict) -> float:
        spec = spec_from_hf_dict(_with_quant("llama-3.2-1b", quant), "t")
        return weights_bytes(spec, checkpoint_format(spec))

    assert size(base) == pytest.approx(size({**base, "ignore": ["lm_head"]}))
    # a GGUF stores the tied tensor at the output type: Q4_K_M's Q6_K, not Q4_K
    tied, q4 = get_model("llama-3.2-1b"), WEIGHT_FORMATS["q4_k_m"]
    as_embedding = replace(q4, lm_head_bits=q4.embedding_bits)
    gain = tied.params_embedding * (q4.lm_head_bits - q4.embedding_bits) / 8
    assert weights_bytes(tied, q4) - weights_bytes(tied, as_embedding) == pytest.approx(gain)
