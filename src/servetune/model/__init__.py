"""Model architecture facts: ModelSpec, parsed from HF config.json or the built-in catalog."""

from servetune.model.catalog import catalog_names, get_model
from servetune.model.hf_config import load_hf_config, spec_from_hf_dict
from servetune.model.spec import MLASpec, ModelSpec, MoESpec

__all__ = [
    "MLASpec",
    "ModelSpec",
    "MoESpec",
    "catalog_names",
    "get_model",
    "load_hf_config",
    "spec_from_hf_dict",
]
