"""The built-in catalog: contents, name resolution, and its error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servetune.errors import InputError
from servetune.model.catalog import catalog_entry, catalog_names, get_model, serving_reference

REQUIRED = {
    *("llama-2-7b", "llama-2-13b", "llama-2-70b"),
    *("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b"),
    *("mistral-7b", "mixtral-8x7b", "mixtral-8x22b"),
    *("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"),
    *("qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b"),
    *("gemma-2-9b", "gemma-2-27b", "gemma-3-27b", "gemma-3-270m"),
    *("deepseek-v3", "deepseek-v2-lite", "phi-3-mini", "gpt-oss-20b", "gpt-oss-120b"),
}


def test_catalog_has_the_required_models() -> None:
    names = catalog_names()
    assert len(names) >= 24
    assert set(names) >= REQUIRED
    assert names == sorted(names)


@pytest.mark.parametrize("name", catalog_names())
def test_entry_documents_its_source(name: str) -> None:
    entry = catalog_entry(name)
    assert "/" in entry["_source"]  # an HF repo id
    for key in ("_published_params", "_published_active_params"):
        if key in entry:
            assert entry[key]["value"] > 0
            assert entry[key]["source"]
    spec = get_model(name)
    assert spec.name == name
    assert spec.params_total > spec.params_active or spec.moe is None


def test_names_are_case_insensitive() -> None:
    assert get_model("Llama-3.1-8B") == get_model("llama-3.1-8b")
    assert get_model("  qwen3-8b ") == get_model("qwen3-8b")


def test_hf_repo_id_resolves_to_catalog() -> None:
    assert get_model("meta-llama/Llama-3.1-8B").name == "llama-3.1-8b"
    assert get_model("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert get_model("openai/gpt-oss-20b").name == "gpt-oss-20b"
    # Llama 3.3 70B (instruct only) has 3.1 70B's shapes
    assert get_model("meta-llama/Llama-3.3-70B-Instruct").name == "llama-3.3-70b"
    assert get_model("llama-3.3-70b").params_total == get_model("llama-3.1-70b").params_total


@pytest.mark.parametrize("name", catalog_names())
def test_every_entry_names_the_repo_a_server_loads(name: str) -> None:
    repo = serving_reference(name)
    assert repo == catalog_entry(name)["_hf_repo"] and "/" in repo
    assert get_model(repo).name == name  # and it resolves back


def test_engines_get_a_loadable_model_not_the_catalog_id(tmp_path: Path) -> None:
    assert serving_reference("llama-3.1-8b") == "meta-llama/Llama-3.1-8B-Instruct"
    assert serving_reference("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"  # an HF id passes through
    assert serving_reference(str(tmp_path / "config.json")) == str(tmp_path)
    assert serving_reference(str(tmp_path)) == str(tmp_path)


def test_path_to_config(tmp_path: Path) -> None:
    cfg = {k: v for k, v in catalog_entry("mixtral-8x7b").items() if not k.startswith("_")}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    assert spec.params_total == get_model("mixtral-8x7b").params_total
    assert get_model(str(tmp_path / "config.json")) == spec


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(InputError) as info:
        get_model("llama-3.1-7b")
    msg = str(info.value)
    assert "unknown model 'llama-3.1-7b'" in msg
    assert "llama-3.1-8b" in msg
    assert "\n" not in msg


def test_unknown_repo_id_suggests_by_last_part() -> None:
    with pytest.raises(InputError, match="qwen3-32b"):
        get_model("someone/Qwen3-32B-finetune")


@pytest.mark.parametrize(
    ("repo", "base", "method"),
    [
        ("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", "llama-3.1-70b", "fp8"),
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b", "awq"),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", "qwen2.5-72b", "gptq"),
    ],
)
def test_an_unknown_quantized_release_points_at_its_base_in_that_format(
    repo: str, base: str, method: str
) -> None:
    """A third party's quantized release the catalog lacks: the 16-bit base model under
    --quant in the announced format, not a catalog release of another maker (whose KV cache
    or scales may differ)."""
    with pytest.raises(InputError) as info:
        get_model(repo)
    msg = str(info.value)
    assert f"release of {base}? plan {base} with --quant {method}" in msg
    assert f"--set quantization={method}" in msg and "\n" not in msg


def test_missing_json_path() -> None:
    with pytest.raises(InputError, match="no such file"):
        get_model("./does/not/exist/config.json")


def test_catalog_entry_is_a_copy() -> None:
    entry = catalog_entry("llama-2-7b")
    entry["hidden_size"] = 1
    assert catalog_entry("llama-2-7b")["hidden_size"] == 4096
