"""The generated test model: the dtype it is written and served in follows the host's CPU."""

from __future__ import annotations

import json
from pathlib import Path

from servetune.engines.testmodel import LlamaSpec, fast_cpu_dtype, make_llama_dir

# Flag lines as /proc/cpuinfo prints them (trimmed): this repo's AVX2-only CI host, an
# AVX-512 Xeon, and an ARM host (whose line is "Features" and names no AVX at all).
AVX2_EPYC = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni"
AVX512_XEON = "fpu sse sse2 avx avx2 avx512f avx512dq avx512bw avx512_bf16 amx_bf16"
ARM = "fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16 i8mm"


def test_avx2_only_x86_serves_float32_and_others_keep_bf16() -> None:
    assert fast_cpu_dtype(AVX2_EPYC.split()) == "float32"
    assert fast_cpu_dtype(AVX512_XEON.split()) == "bfloat16"
    assert fast_cpu_dtype(ARM.split()) == "bfloat16"
    assert fast_cpu_dtype([*AVX2_EPYC.split(), "avx512f"]) == "bfloat16"
    assert fast_cpu_dtype([]) == "bfloat16"  # no flags line read (hardware.local.cpu_facts)


def test_the_spec_dtype_is_what_config_json_says(tmp_path: Path) -> None:
    """The planner reads config.json's torch_dtype: it must be the dtype vLLM is given."""
    for dtype in ("float32", "bfloat16"):
        out = make_llama_dir(tmp_path / dtype, LlamaSpec(dtype=dtype, vocab_target=600))
        assert json.loads((out / "config.json").read_text())["torch_dtype"] == dtype
    assert LlamaSpec(dtype="float32").key() != LlamaSpec(dtype="bfloat16").key()


def test_engine_launch_serves_a_generated_dir_in_its_own_dtype() -> None:
    """`servetune engine launch vllm --model <make-model dir>` adds what the tests' config
    has: random weights, and --dtype float32 for a float32 dir (vLLM's auto would serve it
    in bf16); a dtype the user set is kept."""
    from servetune.cli.engine_cmd import generated_model_config
    from servetune.engines.config import EngineConfig

    cfg, notes = generated_model_config(EngineConfig(), {"dtype": "float32"})
    assert cfg.dtype == "float32" and cfg.extra_args == ("--load-format", "dummy")
    assert len(notes) == 2
    cfg, notes = generated_model_config(EngineConfig(), {"dtype": "bfloat16"})
    assert cfg.dtype == "auto" and notes == ["adding --load-format dummy (random weights)"]
    mine = EngineConfig(dtype="bfloat16", extra_args=("--load-format", "dummy"))
    assert generated_model_config(mine, {"dtype": "float32"}) == (mine, [])


def test_a_float32_decode_step_reads_the_bf16_models_weight_bytes(tmp_path: Path) -> None:
    """A small batch's decode step is bound by the weight bytes it reads: the float32
    model (narrower MLP) reads within 5% of the bf16 one's, counted by the planner from each
    generated config.json (so the float32 test engine is not 2x slower per step)."""
    from servetune.model import get_model

    step = {}
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        spec = LlamaSpec(dtype=dtype)
        out = make_llama_dir(tmp_path / dtype, spec)
        model = get_model(str(out))
        assert model.intermediate_size == spec.intermediate
        step[dtype] = model.params_matmul_active * size
    assert LlamaSpec(dtype="float32").intermediate < LlamaSpec(dtype="bfloat16").intermediate
    assert abs(step["float32"] / step["bfloat16"] - 1) < 0.05, step
    assert LlamaSpec(dtype="float32", intermediate=2816).intermediate == 2816  # a given width
