"""`plan` shows what a KV pool POOL_DOUBT smaller holds where servetune only estimates
vLLM's own pool (plan.memory.pool_in_doubt), the doubt `simulate` runs again
(sim.pool_doubt): the same share, the same rule for a known pool."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from servetune.engines.config import EngineConfig
from servetune.hardware.catalog import get_hardware
from servetune.model.catalog import get_model
from servetune.plan import kv as kvmath
from servetune.plan.memory import POOL_DOUBT, pool_in_doubt
from servetune.plan.planner import evaluate

QWEN, H100 = get_model("qwen3-32b"), get_hardware("h100-sxm")
TP2 = EngineConfig(tensor_parallel_size=2, max_num_seqs=64)
CONTEXT = 4096 + 1024  # issue 15's KV-bound row


def test_a_kv_bound_vllm_pool_is_counted_again_six_percent_smaller_by_hand() -> None:
    ev = evaluate(QWEN, H100, TP2, avg_context=CONTEXT)
    less = ev.smaller_pool
    assert less is not None and less.share == POOL_DOUBT == 0.06
    per_block = 16 * ev.budget.kv_effective_bytes_per_token
    blocks = math.floor(ev.budget.kv_pool_bytes * (1 - POOL_DOUBT) / per_block)
    assert less.kv_capacity_tokens == blocks * 16
    assert blocks < ev.kv_blocks  # fewer blocks than the pool vLLM is thought to size
    seqs = blocks // math.ceil(CONTEXT / 16)
    assert less.max_concurrency == min(seqs, 64) < ev.max_concurrency <= 64


def test_the_cap_still_binds_on_a_smaller_pool_with_room_to_spare() -> None:
    ev = evaluate(QWEN, H100, TP2, avg_context=1024)
    assert ev.smaller_pool is not None
    assert ev.smaller_pool.max_concurrency == ev.max_concurrency == 64


def test_a_sliding_window_model_counts_its_window_on_the_smaller_pool_too() -> None:
    model = get_model("gpt-oss-20b")
    ev = evaluate(model, H100, EngineConfig(max_num_seqs=1024), avg_context=32_768)
    assert ev.smaller_pool is not None
    ctx_bytes = kvmath.effective_kv_bytes_per_token(model, ev.budget.kv_dtype_bytes, 32_768)
    blocks = kvmath.pool_blocks(ev.budget.kv_pool_bytes * (1 - POOL_DOUBT), 16, ctx_bytes)
    assert ev.smaller_pool.max_concurrency == min(blocks // (32_768 // 16), 1024)
    assert ev.smaller_pool.max_concurrency < ev.max_concurrency


@pytest.mark.parametrize(
    "cfg, gpu",
    [
        (TP2.model_copy(update={"kv_cache_tokens": 200_000}), "h100-sxm"),
        (TP2.model_copy(update={"kv_cache_space_gib": 20.0}), "h100-sxm"),
        (TP2.model_copy(update={"engine": "sglang"}), "h100-sxm"),
        (EngineConfig(kv_cache_space_gib=4.0, block_size=32), "cpu-host"),
    ],
    ids=["blocks_given", "bytes_given", "sglang", "cpu"],
)
def test_a_pool_that_is_known_has_no_doubt(cfg: EngineConfig, gpu: str) -> None:
    hw = get_hardware(gpu)
    assert not pool_in_doubt(cfg, hw)
    model = QWEN if hw.kind == "gpu" else get_model("llama-3.2-1b")
    assert evaluate(model, hw, cfg, avg_context=CONTEXT).smaller_pool is None


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "servetune.cli.app", "plan", "-m", "qwen3-32b", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_plan_prints_the_smaller_pool_where_it_holds_fewer_users_and_only_there() -> None:
    flags = ("--gpus", "2", "--tp", "2", "--input-len", "4096", "--output-len", "1024")
    js = _plan(*flags, "--json")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    less = data["smaller_pool"]
    assert less["share"] == POOL_DOUBT and less["max_concurrency"] < data["max_concurrency"]
    text = _plan(*flags)
    row = f"{less['kv_capacity_tokens']:,} tokens, {less['max_concurrency']} sequences"
    assert "if vLLM's pool is 6% smaller" in text.stdout and row in text.stdout
    # room to spare: the cap binds on either pool, so the row would say nothing new
    roomy = _plan("--gpus", "2", "--tp", "2", "--input-len", "512", "--output-len", "256")
    assert roomy.returncode == 0 and "6% smaller" not in roomy.stdout
    given = _plan(*flags, "--kv-cache-space", "30", "--json")
    assert json.loads(given.stdout)["smaller_pool"] is None
