"""A GPU point that ran its KV pool to the edge is simulated again on a pool POOL_DOUBT
smaller (servetune knows vLLM's pool only to that share), and both answers are shown."""

from __future__ import annotations

import json

from cli_run import run_cli
from servetune.cli.sim_report import pool_note
from servetune.engines.config import EngineConfig
from servetune.hardware import get_hardware
from servetune.measure.session import Point
from servetune.measure.simulated import SimSession
from servetune.model import get_model
from servetune.sim.engine import simulate
from servetune.sim.pool_doubt import POOL_DOUBT, at_pool_edge
from servetune.store import Store
from servetune.validate.cases import closed_workload, fixed_tokens

QWEN, H100 = get_model("qwen3-32b"), get_hardware("h100-sxm")
TP2 = EngineConfig(tensor_parallel_size=2)


def loop(users: int, isl: int, osl: int, count: int | None = None):
    return closed_workload("t", users, count or 10 * users, fixed_tokens(isl), fixed_tokens(osl))


def test_a_point_at_its_pools_edge_is_run_again_on_a_smaller_pool():
    """Issue 15's KV-bound row (Qwen3-32B TP2 on H100, 64 users, 4096 / 1024): the pool
    holds 315,104 tokens, 64 whole sequences need 327,680, so it preempts; 6% less pool
    preempts far more and the prompts wait longer for blocks. The figures are those of a
    run with the user's own `kv_cache_tokens` at that size: one simulator, no second model."""
    spec = loop(64, 4096, 1024)
    res = SimSession(QWEN, H100, TP2).measure(Point("c64", spec))
    d, sim = res.target.sim.pool_doubt, res.target.sim
    assert sim.preemptions > 0 and d is not None and d.share == POOL_DOUBT
    tokens = int(res.target.kv_blocks * 16 * (1 - POOL_DOUBT)) // 16 * 16
    assert d.kv_capacity_tokens == tokens
    assert d.preemptions > sim.preemptions
    assert d.ttft_mean_ms > res.metrics.ttft_ms.mean and d.ttft_p50_ms > res.metrics.ttft_ms.p50
    fixed, _ = simulate(QWEN, H100, TP2.model_copy(update={"kv_cache_tokens": tokens}), spec)
    assert d.ttft_mean_ms == fixed.metrics.ttft_ms.mean
    assert d.preemptions == fixed.target.sim.preemptions


def test_no_doubt_where_the_pool_is_far_from_full_given_or_not_a_gpus():
    light = SimSession(QWEN, H100, TP2).measure(Point("c4", loop(4, 4096, 1024)))
    assert light.target.sim.preemptions == 0 and light.target.sim.pool_doubt is None
    # the user fixed the pool (vLLM's --num-gpu-blocks-override): it is known
    given = TP2.model_copy(update={"kv_cache_tokens": 200_000})
    res = SimSession(QWEN, H100, given).measure(Point("c64", loop(64, 4096, 1024)))
    assert res.target.sim.preemptions > 0 and res.target.sim.pool_doubt is None
    # or in memory (vLLM's --kv-cache-memory-bytes): known too
    in_gib = TP2.model_copy(update={"kv_cache_space_gib": 24.0})
    res = SimSession(QWEN, H100, in_gib).measure(Point("c64", loop(64, 4096, 1024)))
    assert res.target.sim.preemptions > 0 and res.target.sim.pool_doubt is None
    assert not at_pool_edge(res, TP2, get_hardware("cpu-host"))


def test_a_smaller_pool_that_cannot_hold_the_requests_says_so(capsys):
    """Qwen3-32B on one H100 holds 32,704 tokens: a 32,000-token prompt fits it, not a
    pool 6% smaller, which serves none of them; the report says so."""
    res = SimSession(QWEN, H100, EngineConfig(max_model_len=32_704)).measure(
        Point("c1", loop(1, 32_000, 64, count=2))
    )
    sim = res.target.sim
    assert sim.preemptions == 0 and sim.rejected == 0  # at the edge, not over it
    assert sim.max_kv_blocks_used >= (1 - POOL_DOUBT) * res.target.kv_blocks
    d = sim.pool_doubt
    assert d is not None and d.rejected == 2 and d.ttft_mean_ms is None
    note = " ".join(pool_note(res))
    assert "TTFT mean - ms (here" in note and "2 requests it cannot hold (here 0)" in note


def test_simulate_prints_stores_and_returns_both_answers(capsys, tmp_path):
    db = tmp_path / "runs.db"
    args = ("simulate", "-m", "qwen3-32b", "--gpu", "h100-sxm", "--set", "tensor_parallel_size=2")
    args = (*args, "--db", str(db))
    load = ("--concurrency", "64", "--count", "640", "--input-len", "4096", "--output-len", "1024")
    code, out, _ = run_cli(capsys, *args, *load)
    assert code == 0
    edge = [i for i, line in enumerate(out.splitlines()) if "ran to its edge" in line]
    assert len(edge) == 1
    lines = out.splitlines()
    assert "a pool 6% smaller (296,192 tokens" in lines[edge[0]]
    assert "(here 1,483.1)" in lines[edge[0] + 1] and "preemptions (here 3)" in lines[edge[0] + 1]
    code, out, _ = run_cli(capsys, *args, *load, "--json")
    smaller = json.loads(out)["smaller_pool"]
    assert smaller["kv_capacity_tokens"] == 296_192 and smaller["preemptions"] > 3
    with Store.open(str(db), create=False) as store:  # the stored runs carry it too
        kept = [i.meta["target"]["sim"]["pool_doubt"] for i in store.list_runs()]
    assert kept == [smaller, smaller]
