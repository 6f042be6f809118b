"""The built-in hardware catalog: it loads, validates, and matches the datasheets."""

from __future__ import annotations

import pytest

from servetune.errors import InputError
from servetune.hardware.catalog import get_hardware, hardware_aliases, hardware_names
from servetune.hardware.spec import HardwareSpec
from servetune.units import TFLOP

REQUIRED = [
    "a100-40g-sxm",
    "a100-80g-sxm",
    "a100-40g-pcie",
    "a100-80g-pcie",
    "h100-sxm",
    "h100-pcie",
    "h100-nvl",
    "h200",
    "b200",
    "b300",
    "l40s",
    "l4",
    "a10g",
    "a10",
    "t4",
    "v100-32g",
    "rtx-3090",
    "rtx-4090",
    "rtx-5090",
    "mi300x",
    "mi325x",
    "cpu-host",
]
DTYPES = {"fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4"}


def test_catalog_has_the_required_entries() -> None:
    names = hardware_names()
    assert set(REQUIRED) <= set(names)
    assert names == sorted(names)
    gpus = [n for n in names if get_hardware(n).kind == "gpu"]
    assert len(gpus) >= 15


@pytest.mark.parametrize("name", REQUIRED)
def test_every_entry_is_valid_and_sourced(name: str) -> None:
    spec = get_hardware(name)
    assert isinstance(spec, HardwareSpec)
    assert spec.name == name
    assert name == name.lower()
    assert spec.source.strip()
    assert spec.display_name and spec.vendor
    assert spec.tflops and set(spec.tflops) <= DTYPES
    assert spec.memory_gib > 0 and spec.memory_bandwidth_gbs > 0
    if spec.kind == "gpu":
        assert "http" in spec.source  # names the vendor document and where to find it
        assert spec.interconnect != "none"
        assert spec.interconnect_gbs > 0
    # A dense rate never beats a lower-precision one on the same device.
    rates = spec.tflops
    if "bf16" in rates and "fp8" in rates:
        assert rates["fp8"] >= rates["bf16"]
    if "fp32" in rates and "bf16" in rates:
        assert rates["bf16"] >= rates["fp32"]


def test_cpu_host_is_a_plain_cpu() -> None:
    cpu = get_hardware("cpu-host")
    assert cpu.kind == "cpu"
    assert cpu.devices_per_node == 1
    assert cpu.interconnect == "none"
    assert cpu.memory_gib == 64
    assert set(cpu.tflops) >= {"fp32", "bf16"}


@pytest.mark.parametrize(
    ("name", "bandwidth", "bf16"),
    [
        ("a100-80g-sxm", 2039, 312),
        ("a100-40g-sxm", 1555, 312),
        ("a100-80g-pcie", 1935, 312),
        ("h100-sxm", 3350, 989),
        ("h100-pcie", 2000, 756),
        ("h200", 4800, 989),
        ("l40s", 864, 362.05),
        ("mi300x", 5300, 1307.4),
        ("rtx-4090", 1008, 165.2),
    ],
)
def test_datasheet_spot_checks(name: str, bandwidth: float, bf16: float) -> None:
    spec = get_hardware(name)
    assert spec.memory_bandwidth_gbs == bandwidth
    assert spec.tflops["bf16"] == pytest.approx(bf16)


def test_dense_not_sparse_figures() -> None:
    # H100 SXM datasheet: FP8 3,958 TFLOP/s *with sparsity* -> 1,979 dense.
    assert get_hardware("h100-sxm").tflops["fp8"] == pytest.approx(1979)
    assert get_hardware("b200").tflops["fp4"] == pytest.approx(9000)
    assert get_hardware("a100-80g-sxm").tflops["tf32"] == pytest.approx(156)


def test_memory_is_what_the_device_reports() -> None:
    assert get_hardware("a100-80g-sxm").memory_gib == 80.0
    assert get_hardware("h100-sxm").memory_gib == pytest.approx(81559 / 1024, abs=0.01)
    # "141GB" H200 reports 143771 MiB: about 140 GiB, not 141e9 bytes (131 GiB).
    assert get_hardware("h200").memory_gib == pytest.approx(140.4, abs=0.1)
    assert get_hardware("h200").memory_bytes > 150 * 10**9


def test_interconnect_is_one_direction_per_device() -> None:
    assert get_hardware("h100-sxm").interconnect_gbs == 450  # NVLink 900 GB/s bidirectional
    assert get_hardware("a100-80g-sxm").interconnect_gbs == 300
    assert get_hardware("a100-80g-pcie").interconnect_gbs == 32  # PCIe Gen4 x16
    assert get_hardware("h100-pcie").interconnect_gbs == 64  # PCIe Gen5 x16
    assert get_hardware("mi300x").interconnect == "infinity-fabric"
    assert get_hardware("h100-sxm").devices_per_node == 8


@pytest.mark.parametrize(
    ("alias", "target"),
    [
        ("h100", "h100-sxm"),
        ("a100", "a100-80g-sxm"),
        ("a100-80g", "a100-80g-sxm"),
        ("4090", "rtx-4090"),
        ("cpu", "cpu-host"),
        ("H100", "h100-sxm"),
        ("  RTX_4090 ", "rtx-4090"),
        ("H200", "h200"),
    ],
)
def test_aliases_and_case(alias: str, target: str) -> None:
    spec = get_hardware(alias)
    assert spec.name == target
    assert spec is get_hardware(target)


def test_aliases_point_at_entries() -> None:
    names = set(hardware_names())
    aliases = hardware_aliases()
    assert aliases
    assert set(aliases.values()) <= names
    assert not set(aliases) & names


def test_unknown_name_suggests_close_ones() -> None:
    with pytest.raises(InputError) as info:
        get_hardware("h10O-sxm")
    msg = str(info.value)
    assert "\n" not in msg
    assert info.value.field == "hardware"
    assert "h100-sxm" in msg


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_name_is_an_input_error(bad: str) -> None:
    with pytest.raises(InputError, match="no accelerator"):
        get_hardware(bad)


def test_peak_flops_fallbacks() -> None:
    a100 = get_hardware("a100-80g-sxm")
    # No FP8 on Ampere: falls back to the 16-bit rate.
    assert a100.peak_flops("fp8") == pytest.approx(312 * TFLOP)
    assert a100.peak_flops("bf16") == pytest.approx(312 * TFLOP)
    # Turing has fp16 tensor cores but no bf16.
    assert get_hardware("t4").peak_flops("bf16") == pytest.approx(65 * TFLOP)
    assert get_hardware("h100-sxm").peak_flops("fp8") == pytest.approx(1979 * TFLOP)
    # Hopper has no int4 tensor path: the 16-bit rate, not something faster.
    assert get_hardware("h100-sxm").peak_flops("int4") == pytest.approx(989 * TFLOP)
    assert get_hardware("cpu-host").peak_flops("fp8") == get_hardware("cpu").peak_flops("bf16")


def test_specs_are_frozen_and_cached() -> None:
    spec = get_hardware("h100-sxm")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen
        spec.memory_gib = 1  # type: ignore[misc]
    assert get_hardware("h100-sxm") is spec
