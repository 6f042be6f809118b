"""`--set` and the engine adapters: the KV pool vLLM CPU really gets from kv_cache_tokens,
fields --set must not reach, the device a launch checks its rules on, and KV sizing knobs
that one engine does not apply."""

from __future__ import annotations

import pytest
from tests.cli_run import run_cli

from servetune.cli.engine_cmd import parse_sets
from servetune.engines.config import EngineConfig
from servetune.engines.registry import launch_command
from servetune.errors import InputError


def _override(cfg: EngineConfig, device: str) -> int:
    argv = launch_command("vllm", cfg, "m", device=device).argv  # type: ignore[arg-type]
    return int(argv[argv.index("--num-gpu-blocks-override") + 1])


def test_vllm_cpu_counts_kv_cache_tokens_in_its_own_128_token_blocks() -> None:
    """vLLM CPU picks block size 128 when none is given: 4,096 tokens are 32 of its blocks,
    not 256 (which it would fill with 32,768 tokens)."""
    tokens = EngineConfig(kv_cache_tokens=4096)
    assert _override(tokens, "cpu") == 32
    assert _override(tokens, "gpu") == 256  # GPU: blocks of 16
    assert _override(tokens.with_(block_size=64), "cpu") == 64  # a given block size is used
    spec = launch_command("vllm", tokens, "m", device="cpu")
    assert "kv_cache_tokens: 4096 tokens -> 32 blocks of 128" in spec.notes


@pytest.mark.parametrize(
    ("knob", "fix"), [("engine=sglang", "ENGINE argument"), ('extra_args=["-x"]', "--extra")]
)
def test_set_refuses_the_engine_and_extra_args(
    capsys: pytest.CaptureFixture[str], knob: str, fix: str
) -> None:
    """`--set engine=sglang` on a vLLM command applied SGLang's rules (lpm) to vLLM's flags."""
    code, out, err = run_cli(
        capsys, "engine", "command", "vllm", "-m", "m", "--set", knob,
        "--set", "scheduling_policy=lpm",
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"--set {knob.partition('=')[0]}: not a knob" in err
    assert fix in err


def test_simulate_refuses_set_engine(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "simulate", "--set", "engine=sglang", "--no-store")
    assert code == 2 and "--set engine: not a knob" in err and "--engine" in err


def test_set_checks_the_block_size_rule_of_the_device_given() -> None:
    with pytest.raises(InputError, match="multiple of 32"):
        parse_sets("vllm", ["block_size=48"], device="cpu")
    assert parse_sets("vllm", ["block_size=16"]).block_size == 16  # GPU: a multiple of 16
    with pytest.raises(InputError, match="one of vLLM's block sizes"):
        parse_sets("vllm", ["block_size=48"])  # a multiple of 16, not a BlockSize value


def test_launch_on_a_cpu_host_checks_the_cpu_block_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU host `engine launch` refused block_size=24 with the GPU rule (16), so 48
    passed the check and failed later in vLLM."""
    monkeypatch.setattr("servetune.engines.process.default_device", lambda: "cpu")
    code, _, err = run_cli(capsys, "engine", "launch", "vllm", "-m", "x", "--set", "block_size=24")
    assert code == 2 and "multiple of 32, which vLLM's CPU backend needs" in err


@pytest.mark.parametrize("command", ["simulate", "calibrate"])
def test_simulate_and_calibrate_on_cpu_host_name_the_cpu_block_rule(
    capsys: pytest.CaptureFixture[str], command: str, tmp_path
) -> None:
    """`simulate --gpu cpu-host --set block_size=24` named the GPU rule (a multiple of 16),
    whose fix (16, 32, 64) the CPU backend refuses in turn."""
    args = {
        "simulate": ["simulate", "--no-store"],
        "calibrate": [
            "calibrate",
            str(tmp_path / "r.json"),
            "-m",
            "llama-3.1-8b",
            "-o",
            str(tmp_path / "p.json"),
        ],
    }[command]
    code, out, err = run_cli(capsys, *args, "--gpu", "cpu-host", "--set", "block_size=24")
    assert code == 2 and out == ""
    assert "multiple of 32, which vLLM's CPU backend needs" in err


def test_vllm_says_which_kv_knob_sizes_the_pool_when_both_are_given() -> None:
    spec = launch_command("vllm", EngineConfig(kv_cache_tokens=4096, kv_cache_space_gib=2), "m")
    assert any(n.startswith("kv_cache_space_gib:") and "override" in n for n in spec.notes)


def test_trtllm_reports_the_memory_fraction_kv_cache_space_gib_overrides() -> None:
    """With kv_cache_space_gib, TensorRT-LLM's pool is max_gpu_total_bytes: a non-default
    gpu_memory_utilization was dropped with no word."""
    both = EngineConfig(kv_cache_space_gib=2, gpu_memory_utilization=0.5)
    spec = launch_command("trtllm", both, "m")
    assert spec.why_unsupported("gpu_memory_utilization") == "kv_cache_space_gib sizes the KV pool"
    alone = launch_command("trtllm", EngineConfig(kv_cache_space_gib=2), "m")
    assert "gpu_memory_utilization" not in alone.unsupported
