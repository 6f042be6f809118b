"""ONNX Runtime served by onnx-genai-server: the adapter's command and metric map, the
model builder's conversion, and (marked `engine`) a real launch benchmarked with
`servetune bench`, whose buffered stream must be flagged, not reported as TTFT/ITL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines import EngineConfig, flagcheck, onnx_rt
from servetune.engines.metrics import canonical
from servetune.engines.onnx_model import convert, source_hash
from servetune.engines.registry import launch_command
from servetune.errors import InputError

# Lines of one real scrape of onnx-genai-server 0.1.0.dev6 here (2026-12), after 17
# requests: the TTFT histogram's sum is the E2E's within 0.2%.
SCRAPE = """\
# TYPE onnx_genai_prompt_tokens_total counter
onnx_genai_prompt_tokens_total 205
# TYPE onnx_genai_completion_tokens_total counter
onnx_genai_completion_tokens_total 1432
# TYPE onnx_genai_time_to_first_token_seconds histogram
onnx_genai_time_to_first_token_seconds_bucket{le="1"} 9
onnx_genai_time_to_first_token_seconds_bucket{le="+Inf"} 17
onnx_genai_time_to_first_token_seconds_sum 134.621770054
onnx_genai_time_to_first_token_seconds_count 17
# TYPE onnx_genai_e2e_request_latency_seconds histogram
onnx_genai_e2e_request_latency_seconds_bucket{le="1"} 9
onnx_genai_e2e_request_latency_seconds_bucket{le="+Inf"} 17
onnx_genai_e2e_request_latency_seconds_sum 134.775461996
onnx_genai_e2e_request_latency_seconds_count 17
# TYPE onnx_genai_requests_waiting gauge
onnx_genai_requests_waiting 2
# TYPE onnx_genai_batch_size_current gauge
onnx_genai_batch_size_current 4
# TYPE onnx_genai_prefix_cache_hit_rate gauge
onnx_genai_prefix_cache_hit_rate 0.35294117647058826
# TYPE onnx_genai_kv_pages_in_use gauge
onnx_genai_kv_pages_in_use 1024
# TYPE onnx_genai_kv_pages_capacity gauge
onnx_genai_kv_pages_capacity 4096
# TYPE onnx_genai_kv_page_size_tokens gauge
onnx_genai_kv_page_size_tokens 16
"""


def test_adapter_maps_what_it_can_and_says_what_it_cannot() -> None:
    cfg = EngineConfig(
        engine="onnx",
        max_num_seqs=4,
        kv_cache_dtype="fp8",
        threads=2,
        gpu_memory_utilization=0.8,
        tensor_parallel_size=2,
        max_model_len=1024,
        enable_prefix_caching=False,
    )
    spec = launch_command("onnx", cfg, "/m", port=9000, prefix=["/v/bin/python"], device="cpu")
    assert spec.argv == [
        "/v/bin/onnx-genai", "serve", "/m", "--addr", "127.0.0.1:9000",
        "--max-batch", "4", "--vram-limit", "0.8", "--kv-cache-dtype", "fp8_e4m3fn",
        "--cpu-cores", "2",
    ]  # fmt: skip
    assert spec.unsupported == ["tensor_parallel_size", "max_model_len", "enable_prefix_caching"]
    assert any("make-model" in n for n in spec.notes)  # max_model_len: set at conversion
    assert any("buffered" in n for n in spec.notes)
    assert flagcheck.check_argv(flagcheck.load("onnx"), spec.argv) == []


def test_the_console_script_is_found_next_to_any_python_or_used_as_given() -> None:
    assert onnx_rt.executable(["/e/venv/bin/python3"]) == ["/e/venv/bin/onnx-genai"]
    assert onnx_rt.executable(["/usr/local/bin/onnx-genai"]) == ["/usr/local/bin/onnx-genai"]
    assert onnx_rt.executable(None) == ["onnx-genai"]


def test_kv_dtypes_it_does_not_have_are_reported() -> None:
    spec = launch_command("onnx", EngineConfig(engine="onnx", kv_cache_dtype="bf16"), "/m")
    assert "--kv-cache-dtype" not in spec.argv and spec.unsupported == ["kv_cache_dtype"]


def test_metrics_map_to_canonical_names_and_kv_use_is_derived() -> None:
    m = canonical("onnx", SCRAPE)
    assert m.values["requests_running"] == 4 and m.values["requests_waiting"] == 2
    assert m.values["generation_tokens_total"] == 1432
    assert m.values["prompt_tokens_total"] == 205
    assert m.values["kv_cache_usage"] == pytest.approx(0.25)  # 1024 of 4096 pages
    assert m.values["kv_cache_capacity_tokens"] == 4096 * 16
    assert m.histograms["e2e_seconds"].count == 17
    # its TTFT histogram is stamped at release (== E2E): not mapped, not reported
    assert "ttft_seconds" not in m.histograms


def test_kv_use_is_capped_and_absent_without_capacity() -> None:
    assert onnx_rt.derived({"onnx_genai_kv_pages_in_use": 9, "onnx_genai_kv_pages_capacity": 4})[
        "kv_cache_usage"
    ] == pytest.approx(1.0)
    assert onnx_rt.derived({"onnx_genai_kv_pages_in_use": 3}) == {}


def test_derived_metrics_are_ones_the_server_exports_as_gauges() -> None:
    exported = flagcheck.load("onnx").metrics
    assert all(exported[name] == "gauge" for name in onnx_rt.DERIVED_FROM)


def test_source_hash_follows_the_content(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    before = source_hash(tmp_path)
    (tmp_path / "config.json").write_text('{"x": 1}')
    assert source_hash(tmp_path) != before


def test_convert_refuses_a_dir_without_config(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="config.json"):
        convert(tmp_path, python="/nonexistent/python")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("make-model", "--kind", "onnx", "--source", "{tmp}"), "has no config.json"),
        (("make-model", "--kind", "llama", "--source", "{tmp}"), "only --kind onnx"),
        (("launch", "onnx", "--model", "{tmp}"), "no genai_config.json"),
    ],
)
def test_cli_bad_model_input_is_one_line_exit_2(
    args: tuple[str, ...], needle: str, tmp_path: Path
) -> None:
    argv = [a.format(tmp=tmp_path) for a in args]
    out = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# --- real engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_model() -> Path:
    """The test Llama (seeded weights) converted by the builder; cached after the first run
    (the install about 2 min, the conversion about 15 s)."""
    from servetune.engines.testmodel import make_llama_weights

    return convert(make_llama_weights(), say=lambda _: None)


@pytest.mark.engine
@pytest.mark.timeout(300)  # the first use converts the model (~20 s; cached after)
def test_flags_data_matches_the_installed_server(onnx_model: Path) -> None:
    from servetune.engines.install import require

    exe = onnx_rt.executable(require("onnx").prefix)
    text = subprocess.run(
        [*exe, "serve", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    live = flagcheck.clap_help_flags(text)
    data = flagcheck.load("onnx").flags
    assert sorted(live) == sorted(data)
    for flag, spec in live.items():
        assert (spec["type"] == "switch") == (data[flag]["type"] == "switch"), flag
        # a closed list of values must match; --device's `cuda[:N]` is a pattern, not a list
        if "choices" in spec and not any("[" in c for c in spec["choices"]):
            assert spec["choices"] == data[flag].get("choices"), flag


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_onnx_serves_and_bench_flags_the_buffered_stream(onnx_model: Path, tmp_path: Path) -> None:
    from servetune.engines.process import launch

    (tmp_path / "w.yaml").write_text(
        "count: 6\narrival: {kind: closed, concurrency: 2}\n"
        "input_tokens: {dist: fixed, value: 16}\noutput_tokens: {dist: fixed, value: 24}\n"
    )
    cfg = EngineConfig(engine="onnx", max_num_seqs=2, threads=2)
    with launch("onnx", cfg, str(onnx_model), device="cpu", timeout_s=180) as srv:
        assert srv.served_model == onnx_model.name
        out = subprocess.run(
            [
                sys.executable, "-m", "servetune.cli.app", "bench", "--url", srv.url,
                "-w", str(tmp_path / "w.yaml"), "--tokenizer", str(onnx_model),
                "--model", srv.served_model, "--engine", "onnx",
                "--json", "-o", str(tmp_path / "r.json"),
            ],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        after = srv.metrics()
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["metrics"]
    assert m["completed"] == 6 and m["failed"] == 0, m["errors_by_class"]
    # every chunk arrives together at the end: flagged, TTFT/ITL not numbers
    assert m["stream_buffered"] and m["stream_buffered_requests"] >= 4
    assert m["ttft_ms"]["count"] == 0 and m["itl_ms"]["count"] == 0
    assert m["e2e_ms"]["count"] == 6
    # the server's own metrics were scraped during the run, under canonical names
    server = json.loads((tmp_path / "r.json").read_text())["server"]
    assert server["deltas"]["generation_tokens_total"] >= 6
    assert any(v.get("kv_cache_capacity_tokens", 0) > 0 for v in server["values"])
    assert after.histograms["e2e_seconds"].count >= 7  # the warm-up request + 6
    assert after.values["requests_waiting"] == 0
