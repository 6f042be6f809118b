"""`servetune plan` end to end through the CLI: JSON contract, tables, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REQUIRED_KEYS = {
    "weights_bytes",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "max_concurrency",
    "fits",
    "tp",
    "tpot_lower_bound_ms",
    "ttft_lower_bound_ms",
    "launch",
}


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_default_plan_renders_tables() -> None:
    out = run_plan()
    assert out.returncode == 0, out.stderr
    for heading in (
        "Memory per GPU",
        "KV cache",
        "Parallelism options",
        "Roofline bounds",
        "seed 003 §13",
        "vllm",
    ):
        assert heading in out.stdout


@pytest.mark.parametrize(
    ("args", "overheads", "free"),
    [
        # vLLM sizing its own pool: the CUDA context predates its memory snapshot and sits in
        # the (1 - utilization) headroom, so the overheads row must not claim it
        (
            (),
            "fixed overheads (workspace, graphs) ",
            "left free (1 - utilization), CUDA context in it",
        ),
        (
            ("--gpus", "2", "--tp", "2"),
            "fixed overheads (workspace, graphs, NCCL) ",
            "left free (1 - utilization), CUDA context in it",
        ),
        # an explicit KV size leaves no headroom: every term is taken from the budget
        (
            ("--kv-cache-space", "2"),
            "fixed overheads (context, workspace, graphs) ",
            "left free (1 - gpu_memory_utilization) ",
        ),
    ],
)
def test_the_overheads_row_names_the_terms_it_holds(
    args: tuple[str, ...], overheads: str, free: str
) -> None:
    out = run_plan("--model", "llama-3.1-8b", "--gpu", "l4", "--scenario", "chat", *args)
    assert out.returncode == 0, out.stderr
    assert overheads in out.stdout
    assert free in out.stdout


def test_launch_notes_reach_the_plan_output() -> None:
    """llama.cpp's slots share a pool too small to give each max_model_len: the plan says so
    beside the command, in text and JSON, not only `engine command`."""
    args = ("--model", "llama-3.1-8b", "--gpu", "l4", "--scenario", "chat")
    text = run_plan(*args)
    assert text.returncode == 0, text.stderr
    assert "note: kv_unified: the planned pool of 32,144 tokens split over 64 slots" in text.stdout
    data = json.loads(run_plan(*args, "--json").stdout)
    assert "--kv-unified" in data["launch"]["llamacpp"]
    assert any(n.startswith("kv_unified:") for n in data["launch_notes"]["llamacpp"])


def test_a_huge_gpu_count_plans_at_once() -> None:
    """Pipeline stages are tried up to one layer each, not up to --gpus (which hung); past
    any deployment's size (`plan.service.MAX_GPUS`) the count is a typo, refused."""
    out = run_plan("--gpus", "100000")
    assert out.returncode == 0, out.stderr
    assert "FITS" in out.stdout
    out = run_plan("--gpus", "99999999999")
    assert out.returncode == 2 and "give 1 to 100,000 GPUs" in out.stderr, out.stderr


def test_json_contract() -> None:
    out = run_plan(
        "--model",
        "llama-2-7b",
        "--gpu",
        "a100-80g-sxm",
        "--dtype",
        "fp16",
        "--scenario",
        "none",
        "--max-model-len",
        "4096",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= REQUIRED_KEYS
    assert data["kv_bytes_per_token"] == 524_288
    assert data["fits"] is True and data["tp"] == 1
    assert set(data["launch"]) == {"vllm", "sglang", "tgi", "trtllm", "llamacpp"}
    assert "--max-model-len 4096" in data["launch"]["vllm"]
    assert 6.0 <= data["tpot_lower_bound_ms"] <= 7.2


def test_kv_cache_space_sets_the_pool() -> None:
    out = run_plan(
        "--model",
        "llama-2-7b",
        "--gpu",
        "cpu-host",
        "--kv-cache-space",
        "2",
        "--block-size",
        "32",
        "--scenario",
        "none",
        "--max-model-len",
        "2048",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["kv_capacity_tokens"] == 4096  # 2 GiB / 512 KiB per token


def test_does_not_fit_exits_2_with_one_line_naming_the_term() -> None:
    out = run_plan("--model", "llama-3.1-70b", "--gpu", "l4")
    assert out.returncode == 2
    assert "DOES NOT FIT" in out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: weights")
    # no launch command for a config that cannot start (llama.cpp's read -c 524288)
    assert "Launch commands: none while it does not fit" in out.stdout
    assert "llama-server" not in out.stdout and "api_server" not in out.stdout
    data = json.loads(run_plan("--model", "llama-3.1-70b", "--gpu", "l4", "--json").stdout)
    assert data["fits"] is False and data["launch"] == {} and data["launch_notes"] == {}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--model", "lama-3.1-8b"], "llama-3.1-8b"),
        (["--gpu", "h100-sx"], "h100-sxm"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--block-size", "0"], "--block-size"),
        (["--gpus", "-1"], "--gpus"),
        (["--kv-dtype", "fp4"], "--kv-dtype"),
        (["--quant", "int3"], "--quant"),
        (["--scenario", "chatt"], "--scenario"),
        (["--max-model-len", "10000000"], "--max-model-len"),
        (["--overhead", "cuda_graphs_gib"], "--overhead"),
        (["--overhead", "nope=1"], "--overhead"),
        (["--model", "/no/such/config.json"], "config"),
        (["--pp", "3"], "--pp"),  # was ignored without --tp
        (["--pp", "1000", "--tp", "1", "--gpus", "1000"], "--pp"),  # 32 layers, 1000 stages
        (["--overhead", "foo=1"], "names: cuda_context_gib, cublas_workspace_gib"),
        (["--quant", ""], "--quant: is empty"),  # was ignored
        (["--scenario", ""], "--scenario: is empty"),  # was read as none
        # vLLM's start-up rule max_num_batched_tokens >= max_num_seqs, the knob given named
        (["--max-num-batched-tokens", "1"], "--max-num-batched-tokens: 1 is below"),
        (["--max-num-seqs", "99999999999"], "--max-num-seqs: 99,999,999,999 is above"),
        # not one of vLLM's BlockSize values (vllm/config/cache.py): refused before planning
        (["--block-size", "1000000"], "--block-size: 1000000 is not one of vLLM's block sizes"),
        # a block larger than the whole pool: the block size is what to change
        (
            ["--kv-cache-space", "0.001", "--block-size", "256"],
            "error: block_size: does not fit: one block of",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], field: str) -> None:
    out = run_plan(*args)
    assert out.returncode == 2, out.stdout
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert field in lines[0]


def test_hardware_file_adds_a_gpu(tmp_path) -> None:
    spec = tmp_path / "gpus.yaml"
    spec.write_text(
        "my-card:\n"
        "  display_name: My Card 48G\n"
        "  vendor: Example\n"
        "  memory_gib: 48\n"
        "  memory_bandwidth_gbs: 1000\n"
        "  tflops: {bf16: 200}\n"
        "  devices_per_node: 4\n"
        "  interconnect: pcie\n"
        "  interconnect_gbs: 32\n"
        "  source: example datasheet\n"
    )
    out = run_plan(
        "--model", "llama-3.1-8b", "--gpu", "my-card", "--hardware-file", str(spec), "--json"
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["hardware"] == "my-card"
    # 16 GB of bf16 weights read once per token at 1,000 GB/s: ~16 ms at batch 1.
    assert 15.0 <= data["tpot_lower_bound_ms"] <= 17.5


def test_a_sliding_window_plan_shows_the_cost_its_blocks_are_counted_at() -> None:
    """Mistral 7B v0.1 (window 4,096 of 32,768): 231,087 blocks x 16 x the full 131,072 B a
    token read as 484 GB in a 56 GiB pool; the row beside it gives the 16,384 B a token
    its blocks are counted at."""
    out = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "plan", "-m", "mistral-7b-v0.1", "-s", "none"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    row = next(ln for ln in out.stdout.splitlines() if "(windows capped)" in ln)
    assert "max_model_len=32,768" in row and "16,384" in row
    plain = run_plan("-m", "llama-3.1-8b")
    assert "(windows capped)" not in plain.stdout
