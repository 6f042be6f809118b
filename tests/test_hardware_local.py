"""`local`: this machine measured once (bandwidth, sgemm FLOP/s), then read from the cache."""

from __future__ import annotations

import json
import os

import pytest

from servetune.hardware import local
from servetune.hardware.catalog import get_hardware


def test_local_is_this_host_measured_once_then_cached(tmp_path, monkeypatch) -> None:
    spec = local.local_hardware(tmp_path)
    cores = len(os.sched_getaffinity(0))
    assert spec.kind == "cpu" and f"({cores} cores)" in spec.display_name
    # a 2-core VM is nowhere near the catalog's 16-core cpu-host
    assert 0.5 < spec.memory_bandwidth_gbs < 1000
    assert 0.001 < spec.tflops["fp32"] < 50
    assert "measured on this host" in spec.source
    cached = json.loads((tmp_path / "hardware-local.json").read_text())
    assert cached["bandwidth_gbs"] == spec.memory_bandwidth_gbs

    def boom(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(local, "measure_bandwidth_gbs", boom)
    monkeypatch.setattr(local, "measure_fp32_tflops", boom)
    again = local.local_hardware(tmp_path)
    assert again == spec
    # another CPU (other key) is measured afresh
    cached["key"] = "some other cpu|64"
    (tmp_path / "hardware-local.json").write_text(json.dumps(cached))
    with pytest.raises(AssertionError, match="measured again"):
        local.local_hardware(tmp_path)


def test_vnni_and_bf16_scale_from_fp32(tmp_path, monkeypatch) -> None:
    facts = {"cores": 2, "model": "x", "flags": ["avx512_bf16", "avx512_vnni"], "memory_gib": 8}
    monkeypatch.setattr(local, "cpu_facts", lambda: facts)
    monkeypatch.setattr(local, "measure_bandwidth_gbs", lambda n: 20.0)
    monkeypatch.setattr(local, "measure_fp32_tflops", lambda: 0.1)
    spec = local.local_hardware(tmp_path)
    assert spec.tflops == {"fp32": 0.1, "bf16": 0.2, "int8": 0.4}
    facts["flags"], facts["model"] = [], "y"
    plain = local.local_hardware(tmp_path)
    assert plain.tflops == {"fp32": 0.1, "bf16": 0.1, "int8": 0.1}


def test_catalog_name_local_uses_the_servetune_cache(tmp_path, monkeypatch) -> None:
    from servetune.hardware import catalog

    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path))
    catalog._local.cache_clear()
    try:
        spec = get_hardware("this-host")
        assert spec.name == "local" and (tmp_path / "hardware-local.json").exists()
    finally:
        catalog._local.cache_clear()
