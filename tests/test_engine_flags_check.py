"""SGLang, TGI and TensorRT-LLM command lines and metric names, checked against the
engines' own published definitions (data/engine_flags/*.json, pinned versions) rather
than against strings written by the same hand as the adapters."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from servetune.engines import EngineConfig, flagcheck
from servetune.engines.base import GIB, PlannedPool
from servetune.engines.registry import adapter, launch_command

POOL = PlannedPool(kv_tokens=50_000, kv_bytes=12 * GIB, free_after_load_bytes=30 * GIB)

# One config per knob moved off its default (every value of the small enums), plus
# the combinations that take other branches in the adapters.
ONE_KNOB: list[dict[str, object]] = [
    {},
    *({"dtype": d} for d in ("bfloat16", "float16", "float32")),
    *({"quantization": q} for q in ("fp8", "int8", "awq", "gptq", "mxfp4", "q4_k_m")),
    *({"kv_cache_dtype": k} for k in ("fp16", "bf16", "fp8", "int8")),
    {"tensor_parallel_size": 4},
    {"pipeline_parallel_size": 2},
    {"data_parallel_size": 2},
    {"max_model_len": 8192},
    {"max_num_seqs": 64},
    {"max_num_batched_tokens": 4096},
    {"gpu_memory_utilization": 0.85},
    {"kv_cache_space_gib": 20.0},
    {"kv_cache_tokens": 100_000},
    {"block_size": 32},
    {"enable_chunked_prefill": False},
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192, "max_model_len": 8192},
    {"enable_prefix_caching": False},
    {"scheduling_policy": "priority"},
    {"enforce_eager": True},
    {"parallel_slots": 4, "threads": 8, "kv_unified": True, "n_gpu_layers": 10},
]


@pytest.mark.parametrize("engine", flagcheck.CHECKED)
@pytest.mark.parametrize("knobs", ONE_KNOB, ids=lambda k: ",".join(k) or "defaults")
def test_every_emitted_flag_exists_with_its_type(engine: str, knobs: dict[str, object]) -> None:
    cli = flagcheck.load(engine)
    for pool in (None, POOL):
        spec = launch_command(engine, EngineConfig(**knobs), "org/model", pool=pool)
        assert flagcheck.check_argv(cli, spec.argv) == [], spec.shell()


@pytest.mark.parametrize("engine", flagcheck.CHECKED)
def test_canonical_metric_names_exist_with_their_kind(engine: str) -> None:
    assert flagcheck.check_metrics(flagcheck.load(engine), adapter(engine)) == []


@pytest.mark.parametrize("engine", flagcheck.CHECKED)
def test_adapter_targets_the_checked_in_version(engine: str) -> None:
    cli = flagcheck.load(engine)
    assert cli.version == adapter(engine).TARGET_VERSION
    assert cli.source.startswith("https://")
    assert len(cli.flags) > 20  # a whole CLI, not a hand-picked list (onnx-genai: 21)


def test_unknown_flag_is_caught() -> None:
    cli = flagcheck.load("sglang")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--max-num-seqs", "8"]
    assert flagcheck.check_argv(cli, argv) == ["--max-num-seqs: no such flag in sglang 0.5.23"]


@pytest.mark.parametrize(
    ("engine", "argv", "why"),
    [
        ("sglang", ["--mem-fraction-static", "most"], "wants float"),
        ("sglang", ["--max-running-requests", "1.5"], "wants int"),
        ("sglang", ["--kv-cache-dtype", "fp8"], "not one of"),
        ("sglang", ["--disable-radix-cache=1"], "takes no value"),
        ("sglang", ["--tp-size"], "needs a int value"),
        ("tgi", ["--dtype", "float32"], "not one of"),
        ("tgi", ["--cuda-graphs", "1,two"], "wants int"),
        ("tgi", ["--sharded", "yes"], "wants true/false"),
        ("trtllm", ["--max_batch_size", "lots"], "wants int"),
        ("trtllm", ["--enable_chunked_prefill", "true"], "a value with no flag"),
    ],
)
def test_wrong_value_type_is_caught(engine: str, argv: list[str], why: str) -> None:
    problems = flagcheck.check_argv(flagcheck.load(engine), ["exe", *argv])
    assert len(problems) == 1 and why in problems[0], problems


def test_extra_args_are_checked_too() -> None:
    spec = launch_command("tgi", EngineConfig(extra_args=("--max-seqs", "9")), "m")
    problems = flagcheck.check_argv(flagcheck.load("tgi"), spec.argv)
    assert problems == ["--max-seqs: no such flag in tgi 3.3.7"]


def test_renamed_or_retyped_metric_is_caught() -> None:
    class Renamed:
        METRICS = {"requests_running": "tgi_batch_size", "requests_waiting": "tgi_queue_size"}
        HISTOGRAMS = {"e2e_seconds": "tgi_queue_size"}

    problems = flagcheck.check_metrics(flagcheck.load("tgi"), Renamed)  # type: ignore[arg-type]
    assert problems == [
        "requests_running: tgi_batch_size is not a tgi 3.3.7 metric",
        "e2e_seconds: tgi_queue_size is a gauge in tgi, not a histogram",
    ]


def test_data_files_are_the_three_checked_engines() -> None:
    folder = resources.files("servetune") / "data" / "engine_flags"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    assert names == sorted(f"{e}.json" for e in flagcheck.CHECKED)
    for name in names:
        raw = json.loads((folder / name).read_text("utf-8"))
        kinds = {spec["type"] for spec in raw["flags"].values()}
        assert kinds <= {"str", "int", "float", "bool", "switch"}, name
