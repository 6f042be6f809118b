"""`simulate`: the same materialised requests as `bench`, replayed through a scheduler
model, returned as the same RunResult (backend="sim") with the same metric functions.

The KV pool comes from the planner (`plan.planner.evaluate`: kv_blocks), so `plan` and
`simulate` can never disagree on capacity. Every prediction carries its step-time tier.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.metrics.compute import compute_metrics
from servetune.model.spec import ModelSpec
from servetune.plan.planner import Evaluation, evaluate
from servetune.results.schema import RequestRecord, RunResult
from servetune.sim.profile import Profile
from servetune.sim.scheduler import REJECTED, SchedConfig, Scheduler, SimRequest
from servetune.sim.steptime import StepModel, calibrated_model, roofline_model
from servetune.slo import SLO
from servetune.workload.materialize import Request
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import WordTokenizer

NS = 1_000_000_000
# llama-server defaults (tools/server README): -np auto resolves to 4 slots, -b 2048.
LLAMACPP_DEFAULT_SLOTS = 4
LLAMACPP_DEFAULT_BATCH = 2048


class CountingTokenizer(WordTokenizer):
    """Counts tokens without making text: the simulator needs only the counts, and
    `materialize` draws lengths, arrivals and groups from RNG streams the text does not
    touch, so the request list matches a real tokenizer's exactly in everything but text."""

    name = "count"

    def encode(self, text: str) -> list[int]:
        return [0] * int(text[1:] or 0)

    def decode(self, ids: list[int]) -> str:
        return f"#{len(ids)}"


def materialize_for_sim(spec: WorkloadSpec) -> list[Request]:
    """Materialised requests of `spec` for simulation (counts, no prompt text)."""
    from servetune.workload.materialize import materialize

    return materialize(spec, CountingTokenizer())


@dataclass
class SimSetup:
    """Everything resolved before the loop: the plan's evaluation, the scheduler's knobs
    and the step-time model."""

    evaluation: Evaluation | None
    sched: SchedConfig
    step_model: StepModel


def setup(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    profile: Profile | None = None,
    efficiency: dict[str, float] | None = None,
) -> SimSetup:
    """Resolve knobs and check the config can run at all (one-line errors otherwise)."""
    if profile is not None:
        profile.check(cfg.engine, model.name, hw.name)
    if cfg.engine not in ("vllm", "llamacpp"):
        raise InputError(
            "--engine", f"no scheduler model for {cfg.engine} yet", "use vllm or llamacpp"
        )
    ev = evaluate(model, hw, cfg)
    b = ev.budget
    if cfg.engine == "vllm":
        if not ev.fits:
            raise InputError("config", f"the engine would not start: {ev.verdict}", None)
        blocks = ev.kv_blocks - 1  # vLLM v1 reserves one null block (v1/core/block_pool.py)
        if cfg.kv_cache_tokens is not None:
            blocks = min(blocks, cfg.kv_cache_tokens // cfg.block_size)
        if blocks <= 0:
            raise InputError("config", "the KV pool holds no blocks", "give the KV cache memory")
        seqs, batched = b.max_num_seqs, b.max_num_batched_tokens
        if batched < seqs:
            # vLLM's SchedulerConfig refuses this combination at start-up.
            raise InputError(
                "--set max_num_batched_tokens",
                f"{batched} is below max_num_seqs {seqs}",
                "vLLM requires max_num_batched_tokens >= max_num_seqs",
            )
        if not cfg.enable_chunked_prefill and batched < ev.max_model_len:
            raise InputError(
                "--set max_num_batched_tokens",
                f"{batched} < max_model_len {ev.max_model_len} with chunked prefill off",
                "raise it or enable chunked prefill",
            )
        sc = SchedConfig(
            mode="paged",
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            max_model_len=ev.max_model_len,
            block_size=cfg.block_size,
            kv_blocks=blocks,
            chunked_prefill=cfg.enable_chunked_prefill,
            prefix_caching=cfg.enable_prefix_caching,
            policy=cfg.scheduling_policy,
        )
    else:
        slots = cfg.parallel_slots or cfg.max_num_seqs or LLAMACPP_DEFAULT_SLOTS
        n_ctx = cfg.kv_cache_tokens or ev.max_model_len
        slot_ctx = n_ctx if cfg.kv_unified else n_ctx // slots
        if slot_ctx <= 0:
            raise InputError("--set kv_cache_tokens", f"{n_ctx} tokens over {slots} slots", None)
        batch = cfg.batch_size or LLAMACPP_DEFAULT_BATCH
        sc = SchedConfig(
            mode="slots",
            max_num_seqs=slots,
            max_num_batched_tokens=max(batch, slots),
            max_model_len=min(ev.max_model_len, slot_ctx),
            chunked_prefill=True,
            prefix_caching=cfg.enable_prefix_caching,  # cache_prompt
            policy="fcfs",
            slot_ctx=slot_ctx,
            kv_unified=cfg.kv_unified,
        )
    if profile is not None:
        sm = calibrated_model(profile.coefficients, profile.api_overhead_s)
    else:
        sm = roofline_model(model, hw, cfg, b, efficiency)
    return SimSetup(evaluation=ev, sched=sc, step_model=sm)


def _shared_tokens(spec: WorkloadSpec | None) -> dict[str, tuple[int, int]]:
    """sub name -> (sub index, shared prefix tokens) from the spec's prefix groups."""
    out: dict[str, tuple[int, int]] = {}
    if spec is None:
        return out
    for k, sub in enumerate(spec.mix):
        out[sub.name] = (k, sub.prefix.tokens if sub.prefix is not None else 0)
    if spec.trace is not None:
        # A trace names only the first shared block per request (Request.prefix_group),
        # so one block of the trace's block size is what is known to be shared.
        out["trace"] = (len(spec.mix), spec.trace.block_tokens)
    return out


def to_sim(
    requests: list[Request], spec: WorkloadSpec | None, default_output: int | None = None
) -> list[SimRequest]:
    shared = _shared_tokens(spec)
    out = []
    for i, r in enumerate(requests):
        n_out = r.output_tokens if r.output_tokens is not None else default_output
        if n_out is None:
            raise InputError(
                "workload",
                f"request {r.index} has no output length",
                "give output_tokens (simulate replays fixed lengths, as bench's ignore_eos)",
            )
        sub_k, sh = shared.get(r.sub, (0, 0))
        group = -1
        if r.prefix_group is not None and sh > 0:
            group = sub_k * 1_000_003 + r.prefix_group
        arrival = r.arrival_s if r.arrival_s is not None else 0.0
        out.append(
            SimRequest(
                idx=r.index,
                rid=i,
                prompt=max(1, r.prompt_tokens),
                out=max(1, n_out),
                arrival=arrival,
                priority=r.priority or 0,
                group=group,
                shared=min(sh, r.prompt_tokens) if group >= 0 else 0,
                scheduled=r.arrival_s,
            )
        )
    return out


def run_sim(
    setup_: SimSetup,
    requests: list[Request],
    spec: WorkloadSpec,
    *,
    trace: bool = False,
) -> tuple[Scheduler, list[SimRequest]]:
    """Drive the scheduler over `requests` under `spec`'s arrival process."""
    sims = to_sim(requests, spec)
    arr = spec.arrival
    closed_users = arr.concurrency if not arr.open_loop else None
    client_cap = arr.concurrency if arr.open_loop else None
    sched = Scheduler(
        setup_.sched,
        setup_.step_model,
        closed_users=closed_users,
        client_cap=client_cap,
        stop_issuing_s=spec.duration_s if closed_users and spec.count is None else None,
        trace=trace,
    )
    pool = sims if closed_users and spec.count is None else None
    sched.run(sims, pool)
    return sched, sims


def records_from(sched: Scheduler) -> list[RequestRecord]:
    """One RequestRecord per simulated send, chunk times from the step-end times."""
    api = sched.model.api_overhead_s
    times = np.rint((np.asarray(sched.step_end_s, dtype=np.float64) + api) * NS).astype(np.int64)
    recs = []
    construct = RequestRecord.model_construct
    for r in sched.done:
        send = int(round(r.arrival * NS))
        sched_ns = int(round(r.scheduled * NS)) if r.scheduled is not None else None
        queue = send - sched_ns if sched_ns is not None else 0
        base = dict(
            index=r.idx,
            sub="default",
            priority=r.priority if r.priority else None,
            scheduled_ns=sched_ns,
            queue_ns=queue,
            send_ns=send,
            connect_ns=0,
            prompt_tokens=r.prompt,
            max_tokens=r.out,
            usage_prompt_tokens=r.prompt,
        )
        if r.phase == REJECTED:
            recs.append(
                construct(
                    **base,
                    chunk_ns=[],
                    chunk_tokens=[],
                    end_ns=send,
                    status="error",
                    error="http_4xx",
                    http_status=400,
                    error_detail=r.reason,
                )
            )
            continue
        segs = r.segs
        if len(segs) == 2:
            ns = times[segs[0] : segs[1]].tolist()
        else:
            ns = np.concatenate(
                [times[segs[k] : segs[k + 1]] for k in range(0, len(segs), 2)]
            ).tolist()
        recs.append(
            construct(
                **base,
                first_event_ns=ns[0],
                chunk_ns=ns,
                chunk_tokens=[1] * len(ns),
                first_answer_ns=ns[0],
                end_ns=ns[-1],
                status="ok",
                finish_reason="length",
                usage_completion_tokens=len(ns),
                server_timings={"preemptions": float(r.preemptions), "cached": r.cached_tokens},
            )
        )
    return recs


def simulate(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    spec: WorkloadSpec,
    requests: list[Request] | None = None,
    *,
    profile: Profile | None = None,
    slo: SLO | None = None,
    trace: bool = False,
    keep_requests: bool = False,
) -> tuple[RunResult, Scheduler]:
    """Simulate `spec` (or the given materialised `requests`) and return a RunResult."""
    wall0 = time.perf_counter()
    su = setup(model, hw, cfg, profile)
    if requests is None:
        requests = materialize_for_sim(spec)
    sched, _ = run_sim(su, requests, spec, trace=trace)
    records = records_from(sched)
    sub_of = {r.index: r.sub for r in requests}
    group_of = {r.index: r.prefix_group for r in requests}
    for rec in records:
        rec.sub = sub_of.get(rec.index, "default")
        rec.prefix_group = group_of.get(rec.index)
    records.sort(key=lambda r: (r.send_ns, r.index))
    metrics = compute_metrics(
        records, warmup_s=spec.warmup_s, cooldown_s=spec.cooldown_s, slo=slo, stream=spec.stream
    )
    created = datetime.now(timezone.utc)
    st = sched.stats
    ev = su.evaluation
    result = RunResult(
        id=f"sim-{created:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}",
        created_utc=created.isoformat(timespec="seconds"),
        backend="sim",
        target={
            "engine": cfg.engine,
            "model": model.name,
            "hardware": hw.name,
            "config": cfg.model_dump(mode="json", exclude_defaults=True),
            "tier": su.step_model.tier,
            "profile": profile.key if profile is not None else None,
            "efficiency": su.step_model.notes or None,
            "kv_blocks": su.sched.kv_blocks,
            "kv_capacity_tokens": ev.kv_capacity_tokens if ev else None,
            "max_num_seqs": su.sched.max_num_seqs,
            "max_num_batched_tokens": su.sched.max_num_batched_tokens,
            "sim": {
                "steps": st.steps,
                "jumps": st.jumps,
                "preemptions": st.preemptions,
                "rejected": st.rejected,
                "prefix_hit_tokens": st.prefix_hit_tokens,
                "prefill_tokens_computed": st.prefill_tokens,
                "kv_evictions": st.evictions,
                "max_kv_blocks_used": st.max_blocks_used,
                "wall_s": time.perf_counter() - wall0,
            },
        },
        workload=spec.model_dump(mode="json"),
        load={
            "kind": spec.arrival.kind,
            "rate": spec.arrival.rate,
            "concurrency": spec.arrival.concurrency,
            "burstiness": spec.arrival.burstiness if spec.arrival.kind == "gamma" else None,
        },
        slo=slo,
        status="completed",
        anchor_ns=0,
        started_unix_s=time.time(),
        duration_s=(max((r.end_ns for r in records), default=0)) / NS,
        requests=requests if keep_requests else [],
        records=records,
        metrics=metrics,
    )
    return result, sched


def capacity_note(setup_: SimSetup) -> str:
    """One line on what the pool holds, for the CLI."""
    sc = setup_.sched
    if sc.mode == "paged":
        return (
            f"KV pool {sc.kv_blocks:,} blocks x {sc.block_size} = "
            f"{sc.kv_blocks * sc.block_size:,} tokens; max_num_seqs {sc.max_num_seqs}, "
            f"max_num_batched_tokens {sc.max_num_batched_tokens}"
        )
    ctx = "shared" if sc.kv_unified else "per slot"
    batch = sc.max_num_batched_tokens
    return f"{sc.max_num_seqs} slots, {sc.slot_ctx:,} tokens {ctx}, batch {batch}"
