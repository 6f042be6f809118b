"""User hardware files (--hardware-file): adding, overriding, and every way they can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servetune.errors import InputError
from servetune.hardware.catalog import (
    get_hardware,
    hardware_aliases,
    hardware_names,
    load_hardware_file,
)

MY_GPU = {
    "display_name": "My GPU 48GB",
    "vendor": "acme",
    "memory_gib": 48,
    "memory_bandwidth_gbs": 1000,
    "tflops": {"fp32": 50, "bf16": 200, "fp8": 400},
    "devices_per_node": 4,
    "interconnect": "pcie",
    "interconnect_gbs": 32,
    "source": "acme my-gpu datasheet rev 1",
}


def _yaml(tmp_path: Path, text: str, name: str = "hw.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _json(tmp_path: Path, data: object, name: str = "hw.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _one_line_error(name: str, path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        get_hardware(name, extra_file=path)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2
    return info.value


def test_json_file_adds_an_entry(tmp_path: Path) -> None:
    path = _json(tmp_path, {"My-GPU": MY_GPU})
    spec = get_hardware("my-gpu", extra_file=path)
    assert spec.name == "my-gpu"  # the name comes from the key, normalized
    assert spec.memory_gib == 48
    assert spec.tflops["fp8"] == 400
    assert get_hardware("MY_GPU", extra_file=str(path)) == spec
    assert "my-gpu" in hardware_names(path)
    assert "my-gpu" not in hardware_names()  # built-ins untouched
    assert get_hardware("h100", extra_file=path).name == "h100-sxm"  # built-ins still there


def test_yaml_file_with_sections_and_aliases(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        """
hardware:
  my-gpu:
    display_name: My GPU
    vendor: acme
    memory_gib: 48
    memory_bandwidth_gbs: 1000
    tflops: {bf16: 200}
    source: acme sheet
aliases:
  mine: my-gpu
  big: h200
""",
    )
    assert get_hardware("mine", extra_file=path).name == "my-gpu"
    assert get_hardware("big", extra_file=path).name == "h200"
    assert hardware_aliases(path)["mine"] == "my-gpu"
    loaded = load_hardware_file(path)
    assert list(loaded) == ["my-gpu"]
    assert loaded["my-gpu"].devices_per_node == 8  # HardwareSpec default


def test_override_changes_only_given_fields(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "h100-sxm:\n  node_interconnect_gbs: 100\n  devices_per_node: 4\n")
    builtin = get_hardware("h100-sxm")
    spec = get_hardware("h100", extra_file=path)  # alias resolves to the overridden entry
    assert spec.node_interconnect_gbs == 100
    assert spec.devices_per_node == 4
    assert spec.memory_bandwidth_gbs == builtin.memory_bandwidth_gbs
    assert spec.tflops == builtin.tflops
    assert "overridden" in spec.source and str(path) in spec.source
    assert get_hardware("h100-sxm").node_interconnect_gbs == builtin.node_interconnect_gbs


def test_full_override_replaces_source(tmp_path: Path) -> None:
    path = _json(tmp_path, {"l4": {**MY_GPU, "display_name": "My L4"}})
    spec = get_hardware("l4", extra_file=path)
    assert spec.display_name == "My L4"
    assert spec.source == MY_GPU["source"]


def test_user_entry_shadows_a_builtin_alias(tmp_path: Path) -> None:
    path = _json(tmp_path, {"h100": MY_GPU})
    assert get_hardware("h100", extra_file=path).vendor == "acme"
    assert get_hardware("h100-sxm", extra_file=path).vendor == "nvidia"


def test_missing_file(tmp_path: Path) -> None:
    err = _one_line_error("h100", tmp_path / "nope.yaml")
    assert err.field == "hardware-file"
    assert "does not exist" in str(err)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    err = _one_line_error("h100", tmp_path)
    assert err.field == "hardware-file"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bad.yaml", "my-gpu: {memory_gib: [1, 2\n  vendor: x\n"),
        ("bad.json", '{"my-gpu": {"memory_gib": 1,}}'),
        ("bad.txt", "just some words"),
        ("list.yaml", "- a\n- b\n"),
        ("empty.yaml", ""),
    ],
)
def test_not_yaml_or_json(tmp_path: Path, name: str, text: str) -> None:
    err = _one_line_error("h100", _yaml(tmp_path, text, name=name))
    assert err.field == "hardware-file"
    assert name in str(err)


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81binary")
    assert _one_line_error("h100", path).field == "hardware-file"


def test_invalid_field_names_entry_and_field(tmp_path: Path) -> None:
    path = _json(tmp_path, {"my-gpu": {**MY_GPU, "memory_gib": -1}})
    err = _one_line_error("my-gpu", path)
    assert err.field == "hardware-file my-gpu.memory_gib"
    assert str(err).startswith("hardware-file my-gpu.memory_gib: Input should be greater than 0")
    with pytest.raises(InputError, match=r"my-gpu\.memory_gib"):
        load_hardware_file(path)


def test_invalid_entry_fails_even_when_asking_for_another(tmp_path: Path) -> None:
    path = _json(tmp_path, {"my-gpu": {**MY_GPU, "interconnect": "carrier-pigeon"}})
    err = _one_line_error("h100", path)
    assert err.field == "hardware-file my-gpu.interconnect"


def test_missing_required_field(tmp_path: Path) -> None:
    entry = {k: v for k, v in MY_GPU.items() if k != "memory_bandwidth_gbs"}
    err = _one_line_error("my-gpu", _json(tmp_path, {"my-gpu": entry}))
    assert err.field == "hardware-file my-gpu.memory_bandwidth_gbs"
    assert "is missing" in err.problem.lower()


def test_unknown_field_gets_a_suggestion(tmp_path: Path) -> None:
    entry = {**MY_GPU, "memory_gb": 48}
    err = _one_line_error("my-gpu", _json(tmp_path, {"my-gpu": entry}))
    assert err.field == "hardware-file my-gpu.memory_gb"
    assert "memory_gib" in str(err)


def test_unknown_dtype(tmp_path: Path) -> None:
    entry = {**MY_GPU, "tflops": {"fp9": 10}}
    err = _one_line_error("my-gpu", _json(tmp_path, {"my-gpu": entry}))
    assert err.field == "hardware-file my-gpu.tflops.fp9"


def test_empty_tflops(tmp_path: Path) -> None:
    entry = {**MY_GPU, "tflops": {}}
    err = _one_line_error("my-gpu", _json(tmp_path, {"my-gpu": entry}))
    assert err.field == "hardware-file my-gpu.tflops"


def test_entry_that_is_not_a_mapping(tmp_path: Path) -> None:
    err = _one_line_error("my-gpu", _yaml(tmp_path, "my-gpu: 42\n"))
    assert err.field == "hardware-file my-gpu"


def test_bad_override_value(tmp_path: Path) -> None:
    err = _one_line_error("h100", _yaml(tmp_path, "h100-sxm:\n  memory_bandwidth_gbs: fast\n"))
    assert err.field == "hardware-file h100-sxm.memory_bandwidth_gbs"


def test_alias_to_nowhere(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "hardware: {}\naliases:\n  mine: my-gpuu\n")
    err = _one_line_error("mine", path)
    assert err.field == "hardware-file aliases.mine"
    assert "my-gpuu" in str(err)


def test_duplicate_after_normalizing(tmp_path: Path) -> None:
    path = _json(tmp_path, {"My GPU": MY_GPU, "my_gpu": MY_GPU})
    assert _one_line_error("my-gpu", path).field == "hardware-file my-gpu"


def test_unknown_name_with_file_mentions_user_entries(tmp_path: Path) -> None:
    path = _json(tmp_path, {"my-gpu": MY_GPU})
    err = _one_line_error("my-gpuu", path)
    assert err.field == "hardware"
    assert "my-gpu" in str(err)


def test_edited_file_is_read_again(tmp_path: Path) -> None:
    path = _json(tmp_path, {"my-gpu": MY_GPU})
    assert get_hardware("my-gpu", extra_file=path).memory_gib == 48
    path.write_text(json.dumps({"my-gpu": {**MY_GPU, "memory_gib": 96, "vendor": "acme2"}}))
    assert get_hardware("my-gpu", extra_file=path).memory_gib == 96
