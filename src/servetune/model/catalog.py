"""Built-in model catalog: `data/models/<short-name>.json`, HF config.json facts.

Planning a well-known model should not need a download, so the catalog keeps the
config fields servetune reads (a checkpoint that ships quantized keeps its
`quantization_config` too), with `_source` (the HF repo the facts come from),
`_hf_repo` (the repo a server loads: the instruct/chat release) and the published
parameter counts the tests check the computed ones against.
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servetune.errors import InputError, closest
from servetune.model.hf_config import load_hf_config, spec_from_hf_dict
from servetune.model.spec import ModelSpec

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_SUFFIX = ".json"


def _catalog_dir() -> Traversable:
    return resources.files("servetune").joinpath("data", "models")


@lru_cache(maxsize=1)
def _catalog_files() -> dict[str, Traversable]:
    """Short name (lower case) -> catalog file."""
    return {
        entry.name[: -len(_SUFFIX)].lower(): entry
        for entry in _catalog_dir().iterdir()
        if entry.name.endswith(_SUFFIX) and entry.is_file()
    }


def catalog_names() -> list[str]:
    """Short names of the built-in models, sorted."""
    return sorted(_catalog_files())


@cache
def _load_entry(name: str) -> dict[str, Any]:
    return json.loads(_catalog_files()[name].read_text(encoding="utf-8"))


def catalog_entry(name: str) -> dict[str, Any]:
    """The raw catalog dict (config facts plus `_source` / `_published_*`), a copy."""
    key = name.strip().lower()
    if key not in _catalog_files():
        raise _unknown(name)
    return json.loads(json.dumps(_load_entry(key)))


@cache
def _catalog_spec(name: str) -> ModelSpec:
    return spec_from_hf_dict(_load_entry(name), name, source=f"catalog model {name}")


@lru_cache(maxsize=1)
def _by_source() -> dict[str, str]:
    """HF repo id (lower case) -> short name, so `meta-llama/Llama-3.1-8B` and
    `meta-llama/Llama-3.1-8B-Instruct` also resolve."""
    out: dict[str, str] = {}
    for name in catalog_names():
        entry = _load_entry(name)
        for key in ("_source", "_hf_repo"):
            if isinstance(entry.get(key), str):
                out[entry[key].lower()] = name
    return out


def serving_reference(given: str) -> str:
    """What an engine's --model should be: a catalog name becomes the HF repo a server
    loads (`_hf_repo`); a path stays the user's (config.json's directory for a config
    file); an HF repo id passes through."""
    key = given.strip().lower()
    if key in _catalog_files():
        entry = _load_entry(key)
        return str(entry.get("_hf_repo") or entry["_source"])
    path = Path(given.strip()).expanduser()
    return str(path.parent if path.name == "config.json" else given.strip())


def get_model(name_or_path: str) -> ModelSpec:
    """A ModelSpec from a catalog short name (any case), its HF repo id, or a local path.

    A local path is a `config.json` or a model directory holding one.
    """
    raw = name_or_path.strip()
    key = raw.lower()
    if key in _catalog_files():
        return _catalog_spec(key)
    path = Path(raw).expanduser()
    if raw and path.exists():
        return load_hf_config(path)
    if key in _by_source():
        return _catalog_spec(_by_source()[key])
    if key.endswith(_SUFFIX) or raw.startswith((".", "/", "~")):
        raise InputError(
            raw, "no such file or directory", "give a config.json or a model directory"
        )
    raise _unknown(raw)


def _unknown(name: str) -> InputError:
    release = _quantized_release(name)
    if release is not None:
        # A third party's quantized release of a catalog model (RedHatAI/...-FP8,
        # ...-AWQ): its 16-bit base model in that format is the nearest plan.
        stem, method = release
        plain = [n for n in catalog_names() if "quantization_config" not in _load_entry(n)]
        base = closest(stem, plain)
        if base:
            article = "a" if method == "gptq" else "an"
            return InputError(
                "model",
                f"unknown model {name!r}",
                f"{article} {method.upper()} release of {base[0]}? plan {base[0]} with "
                f"--quant {method} (simulate: --set quantization={method}), or give the "
                "release's config.json",
            )
    hints = closest(name, catalog_names())
    if not hints:
        # An HF repo id's last part often names the model ("meta-llama/Llama-3.1-8B").
        hints = closest(name.rsplit("/", 1)[-1], catalog_names())
    did_you_mean = f"did you mean {', '.join(hints)}? " if hints else ""
    return InputError(
        "model",
        f"unknown model {name!r}",
        f"{did_you_mean}give a catalog name (e.g. llama-3.1-8b) "
        "or a path to a config.json or model directory",
    )


def _quantized_release(name: str) -> tuple[str, str] | None:
    """(the name without it, the weight format) where a repo name announces a format
    servetune knows the size of (`-FP8`, `-AWQ`, `-GPTQ-Int4`, `-INT8`)."""
    parts = name.rsplit("/", 1)[-1].lower().replace("_", "-").split("-")
    for method in ("fp8", "awq", "gptq", "int8"):
        if method in parts:
            keep = [p for p in parts if p not in (method, "int4", "dynamic", "w8a8", "instruct")]
            return "-".join(keep), method
    return None
