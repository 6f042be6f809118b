"""Engine adapters: canonical EngineConfig -> each engine's real command line (golden tests).

Flag names are the ones documented for the versions named in each adapter's docstring
(vLLM 0.32.0, SGLang 0.5.x, TGI 3.3.x, TensorRT-LLM 1.x, llama.cpp b11434).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servetune.engines import ENGINES, EngineConfig, LaunchSpec, launch_commands
from servetune.engines import vllm as vllm_adapter
from servetune.engines.base import GIB, PlannedPool
from servetune.engines.registry import adapter, launch_command
from servetune.errors import InputError

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TUNED = EngineConfig(
    max_num_seqs=64,
    max_num_batched_tokens=8192,
    max_model_len=8192,
    kv_cache_dtype="fp8",
    tensor_parallel_size=2,
    gpu_memory_utilization=0.92,
    enable_prefix_caching=False,
    enforce_eager=True,
)


def test_launch_commands_covers_every_engine_from_one_config() -> None:
    specs = launch_commands(TUNED, MODEL)
    assert list(specs) == list(ENGINES)
    assert all(isinstance(s, LaunchSpec) for s in specs.values())
    assert specs["vllm"].argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert specs["sglang"].argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert specs["tgi"].argv[0] == "text-generation-launcher"
    assert specs["trtllm"].argv[:2] == ["trtllm-serve", MODEL]
    assert specs["llamacpp"].argv[0] == "llama-server"


def test_vllm_golden() -> None:
    spec = launch_command("vllm", TUNED, MODEL)
    assert spec.argv == [
        "python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", MODEL, "--host", "127.0.0.1", "--port", "8000",
        "--kv-cache-dtype", "fp8",
        "--tensor-parallel-size", "2",
        "--max-model-len", "8192",
        "--max-num-seqs", "64",
        "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.92",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ]  # fmt: skip
    assert spec.env == {} and spec.unsupported == []


def test_sglang_golden() -> None:
    spec = launch_command("sglang", TUNED, MODEL)
    assert spec.argv == [
        "python", "-m", "sglang.launch_server",
        "--model-path", MODEL, "--host", "127.0.0.1", "--port", "30000",
        "--kv-cache-dtype", "fp8_e4m3",
        "--tp-size", "2",
        "--context-length", "8192",
        "--max-running-requests", "64",
        "--chunked-prefill-size", "8192",
        "--mem-fraction-static", "0.92",
        "--disable-radix-cache",
        "--disable-cuda-graph",
        "--enable-metrics",
    ]  # fmt: skip
    assert spec.unsupported == []


def test_tgi_golden() -> None:
    spec = launch_command("tgi", TUNED, MODEL)
    assert spec.argv == [
        "text-generation-launcher",
        "--model-id", MODEL, "--hostname", "127.0.0.1", "--port", "3000",
        "--kv-cache-dtype", "fp8_e4m3fn",
        "--num-shard", "2",
        "--max-total-tokens", "8192",
        "--max-batch-size", "64",
        "--max-batch-prefill-tokens", "8192",
        "--cuda-memory-fraction", "0.92",
        "--cuda-graphs", "0",
    ]  # fmt: skip
    assert spec.env == {"PREFIX_CACHING": "0"}
    assert spec.shell().startswith("PREFIX_CACHING=0 text-generation-launcher ")


def test_trtllm_golden_with_config_file() -> None:
    # An explicit KV size goes to kv_cache_config.max_gpu_total_bytes: no fraction flag.
    cfg = TUNED.with_(block_size=32, kv_cache_space_gib=20)
    spec = launch_command("trtllm", cfg, MODEL)
    assert spec.argv == [
        "trtllm-serve", MODEL, "--host", "127.0.0.1", "--port", "8000",
        "--tp_size", "2",
        "--max_batch_size", "64",
        "--max_num_tokens", "8192",
        "--max_seq_len", "8192",
        "--enable_chunked_prefill",
        "--config", "servetune-trtllm.yaml",
    ]  # fmt: skip
    extra = yaml.safe_load(spec.files["servetune-trtllm.yaml"])
    assert extra == {
        "cuda_graph_config": None,
        "kv_cache_config": {
            "dtype": "fp8",
            "enable_block_reuse": False,
            "max_gpu_total_bytes": 20 * 2**30,
            "tokens_per_block": 32,
        },
    }
    shell = spec.shell()
    assert shell.startswith("cat > servetune-trtllm.yaml <<'EOF'\n")
    assert "\nEOF\ntrtllm-serve " in shell


def test_trtllm_defaults_need_no_config_file() -> None:
    spec = launch_command("trtllm", EngineConfig(), MODEL)
    assert "--config" not in spec.argv and spec.files == {}
    # Chunked prefill is on in the canonical config but off by default in trtllm-serve.
    assert spec.argv[-1] == "--enable_chunked_prefill"


def test_llamacpp_golden() -> None:
    cfg = EngineConfig(
        max_model_len=2048, parallel_slots=4, batch_size=512, ubatch_size=256, threads=8,
        n_gpu_layers=99, kv_cache_dtype="int8", enable_prefix_caching=False,
    )  # fmt: skip
    spec = launch_command("llamacpp", cfg, "/models/gemma.gguf", port=9000)
    assert spec.argv == [
        "llama-server", "-m", "/models/gemma.gguf", "--host", "127.0.0.1", "--port", "9000",
        "-c", "8192", "-np", "4", "-b", "512", "-ub", "256", "-t", "8", "-ngl", "99",
        "-ctk", "q8_0", "-ctv", "q8_0", "--no-cache-prompt", "--metrics", "--slots",
    ]  # fmt: skip
    assert spec.unsupported == []


def test_llamacpp_context_is_per_slot_unless_unified() -> None:
    """-c is the whole pool: without --kv-unified each of -np slots gets c/np tokens."""
    base = EngineConfig(max_model_len=1024, parallel_slots=4)
    split = launch_command("llamacpp", base, "m.gguf").argv
    assert split[split.index("-c") + 1] == "4096"
    unified = launch_command("llamacpp", base.with_(kv_unified=True), "m.gguf").argv
    assert unified[unified.index("-c") + 1] == "1024" and "--kv-unified" in unified
    pool = launch_command("llamacpp", base.with_(kv_cache_tokens=3000), "m.gguf").argv
    assert pool[pool.index("-c") + 1] == "3000"


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_llamacpp_context_is_the_planned_pool() -> None:
    """A plan of 28,048 KV tokens for 64 slots of 8,192: -c is the pool, not 64 x 8,192;
    split per slot it would leave 438 tokens each, so the slots share it (--kv-unified)."""
    cfg = EngineConfig(max_model_len=8192, max_num_seqs=64)
    pool = PlannedPool(kv_tokens=28_048, kv_bytes=3.4 * GIB, free_after_load_bytes=5.6 * GIB)
    spec = launch_command("llamacpp", cfg, "m.gguf", pool=pool)
    assert _arg(spec.argv, "-c") == "28048" and _arg(spec.argv, "-np") == "64"
    assert "--kv-unified" in spec.argv
    assert any(n.startswith("kv_unified:") and "438" in n for n in spec.notes)
    # A pool larger than the slots can fill: -c is what they fill, split per slot.
    big = PlannedPool(kv_tokens=10**6, kv_bytes=120 * GIB, free_after_load_bytes=130 * GIB)
    roomy = launch_command("llamacpp", cfg, "m.gguf", pool=big).argv
    assert _arg(roomy, "-c") == str(8192 * 64) and "--kv-unified" not in roomy
    # A plan turns a memory fraction or KV size into -c: nothing left unsupported.
    sized = cfg.with_(gpu_memory_utilization=0.8, kv_cache_space_gib=3)
    assert launch_command("llamacpp", sized, "m.gguf", pool=pool).unsupported == []
    # The user's own KV size wins over the plan.
    own = launch_command("llamacpp", cfg.with_(kv_cache_tokens=4096), "m.gguf", pool=pool)
    assert _arg(own.argv, "-c") == "4096"


def test_trtllm_fraction_is_of_the_memory_free_after_loading() -> None:
    """80 GiB device, 16 GiB weights, 1 GiB activation peak, 1.5 GiB overheads, util 0.9:
    the plan's pool is 72 - 18.5 = 53.5 GiB of the 61.5 GiB left free = 0.8699 (floored),
    where passing 0.9 through would give TensorRT-LLM 55.35 GiB."""
    pool = PlannedPool(kv_tokens=1, kv_bytes=53.5 * GIB, free_after_load_bytes=61.5 * GIB)
    spec = launch_command("trtllm", EngineConfig(), MODEL, pool=pool)
    assert _arg(spec.argv, "--kv_cache_free_gpu_memory_fraction") == "0.8699"
    assert any("53.50 GiB" in n and "61.50 GiB" in n for n in spec.notes)


def test_trtllm_without_a_plan_reports_the_fraction_it_cannot_convert() -> None:
    spec = launch_command("trtllm", EngineConfig(gpu_memory_utilization=0.92), MODEL)
    assert "--kv_cache_free_gpu_memory_fraction" not in spec.argv
    assert spec.unsupported == ["gpu_memory_utilization"]
    assert any("free after loading" in n for n in spec.notes)
    default = launch_command("trtllm", EngineConfig(), MODEL)
    assert default.unsupported == []


def test_defaults_emit_no_tuning_flags() -> None:
    spec = launch_command("vllm", EngineConfig(), MODEL)
    assert spec.argv[3:] == ["--model", MODEL, "--host", "127.0.0.1", "--port", "8000"]


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("vllm", []),
        ("sglang", []),
        ("tgi", ["scheduling_policy"]),
        ("trtllm", ["scheduling_policy"]),
        ("llamacpp", ["scheduling_policy"]),
    ],
)
def test_unmapped_knobs_are_reported_not_dropped(engine: str, expected: list[str]) -> None:
    spec = launch_command(engine, EngineConfig(scheduling_policy="priority"), MODEL)
    assert spec.unsupported == expected
    if expected:
        assert any(n.startswith("scheduling_policy:") for n in spec.notes)


def test_llamacpp_only_knobs_are_unsupported_elsewhere() -> None:
    cfg = EngineConfig(parallel_slots=4, threads=2, kv_unified=True)
    for engine in ("vllm", "sglang", "tgi", "trtllm"):
        spec = launch_command(engine, cfg, MODEL)
        assert {"parallel_slots", "threads", "kv_unified"} <= set(spec.unsupported), engine


def test_kv_pool_knobs_map_or_report() -> None:
    gib = EngineConfig(kv_cache_space_gib=4)
    assert "kv_cache_space_gib" in launch_command("sglang", gib, MODEL).unsupported
    assert "kv_cache_space_gib" in launch_command("tgi", gib, MODEL).unsupported
    assert "kv_cache_space_gib" in launch_command("llamacpp", gib, MODEL).unsupported
    tokens = EngineConfig(kv_cache_tokens=100_000, block_size=32)
    sg = launch_command("sglang", tokens, MODEL).argv
    assert sg[sg.index("--max-total-tokens") + 1] == "100000"
    tgi = launch_command("tgi", tokens, MODEL).argv
    assert tgi[tgi.index("--max-batch-total-tokens") + 1] == "100000"
    vl = launch_command("vllm", tokens, MODEL).argv
    assert vl[vl.index("--num-gpu-blocks-override") + 1] == "3125"


def test_vllm_cpu_rules() -> None:
    """CPU build: KV pool from VLLM_CPU_KVCACHE_SPACE (whole GiB), block size multiple of 32."""
    spec = launch_command(
        "vllm", EngineConfig(kv_cache_space_gib=2, block_size=64), MODEL, device="cpu"
    )
    assert spec.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert spec.argv[spec.argv.index("--kv-cache-memory-bytes") + 1] == str(2 * 2**30)
    assert spec.argv[spec.argv.index("--block-size") + 1] == "64"
    frac = launch_command("vllm", EngineConfig(kv_cache_space_gib=1.5), MODEL, device="cpu")
    assert frac.env == {} and str(3 * 2**29) in frac.argv
    default = launch_command("vllm", EngineConfig(), MODEL, device="cpu")
    assert "--block-size" not in default.argv
    with pytest.raises(InputError, match="multiple of 32"):
        launch_command("vllm", EngineConfig(block_size=48), MODEL, device="cpu")


def test_extra_args_are_appended_verbatim() -> None:
    cfg = EngineConfig(extra_args=("--load-format", "dummy"))
    assert launch_command("vllm", cfg, MODEL).argv[-2:] == ["--load-format", "dummy"]


def test_shell_is_copy_pasteable() -> None:
    spec = launch_command(
        "vllm", EngineConfig(kv_cache_space_gib=1), "/models/my model", device="cpu"
    )
    line = spec.shell()
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE=1 python -m ")
    assert "'/models/my model'" in line
    assert shlex.split(line)[1:] == spec.argv


def test_prefix_replaces_the_interpreter() -> None:
    spec = launch_command("vllm", EngineConfig(), MODEL, prefix=["/venv/bin/python"], port=1234)
    assert spec.argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert spec.url == "http://127.0.0.1:1234"


def test_unknown_engine_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match="did you mean vllm"):
        adapter("vlm")


def test_vllm_log_parsing_reads_effective_settings() -> None:
    log = (
        "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.32.0\n"
        "(EngineCore pid=2) INFO [kv_cache_utils.py:2328] CPU KV cache size: 131,072 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 64.00x\n"
    )
    got = vllm_adapter.parse_log(log)
    assert got["version"] == "0.32.0"
    assert got["kv_cache_tokens"] == 131072 and got["kv_cache_pool"] == "CPU"
    assert got["max_concurrency_at_max_len"] == 64.0
    assert "kv_cache_dtype" not in got and "quantization" not in got  # no config line


def test_vllm_log_parsing_reads_the_kv_cache_dtype_vllm_resolved() -> None:
    """vLLM resolves --kv-cache-dtype auto before it logs its engine config: a ModelOpt FP8
    checkpoint's line reads fp8_e4m3 (vllm#29980), a plain one keeps auto (as logged by
    vLLM-CPU 0.32.0 here)."""
    line = (
        "(EngineCore pid=2) INFO 12-04 21:31:38 [core.py:133] Initializing a V1 LLM engine "
        "(v0.32.0) with config: model='/m', speculative_config=None, dtype={dtype}, "
        "max_seq_len=2048, quantization={quant}, enforce_eager=True, kv_cache_dtype={kv}, "
        "device_config=cpu\n"
    )
    got = vllm_adapter.parse_log(
        line.format(dtype="torch.bfloat16", quant="modelopt", kv="fp8_e4m3")
    )
    assert (got["kv_cache_dtype"], got["dtype"], got["quantization"]) == (
        "fp8",
        "bfloat16",
        "modelopt",
    )
    got = vllm_adapter.parse_log(line.format(dtype="torch.float32", quant="None", kv="auto"))
    assert (got["kv_cache_dtype"], got["dtype"]) == ("auto", "float32")
    assert "quantization" not in got
    got = vllm_adapter.parse_log(line.format(dtype="torch.float16", quant="fp8", kv="bfloat16"))
    assert (got["kv_cache_dtype"], got["quantization"]) == ("bf16", "fp8")


# --- CLI -----------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_cli_command_prints_every_engine() -> None:
    out = _cli("engine", "command", "all", "-m", MODEL, "--set", "scheduling_policy=priority")
    assert out.returncode == 0, out.stderr
    for name in ENGINES:
        assert f"# {name}" in out.stdout
    assert "# unsupported by tgi: scheduling_policy" in out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("engine", "command", "vlm", "-m", "x"), "unknown engine"),
        (("engine", "command", "vllm", "-m", "x", "--set", "gpu_memory_utilization=1.5"), "1"),
        (("engine", "command", "vllm", "-m", "x", "--set", "max_num_seq=3"), "max_num_seqs"),
        (("engine", "install", "tgi"), "cannot install"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: tuple[str, ...], needle: str) -> None:
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr


def test_cli_engine_not_installed_says_how(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    env = {"SERVETUNE_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    out = _cli("engine", "launch", "llamacpp", "-m", str(model), env=env)
    assert out.returncode == 2
    assert "llamacpp is not installed" in out.stderr
    assert "servetune engine install llamacpp" in out.stderr


def test_flag_table_emits_only_knobs_off_their_defaults_in_order() -> None:
    from servetune.engines.base import FlagBuilder

    table = {
        "max_num_seqs": "--seqs",
        "gpu_memory_utilization": "--mem",
        "enable_prefix_caching": "--no-prefix",  # default on: a negative switch
        "enforce_eager": "--eager",  # default off: a switch
        "max_model_len": "--len",  # left at its default: nothing
    }
    b = FlagBuilder(EngineConfig(), ["x"])
    b.map(table)
    assert b.argv == ["x"]
    cfg = EngineConfig(
        max_num_seqs=8, gpu_memory_utilization=1.0, enable_prefix_caching=False,
        enforce_eager=True,
    )  # fmt: skip
    b = FlagBuilder(cfg, ["x"])
    b.map(table)
    assert b.argv == ["x", "--seqs", "8", "--mem", "1", "--no-prefix", "--eager"]
