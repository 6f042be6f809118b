"""A GPU point that ran its KV pool to the edge, simulated again with a pool POOL_DOUBT
smaller: a KV-bound answer with its doubt stated.

servetune sizes a GPU's KV pool from vLLM's memory profile (`plan.memory`), which it knows
to within about 6% where it was checked (`plan.memory.POOL_DOUBT`). Where a point's pool
ran full (it preempted) or came within that share of full, a gap that size decides how
often vLLM preempts and how long new prompts wait for blocks: issue 15's KV-bound
Qwen3-32B TP2 row (64 users, 4096 / 1024) read 1.6 s simulated against 4.4 s measured. So
such a point is run again on the smaller pool and both answers are shown; with an SLO,
its verdict there too, which `tune` reads for the winner's capacity. A pool the user
fixed is known and gets none (`plan.memory.pool_in_doubt`).
"""

from __future__ import annotations

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.plan.memory import POOL_DOUBT, pool_in_doubt
from servetune.results.schema import PoolDoubt, RunResult
from servetune.sim.engine import simulate
from servetune.sim.profile import Profile
from servetune.slo import SLO
from servetune.workload.materialize import Request, RequestColumns
from servetune.workload.spec import WorkloadSpec


def at_pool_edge(res: RunResult, cfg: EngineConfig, hw: HardwareSpec) -> bool:
    """A vLLM point on a GPU whose pool servetune sized (not the user) that preempted, or
    whose peak use came within POOL_DOUBT of the pool: a pool that much smaller fills."""
    t, sim = res.target, res.target.sim
    if not pool_in_doubt(cfg, hw):  # the simulator's target.engine is cfg.engine
        return False
    if sim is None or not t.kv_blocks:
        return False
    return sim.preemptions > 0 or sim.max_kv_blocks_used >= (1 - POOL_DOUBT) * t.kv_blocks


def pool_doubt(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    spec: WorkloadSpec,
    requests: list[Request] | RequestColumns,
    res: RunResult,
    *,
    profile: Profile | None = None,
    slo: SLO | None = None,
) -> PoolDoubt | None:
    """`res`'s point again on a pool POOL_DOUBT smaller (its requests that pool cannot hold
    at all counted as rejected), or None when the point is not at its pool's edge
    (`at_pool_edge`) or the simulator refuses the smaller pool outright."""
    if not at_pool_edge(res, cfg, hw):
        return None
    # the pool the point ran on, as printed (its blocks, vLLM's null block aside)
    tokens = int((res.target.kv_blocks or 0) * cfg.block_size * (1 - POOL_DOUBT))
    smaller = cfg.model_copy(update={"kv_cache_tokens": tokens})
    try:
        again, _ = simulate(model, hw, smaller, spec, requests, profile=profile, slo=slo)
    except InputError:
        return None
    m, sim = again.metrics, again.target.sim
    return PoolDoubt(
        share=POOL_DOUBT,
        kv_capacity_tokens=again.target.kv_capacity_tokens or tokens,
        preemptions=sim.preemptions if sim is not None else 0,
        rejected=sim.rejected if sim is not None else 0,
        ttft_mean_ms=m.ttft_ms.mean,
        ttft_p50_ms=m.ttft_ms.p50,
        tpot_p50_ms=m.tpot_ms.p50,
        output_tok_s=m.output_tok_s,
        slo_pass=m.slo_pass,
    )
