"""vLLM (CPU build) for real: launch from an EngineConfig, stream, metrics, effective
settings vs the planner, and the errors a user meets (a bad flag and a KV space too large
to allocate here, a busy port in test_engine_common; the tuner meets the KV error in
test_tune_real, on llama.cpp). The clean stop is checked in test_sessions_engines, on a
vLLM it starts anyway. Shares one server (conftest.vllm_server); the error tests start
their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines.process import EngineError, launch
from servetune.engines.testmodel import VLLM_TEST_CONFIG
from streaming import stream_completion

# Bound per test, engine start included: 10x the slowest here on a busy 2-core host (its
# own launch and stop, 89 s).
pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def test_streaming_completion_returns_tokens(vllm_server) -> None:
    out = stream_completion(vllm_server.url, vllm_server.served_model, "The server streams", 16)
    assert out["usage"]["completion_tokens"] == 16
    assert len(out["chunks"]) >= 8  # streamed step by step, not in one burst


def test_metrics_map_to_canonical_names(vllm_server) -> None:
    before = vllm_server.metrics()
    stream_completion(vllm_server.url, vllm_server.served_model, "Count the blocks", 8)
    after = vllm_server.metrics()
    v = after.values
    assert v["generation_tokens_total"] - before.values["generation_tokens_total"] >= 8
    assert v["prompt_tokens_total"] > before.values["prompt_tokens_total"]
    assert v["requests_finished_total"] == before.values["requests_finished_total"] + 1
    assert v["requests_running"] == 0 and v["requests_waiting"] == 0
    assert 0.0 <= v["kv_cache_usage"] <= 1.0
    assert v["prefix_cache_queries_total"] >= v["prefix_cache_hits_total"] >= 0
    assert v["preemptions_total"] == 0
    ttft = after.histograms["ttft_seconds"]
    assert ttft.count == before.histograms["ttft_seconds"].count + 1
    assert 0 < ttft.quantile(0.5) < 60
    assert after.histograms["itl_seconds"].count >= before.histograms["itl_seconds"].count + 7


def test_effective_settings_are_read_from_the_engine(vllm_server, llama_test_model) -> None:
    s = vllm_server.settings
    assert s["version"] == "0.32.0"
    assert s["max_model_len"] == 2048
    assert s["kv_cache_pool"] == "CPU"
    # 1 GiB / (2 (K,V) x 8 layers x 4 KV heads x 64 head_dim x 2 bytes bf16) = 131,072 tokens;
    # 65,536 in float32 (4 bytes), the test model's dtype on AVX2-only hosts.
    cfg = json.loads((llama_test_model / "config.json").read_text())
    width = {"bfloat16": 2, "float32": 4}[cfg["torch_dtype"]]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * width
    assert s["kv_cache_tokens"] == 2**30 // per_token == {2: 131072, 4: 65536}[width]


def test_kv_capacity_equals_plan_prediction(vllm_server, llama_test_model: Path) -> None:
    """The planner's KV capacity for the same model config, dtype and KV space is what vLLM
    got (vLLM serves a float32 checkpoint in bf16 unless told --dtype float32, as here on an
    AVX2-only host, and the planner follows the same rule)."""
    out = subprocess.run(
        [
            sys.executable, "-m", "servetune.cli.app", "plan",
            "--model", str(llama_test_model), "--gpu", "cpu-host",
            "--dtype", VLLM_TEST_CONFIG.dtype,
            "--kv-cache-space", str(VLLM_TEST_CONFIG.kv_cache_space_gib),
            "--block-size", str(VLLM_TEST_CONFIG.block_size), "--kv-dtype", "auto", "--json",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kv_capacity_tokens"] == vllm_server.settings["kv_cache_tokens"]


# That stopping vLLM leaves none of its processes (API server + engine core) is checked
# on the vLLM that tests/test_sessions_engines.py starts with the prefix cache off: a
# vLLM start costs 30-45 s, and this one is stopped anyway.


@pytest.mark.untimed
def test_invalid_flag_quotes_the_engine_log(vllm_install, llama_test_model: Path) -> None:
    cfg = VLLM_TEST_CONFIG.with_(extra_args=("--no-such-flag", "1"))
    with pytest.raises(EngineError) as err:
        launch("vllm", cfg, str(llama_test_model), device="cpu", timeout_s=600)  # niced: slow
    e = err.value
    # the message carries the exit code and the log's last lines: CI once saw "crash" here
    # with a log holding only the command line (vLLM gone before its argument parser)
    assert e.kind == "bad_flag" and e.exit_code == 2, e.one_line()
    assert "unrecognized arguments: --no-such-flag" in str(e)
    assert e.log_path is not None and "full log:" in e.one_line()


@pytest.mark.untimed
def test_kv_space_that_cannot_be_allocated_quotes_the_engine_log(
    vllm_install, llama_test_model: Path
) -> None:
    """vLLM loads the model, then cannot allocate the KV space: out of memory, one line
    with the engine's own words (what a tuner trial records as infeasible)."""
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cfg = VLLM_TEST_CONFIG.with_(kv_cache_space_gib=int(ram_gib * 2))
    with pytest.raises(EngineError) as err:
        launch("vllm", cfg, str(llama_test_model), device="cpu", timeout_s=600)  # niced: slow
    e = err.value
    assert e.kind == "oom"
    assert "less than requested memory for kv" in str(e)
    assert e.log_tail and e.log_path is not None and "full log:" in e.one_line()


@pytest.mark.untimed
def test_the_adapters_aliases_are_the_engines_own(vllm_install, tmp_path: Path) -> None:
    """`vllm.ALIASES` (an --extra `-tp` repeats the emitted `--tensor-parallel-size`)
    lists only spellings vLLM's own --help=all gives on one option's line."""
    from engine_help import missing_aliases
    from servetune.engines.vllm import ALIASES, MODULE

    argv = [*vllm_install.prefix, "-m", MODULE, "--help=all"]
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path), "TMPDIR": str(tmp_path)}
    assert missing_aliases(ALIASES, argv, env) == []
