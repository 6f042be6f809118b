"""Telemetry bugs found by the bug hunt: an NVML GPU handle that cannot be opened, a GPU
without utilisation rates (MIG), NaN samples from a Prometheus URL, a DCGM field declared
a counter, and counters that reset during a run."""

from __future__ import annotations

import math
import sys
import types

import pytest
from tests.test_telemetry import FakeNVML

from servetune.bench.server_metrics import flatten_prometheus, series_deltas
from servetune.results.schema import TelemetrySeries
from servetune.telemetry.gpu import GpuSource, open_gpu
from servetune.telemetry.prom import map_exposition
from servetune.telemetry.sampler import open_sources


def fake_pynvml(monkeypatch, bad: set[int], count: int = 2) -> list[str]:
    """Install a stand-in `pynvml` with `count` GPUs whose handles in `bad` NVML refuses
    (a lost GPU, a container whose device was revoked); returns its call log."""
    fake = FakeNVML()
    calls: list[str] = []
    mod = types.ModuleType("pynvml")
    for k in dir(fake):
        if not k.startswith("__"):
            setattr(mod, k, getattr(fake, k))

    def get_handle(i: int) -> int:
        if i in bad:
            raise FakeNVML.NVMLError("Unknown Error")
        return i

    mod.NVMLError = FakeNVML.NVMLError
    mod.nvmlInit = lambda: calls.append("init")
    mod.nvmlShutdown = lambda: calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: count
    mod.nvmlDeviceGetHandleByIndex = get_handle
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return calls


def test_a_gpu_whose_handle_nvml_refuses_is_left_out_with_a_note(monkeypatch) -> None:
    fake_pynvml(monkeypatch, bad={1})
    src, note = open_gpu()
    assert src is not None and src.handles == [0]
    assert note is not None and note.startswith("GPU: ") and "GPU 1 (Unknown Error)" in note
    v = src.read()
    assert v["gpu_count"] == 1 and v["gpu_memory_used"] == 10 * 2**30  # GPU 0 only


def test_no_gpu_handle_at_all_skips_the_source_and_shuts_nvml_down(monkeypatch) -> None:
    calls = fake_pynvml(monkeypatch, bad={0}, count=1)
    src, note = open_gpu()
    assert src is None and note == "GPU: no GPU handle could be opened (GPU 0 (Unknown Error))"
    assert calls == ["init", "shutdown"]
    # the run goes on: the sampler opens the host source and notes the GPU's absence
    sources, notes = open_sources(None, None)
    assert [s.name for s in sources] == ["host"] and note in notes


def test_the_sampler_keeps_the_note_of_a_gpu_left_out(monkeypatch) -> None:
    fake_pynvml(monkeypatch, bad={1})
    sources, notes = open_sources(None, None)
    assert [s.name for s in sources] == ["host", "nvml"]
    assert any("left out GPU 1 (Unknown Error)" in n for n in notes)


class MigNVML(FakeNVML):
    def nvmlDeviceGetUtilizationRates(self, h):
        raise self.NVMLError("Not Supported")  # NVML on a MIG-enabled physical GPU


def test_gpu_without_utilisation_rates_still_reads_everything_else() -> None:
    v = GpuSource(MigNVML(), 2).read()
    assert "gpu_util" not in v and "gpu_mem_bw_util" not in v
    assert v["gpu_memory_used"] == 30 * 2**30 and v["gpu_memory_total"] == 160 * 2**30
    assert v["gpu_temp_c"] == 80 and v["gpu_power_w"] == 600
    assert v["gpu_ecc_uncorrected"] == 0 and v["gpu_xid_total"] == 2


GO_SUMMARY_AND_INF = """# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} NaN
go_gc_duration_seconds{quantile="1"} NaN
go_gc_duration_seconds_sum 0
go_gc_duration_seconds_count 0
# TYPE node_thing gauge
node_thing{a="1"} +Inf
node_thing{a="2"} 2
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1"} NaN
"""


def test_non_finite_samples_are_dropped_and_the_series_round_trips() -> None:
    row = map_exposition(GO_SUMMARY_AND_INF)
    assert "url:go_gc_duration_seconds" not in row  # only NaN quantiles
    assert row["url:go_gc_duration_seconds_count"] == 0
    assert row["url:node_thing"] == 2  # the +Inf label set left out
    assert row["gpu_util"] == pytest.approx(0.4) and row["gpu_count"] == 1
    flat = flatten_prometheus(GO_SUMMARY_AND_INF)  # an engine's /metrics, scraped raw
    assert all(math.isfinite(v) for v in flat.values()) and "go_gc_duration_seconds" not in flat
    s = TelemetrySeries(t_ns=[0, 1], values=[row, row])
    back = TelemetrySeries.model_validate_json(s.model_dump_json())
    assert back.values == [row, row]


def test_dcgm_field_declared_a_counter_maps_to_its_canonical_name() -> None:
    text = "\n".join(
        [
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
            'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} 3',
            'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"} 1',
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
            'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 123456',
        ]
    )
    row = map_exposition(text + "\n")
    assert row["gpu_ecc_uncorrected"] == 4  # the parser named it ..._TOTAL_total
    assert not any("ECC" in k for k in row)
    assert row["url:DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"] == 123456  # not a GPU name


def test_counter_reset_mid_run_counts_like_prometheus_increase() -> None:
    values = [
        {"preemptions_total": 120.0, "queue_time_seconds_count": 400.0, "requests_running": 5},
        {"preemptions_total": 130.0, "queue_time_seconds_count": 450.0, "requests_running": 9},
        {"preemptions_total": 2.0, "queue_time_seconds_count": 20.0, "requests_running": 1},
        {"preemptions_total": 4.0, "queue_time_seconds_count": 30.0, "requests_running": 3},
    ]
    d = series_deltas(values)
    assert d["preemptions_total"] == 10 + 2 + 2  # rise, reset to 2 (counted), rise
    assert d["queue_time_seconds_count"] == 50 + 20 + 10
    assert d["requests_running"] == 3 - 5  # a gauge: last minus first, may be negative


def test_histogram_series_are_counters_and_telemetry_gauges_are_not() -> None:
    values = [
        {"ttft_seconds_bucket": 10.0, "ttft_seconds_sum": 5.0, "gpu_ecc_uncorrected": 3.0,
         "gpu_count": 2.0, "gpu_memory_total": 160e9},
        {"ttft_seconds_bucket": 1.0, "ttft_seconds_sum": 0.5, "gpu_ecc_uncorrected": 0.0,
         "gpu_count": 1.0, "gpu_memory_total": 80e9},
        {"gpu_count": 1.0},  # a sample where the GPU read failed: skipped for counters
        {"ttft_seconds_bucket": 4.0, "ttft_seconds_sum": 2.0, "gpu_ecc_uncorrected": 1.0,
         "gpu_count": 1.0, "gpu_memory_total": 80e9},
    ]  # fmt: skip
    d = series_deltas(values)
    assert d["ttft_seconds_bucket"] == 1 + 3 and d["ttft_seconds_sum"] == 0.5 + 1.5
    assert d["gpu_ecc_uncorrected"] == 0 + 1  # NVML volatile count: reset with the driver
    assert d["gpu_count"] == -1 and d["gpu_memory_total"] == -80e9  # gauges
    assert series_deltas(values[:1]) == {}
