"""The planner against real artefacts on disk: a real GGUF file's size."""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune.model.catalog import get_model
from servetune.plan.quant import WEIGHT_FORMATS, weights_bytes
from servetune.plan.service import PlanArgs, run_plan


def test_q4_k_m_weights_match_the_real_gemma_gguf(gemma_gguf: Path) -> None:
    """Gemma 3 270M has hidden 640 (not a multiple of 256), so llama.cpp stores the Q/K/V,
    gate/up and tied embedding in fallback types; the plan must account for that. The file
    also holds the 262k-token vocabulary and metadata (a few MB), so the weights sit just
    under the file size."""
    predicted = weights_bytes(get_model("gemma-3-270m"), WEIGHT_FORMATS["q4_k_m"])
    actual = gemma_gguf.stat().st_size
    assert 0.95 * actual <= predicted <= actual
    # Without the fallback rule the estimate would be ~20% low: the rule is what matters.
    naive = get_model("gemma-3-270m").params_total * 4.8 / 8
    assert naive < 0.85 * actual


def test_llamacpp_launch_names_a_gguf_file() -> None:
    result = run_plan(
        PlanArgs(model="gemma-3-270m", gpu="cpu-host", scenario="cpu-edge", quant="q4_k_m")
    )
    argv = result.launch["llamacpp"].argv
    assert argv[argv.index("-m") + 1] == "gemma-3-270m-it-Q4_K_M.gguf"  # the served repo
    assert result.engine == "llamacpp"


@pytest.mark.parametrize("dtype", ["auto", "float16"])
def test_llamacpp_gguf_name_for_unquantized(dtype: str) -> None:
    result = run_plan(PlanArgs(model="llama-3.1-8b", gpu="h100-sxm", dtype=dtype))
    name = result.launch["llamacpp"].argv[result.launch["llamacpp"].argv.index("-m") + 1]
    kind = "F16" if dtype == "float16" else "BF16"
    assert name == f"Llama-3.1-8B-Instruct-{kind}.gguf"
