"""Parameter counts: computed from shapes, checked against published figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servetune.model.catalog import catalog_entry, catalog_names, get_model
from servetune.model.hf_config import spec_from_hf_dict
from servetune.model.params import Traits, count_params, gated_mlp_params

TOLERANCE = 0.02


def _tolerance(published: dict) -> float:
    """2%, or the published figure's own rounding step when that is coarser (e.g. '2.4B')."""
    return max(TOLERANCE * published["value"], published.get("precision", 0))


@pytest.mark.parametrize("name", catalog_names())
def test_total_params_match_published(name: str) -> None:
    published = catalog_entry(name)["_published_params"]
    spec = get_model(name)
    assert abs(spec.params_total - published["value"]) <= _tolerance(published), (
        f"{name}: computed {spec.params_total:,} vs published {published['value']:,}"
    )


@pytest.mark.parametrize("name", catalog_names())
def test_active_params_match_published(name: str) -> None:
    entry = catalog_entry(name)
    spec = get_model(name)
    published = entry.get("_published_active_params")
    if spec.moe is None:
        assert published is None
        assert spec.params_active == spec.params_total
        return
    assert published is not None, f"{name}: MoE entries need _published_active_params"
    # DeepSeek and OpenAI publish active counts without the input embedding table.
    active = spec.params_active
    if "embedding" in published.get("excludes", []):
        active -= spec.params_embedding
    assert abs(active - published["value"]) <= _tolerance(published), (
        f"{name}: computed active {active:,} vs published {published['value']:,}"
    )


def test_llama_2_7b_exact() -> None:
    # 32 x (4*4096^2 attn + 3*4096*11008 MLP + 2*4096 norms) + 2*32000*4096 + 4096.
    spec = get_model("llama-2-7b")
    assert spec.params_total == 6_738_415_616
    assert spec.params_embedding == spec.params_lm_head == 32000 * 4096


def test_gemma_2_exact_against_paper_table() -> None:
    # Gemma 2 report, Table 2: embedding and non-embedding parameters.
    for name, emb, body in [
        ("gemma-2-9b", 917_504_000, 8_324_201_984),
        ("gemma-2-27b", 1_179_648_000, 26_047_480_320),
    ]:
        spec = get_model(name)
        assert spec.params_embedding == emb
        assert spec.params_lm_head == 0  # tied
        assert spec.params_body == body


def test_llama_3_1_8b_exact() -> None:
    assert get_model("llama-3.1-8b").params_total == 8_030_261_248


def test_deepseek_v3_main_model_exact() -> None:
    # 61 MLA layers, 3 dense + 58 MoE layers (256 routed + 1 shared), no MTP module.
    assert get_model("deepseek-v3").params_total == 671_026_419_200


def test_gpt_oss_120b_classes_from_shapes() -> None:
    """36 layers, hidden 2880, 128 experts of width 2880, GQA 64 x 64 query / 8 x 64 KV."""
    c = get_model("gpt-oss-120b").params_classes
    assert c.experts == 36 * 128 * 3 * 2880 * 2880 == 114_661_785_600
    assert c.attention == 36 * (2880 * (4096 + 2 * 512) + 4096 * 2880)
    assert c.router == 36 * 2880 * 128
    assert c.mlp == c.shared_experts == 0


def test_deepseek_v3_classes_from_shapes() -> None:
    c = get_model("deepseek-v3").params_classes
    # q_a 7168x1536, q_b 1536x(128x192), kv_a 7168x576, kv_b 512x(128x256), o (128x128)x7168
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert c.attention == 61 * mla
    assert c.mlp == 3 * 3 * 7168 * 18432  # first_k_dense_replace = 3
    assert c.experts == 58 * 256 * 3 * 7168 * 2048
    assert c.shared_experts == 58 * 3 * 7168 * 2048
    assert c.router == 58 * 7168 * 256


@pytest.mark.parametrize("name", catalog_names())
def test_classes_are_the_body_bar_its_vectors(name: str) -> None:
    """What the classes leave of the body is norms, biases and sinks: under 0.5%."""
    spec = get_model(name)
    rest = spec.params_body - sum(spec.params_classes.model_dump().values())
    assert 0 < rest < 0.005 * spec.params_body


def test_qwen2_bias_terms_counted() -> None:
    spec = get_model("qwen2.5-7b")
    q_dim, kv_dim = 28 * 128, 4 * 128
    no_bias = count_params(spec, Traits(qkv_bias=False))
    with_bias = count_params(spec, Traits(qkv_bias=True))
    assert with_bias.total - no_bias.total == 28 * (q_dim + 2 * kv_dim)


def test_gated_mlp_is_three_matrices() -> None:
    assert gated_mlp_params(10, 7) == 3 * 10 * 7
    assert gated_mlp_params(10, 7, bias=True) == 3 * 10 * 7 + 2 * 7 + 10


def _llama_dict(layers: int, hidden: int, heads: int, inter: int, tied: bool) -> dict:
    return {
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": inter,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": tied,
    }


_shapes = st.tuples(
    st.integers(1, 64),  # layers
    st.sampled_from([64, 128, 256, 512]),  # hidden
    st.sampled_from([1, 2, 4, 8]),  # heads
    st.integers(1, 4096),  # intermediate
    st.booleans(),  # tied
)


@given(_shapes)
def test_params_grow_with_layers(shape: tuple[int, int, int, int, bool]) -> None:
    layers, hidden, heads, inter, tied = shape
    small = spec_from_hf_dict(_llama_dict(layers, hidden, heads, inter, tied), "a")
    big = spec_from_hf_dict(_llama_dict(layers + 1, hidden, heads, inter, tied), "b")
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    assert big.params_total - small.params_total == per_layer
    assert small.params_lm_head == (0 if tied else 1000 * hidden)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 3))
def test_moe_active_grows_with_experts_per_token(k: int, extra: int, dense: int) -> None:
    base = {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 512,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
        "n_routed_experts": 16,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": dense,
    }
    a = spec_from_hf_dict({**base, "num_experts_per_tok": k}, "a")
    b = spec_from_hf_dict({**base, "num_experts_per_tok": k + extra}, "b")
    assert a.params_total == b.params_total  # routing does not change the weights held
    expert = 3 * 64 * 32
    assert b.params_active - a.params_active == (4 - min(dense, 4)) * extra * expert
    assert a.params_active <= a.params_total
