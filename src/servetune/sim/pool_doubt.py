"""A GPU point that ran its KV pool to the edge, simulated again with a pool POOL_DOUBT
smaller: a KV-bound answer with its doubt stated.

servetune sizes a GPU's KV pool from vLLM's memory profile (`plan.memory`), which it knows
to within about 6% where it was checked: Qwen3-32B TP1 on an H100 at 7.99 GiB against the
8.52 GiB vLLM 0.26 logged (-6%), Llama-3.1-8B within 0.1% of a recent log, and CUDA reports
0.41-0.53 GiB less device memory than the nvidia-smi figure the catalog holds
(docs/fidelity-gpu.md, "The KV pool: vLLM's own memory profile"). Where a point's pool ran
full (it preempted) or came within that share of full, a gap that size decides how often
vLLM preempts and how long new prompts wait for blocks: issue 15's KV-bound Qwen3-32B TP2
row (64 users, 4096 / 1024) read 1.6 s simulated against 4.4 s measured. So such a point
is run again on the smaller pool and both answers are shown; with an SLO, its verdict
there too, which `tune` reads for the winner's capacity. A pool the user fixed
(`kv_cache_tokens`, vLLM's --num-gpu-blocks-override, or `kv_cache_space_gib`, its
--kv-cache-memory-bytes) is known and gets none.
"""

from __future__ import annotations

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.results.schema import PoolDoubt, RunResult
from servetune.sim.engine import simulate
from servetune.sim.profile import Profile
from servetune.slo import SLO
from servetune.workload.materialize import Request, RequestColumns
from servetune.workload.spec import WorkloadSpec

# How far servetune's GPU KV pool may sit from vLLM's own, as a share (module docstring).
POOL_DOUBT = 0.06


def at_pool_edge(res: RunResult, cfg: EngineConfig, hw: HardwareSpec) -> bool:
    """A vLLM point on a GPU whose pool servetune sized (not the user) that preempted, or
    whose peak use came within POOL_DOUBT of the pool: a pool that much smaller fills."""
    t, sim = res.target, res.target.sim
    given = cfg.kv_cache_tokens is not None or cfg.kv_cache_space_gib is not None
    if hw.kind != "gpu" or t.engine != "vllm" or given:
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
