"""`simulate`: the same materialised requests as `bench`, replayed through a scheduler
model, returned as the same RunResult (backend="sim") with the same metric functions.

The KV pool comes from the planner (`plan.planner.evaluate`: kv_blocks), so `plan` and
`simulate` can never disagree on capacity. Every prediction carries its step-time tier.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from servetune.engines.config import EngineConfig
from servetune.engines.extra import knob_in_extra
from servetune.engines.rules import check_batch_limits, check_model_config
from servetune.engines.support import SIMULATED
from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.metrics.compute import apply_memory_slo, compute_metrics
from servetune.metrics.turns import apply_turn_slo
from servetune.model.spec import ModelSpec
from servetune.plan.planner import Evaluation, evaluate
from servetune.plan.quant import (
    check_dtype_runs_on,
    check_runs_on,
    resolved_kv_cache_dtype,
    weight_format,
)
from servetune.results.schema import Load, RunResult, SimStats, Target
from servetune.sim.expected_error import band_users, expected_error_note
from servetune.sim.gpu_step import gpu_model
from servetune.sim.policies import prompt_breaks
from servetune.sim.profile import Profile
from servetune.sim.records import SimRecords
from servetune.sim.request import Phase, SimRequest
from servetune.sim.scheduler import SchedConfig, Scheduler
from servetune.sim.sessions import SessionClients, session_requests
from servetune.sim.sglang_policy import radix_note, radix_sched_config
from servetune.sim.steptime import StepModel, calibrated_model, roofline_model
from servetune.slo import SLO
from servetune.workload.materialize import Request, RequestColumns, materialize, materialize_columns
from servetune.workload.session_plan import SessionPlan, plan_sessions
from servetune.workload.spec import Arrival, WorkloadSpec
from servetune.workload.tokenizer import Tokenizer, WordTokenizer

NS = 1_000_000_000
# llama-server defaults (tools/server README): -np auto resolves to 4 slots, -b 2048.
LLAMACPP_DEFAULT_SLOTS = 4
LLAMACPP_DEFAULT_BATCH = 2048
LLAMACPP_DEFAULT_UBATCH = 512  # -ub


def llamacpp_batches(batch: int | None, ubatch: int | None) -> tuple[int, int]:
    """llama.cpp's -b (as given, else its 2048 default) and the ubatch it runs: its
    llama_context caps -ub at -b (n_ubatch = min(ub, b); -ub defaults to 512)."""
    b = batch or LLAMACPP_DEFAULT_BATCH
    return b, min(ubatch or LLAMACPP_DEFAULT_UBATCH, b)


class CountingTokenizer(WordTokenizer):
    """Counts tokens without making text: the simulator needs only the counts, and
    `materialize` draws lengths, arrivals and groups from RNG streams the text does not
    touch, so the request list matches a real tokenizer's exactly in everything but text."""

    name = "count"

    def encode(self, text: str) -> list[int]:
        """Its own "#n" texts count as n tokens, and so do their concatenations ("#1#1#1":
        3; a trace's hashed blocks and a mix's synthetic prompts beside a dataset are built
        piece by piece, and read as one word they simulated 1-token prompts); any other
        text (a dataset's prompts and replies) falls back to one token per word
        (WordTokenizer), so a dataset workload simulates without a tokenizer -
        approximately; pass the model's tokenizer to `materialize_for_sim` / `simulate`
        for exact counts."""
        if text[:1] == "#":
            pieces = text[1:].split("#")
            if all(p.isdigit() for p in pieces):
                return [0] * sum(map(int, pieces))
        return super().encode(text)

    def decode(self, ids: list[int]) -> str:
        return f"#{len(ids)}"


def materialize_for_sim(spec: WorkloadSpec, tokenizer: Tokenizer | None = None) -> RequestColumns:
    """Materialised requests of `spec` for simulation: counts only, as columns (the fast
    path draws no text at all). Datasets and traces need a tokenizer to count their
    prompts: `tokenizer` (the model's, for exact counts) or else `CountingTokenizer`'s
    word count."""
    if spec.sessions is not None:  # one request per turn (`sim.sessions` chains them)
        return RequestColumns.from_requests(plan_sessions(spec, tokenizer).requests())
    cols = materialize_columns(spec)
    if cols is None:
        tok = tokenizer if tokenizer is not None else CountingTokenizer()
        cols = RequestColumns.from_requests(materialize(spec, tok))
    return cols


@dataclass
class SimSetup:
    """Everything resolved before the loop: the plan's evaluation, the scheduler's knobs
    and the step-time model."""

    evaluation: Evaluation | None
    sched: SchedConfig
    step_model: StepModel
    # max_model_len the simulator set because vLLM's default does not start (see
    # `start_length`); None when the config starts as given.
    capped_max_model_len: int | None = None


def pool_tokens(su: SimSetup) -> int | None:
    """The KV tokens the simulated engine holds, as recorded with its run: the planner's
    pool, or the smaller one `kv_cache_tokens` fixes (vLLM's --num-gpu-blocks-override),
    so the record and the printed pool agree."""
    ev, s = su.evaluation, su.sched
    if ev is None:
        return None
    if s.mode == "paged" and s.kv_blocks < ev.kv_blocks - 1:  # one null block (`setup`)
        return s.kv_blocks * s.block_size
    return ev.kv_capacity_tokens


def start_length(
    model: ModelSpec, hw: HardwareSpec, cfg: EngineConfig, ev: Evaluation
) -> tuple[Evaluation, int | None]:
    """The evaluation vLLM would run with. When the default max_model_len (the model's
    context) does not fit the KV pool, vLLM refuses to start and its error names the
    largest length that does ("the estimated maximum model length is N ... decreasing
    `max_model_len`", vllm/v1/core/kv_cache_utils.py); users then pass --max-model-len N.
    So the default is capped to what the pool holds; a length the user set stays as given
    (and refused). Sliding-window models pay more per token at a shorter length, hence
    the few re-evaluations."""
    if cfg.engine != "vllm" or cfg.max_model_len is not None:
        return ev, None
    cap = None
    for _ in range(4):
        if ev.breaking_term != "max_model_len" or ev.kv_capacity_tokens <= 0:
            break
        cap = min(ev.kv_capacity_tokens, cap or ev.kv_capacity_tokens)
        ev = evaluate(model, hw, cfg.model_copy(update={"max_model_len": cap}))
    return ev, cap if ev.fits else None


def setup(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    profile: Profile | None = None,
    efficiency: dict[str, float] | None = None,
    tier: str | None = None,
) -> SimSetup:
    """Resolve knobs and check the config can run at all (one-line errors otherwise).
    `tier`: the step-time tier without a profile, "gpu" or "roofline" (None: `gpu` for
    vLLM on a GPU unless efficiency factors are given, else `roofline`)."""
    if profile is not None:
        profile.check(cfg.engine, model.name, hw.name)
    if cfg.engine not in SIMULATED:
        raise InputError(
            "--engine",
            f"no scheduler model for {cfg.engine} yet",
            f"use one of {', '.join(SIMULATED)}",
        )
    if cfg.engine == "sglang" and hw.kind != "gpu":
        raise InputError("--gpu", "SGLang's scheduler model is of its GPU server", "give a GPU")
    if cfg.data_parallel_size > 1:
        n = cfg.data_parallel_size
        raise InputError(
            "--set data_parallel_size",
            f"{n}: the simulator runs one replica, its figures would ignore the other {n - 1}",
            f"simulate one at 1/{n} of the load (rate or users) and multiply its throughput",
        )
    knob = knob_in_extra(cfg, hw.kind)
    if knob is not None:  # the model reads the knob: the flag would go unsimulated
        token, name = knob
        fix = f"set {name} as a knob instead: simulate --set, or a tune space's knobs"
        raise InputError("extra_args", f"{token} is the {name} knob's flag", fix)
    # what the engine refuses at start-up (block size, TP vs heads, FP8 below compute
    # capability 8.0, as `plan` refuses it) is not simulated
    if hw.kind == "gpu":  # a CPU host's "node" is itself: its TP is the engine's rule
        from servetune.plan.planner import check_tp_within_node

        tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
        knobs = "tensor_parallel_size={tp} pipeline_parallel_size={pp}"
        check_tp_within_node(tp, pp, model, hw, flag="--set tensor_parallel_size", split=knobs)
    try:
        check_model_config(cfg, model, device=hw.kind)
    except InputError as exc:  # a TP that splits no heads: plan's answer
        if exc.field != "tensor_parallel_size" or hw.kind != "gpu":
            raise
        from servetune.plan.planner import node_tp_fix

        raise InputError(exc.field, exc.problem, node_tp_fix(model, hw)) from None
    check_dtype_runs_on(cfg.dtype, hw, "--set dtype")  # an explicit bfloat16 below cc 8.0
    check_runs_on(
        weight_format(cfg.dtype, cfg.quantization, model),
        hw,
        "--set quantization",
        dtype=cfg.dtype,
        engine=cfg.engine,
        dtype_field="--set dtype",
    )
    default_ev = evaluate(model, hw, cfg)
    if default_ev.breaking_term == "weights":  # no engine loads them (vLLM, SGLang, llama.cpp)
        raise InputError("config", f"the engine would not start: {default_ev.verdict}", None)
    ev, capped = start_length(model, hw, cfg, default_ev)
    b = ev.budget
    if cfg.engine == "sglang":
        sc = radix_sched_config(cfg, ev)  # RadixAttention pool, SGLang's loop (sim.sglang_*)
    elif cfg.engine == "vllm":
        if not ev.fits:
            raise InputError("config", f"the engine would not start: {ev.verdict}", None)
        blocks = ev.kv_blocks - 1  # vLLM v1 reserves one null block (v1/core/block_pool.py)
        if cfg.kv_cache_tokens is not None:
            blocks = min(blocks, cfg.kv_cache_tokens // cfg.block_size)
        if blocks <= 0:
            raise InputError("config", "the KV pool holds no blocks", "give the KV cache memory")
        seqs, batched = b.max_num_seqs, b.max_num_batched_tokens
        check_batch_limits(cfg, seqs, batched)
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
        given = cfg.parallel_slots or cfg.max_num_seqs
        slots = given or LLAMACPP_DEFAULT_SLOTS
        # -np auto (no slots given) also turns --kv-unified on (tools/server/server.cpp)
        unified = cfg.kv_unified or not given
        if cfg.kv_cache_tokens:
            n_ctx = cfg.kv_cache_tokens
        elif cfg.max_model_len is not None and given and not unified:
            n_ctx = cfg.max_model_len * slots  # the adapter's -c: max_model_len per slot
        else:
            n_ctx = ev.max_model_len
        slot_ctx = n_ctx if unified else n_ctx // slots
        if slot_ctx <= 0:
            raise InputError("--set kv_cache_tokens", f"{n_ctx} tokens over {slots} slots", None)
        # -b as the adapter sets it
        batch, ubatch = llamacpp_batches(
            cfg.batch_size or cfg.max_num_batched_tokens, cfg.ubatch_size
        )
        sc = SchedConfig(
            mode="slots",
            max_num_seqs=slots,
            max_num_batched_tokens=max(batch, slots),
            max_model_len=min(ev.max_model_len, slot_ctx),
            chunked_prefill=True,
            prefix_caching=cfg.enable_prefix_caching,  # cache_prompt
            policy="fcfs",
            slot_ctx=slot_ctx,
            kv_unified=unified,
            prompt_breaks=(
                prompt_breaks(batch, ubatch)
                if model.sliding_window and model.sliding_window_layers
                else ()
            ),
            n_ubatch=ubatch,
        )
    if profile is not None:
        sm = calibrated_model(
            profile.coefficients,
            profile.api_overhead_s,
            profile.ingress_s,
            profile.ingress_per_token_s,
            profile.new_shape_s,
            profile.new_shape_per_token_s,
        )
    elif tier == "gpu" or (
        tier is None and hw.kind == "gpu" and cfg.engine != "llamacpp" and efficiency is None
    ):
        sm = gpu_model(model, hw, cfg, b)  # per-kernel figures (sim.gpu_step)
    else:
        sm = roofline_model(model, hw, cfg, b, efficiency)
    cap_note = ""
    if capped is not None:
        cap_note = (
            f"vLLM at its default max_model_len {default_ev.max_model_len:,} refuses to start "
            f"(KV pool {capped:,} tokens): simulated with --max-model-len {capped}, set it so"
        )
    # the tier's expected error is from vLLM's rows; SGLang's scheduler has its own check
    engine_note = (
        "SGLang's scheduler: checked on published SGLang runs, docs/sglang-sim.md"
        if cfg.engine == "sglang"
        else ""
    )
    notes = (sm.note, run_expected_error(sm.tier, cfg.engine, hw), cap_note, engine_note)
    sm.note = "; ".join(x for x in notes if x)
    return SimSetup(evaluation=ev, sched=sc, step_model=sm, capped_max_model_len=capped)


def run_expected_error(
    tier: str, engine: str, hw: HardwareSpec, arrival: Arrival | None = None
) -> str:
    """The tier's expected error on `hw` (the setup's note), or for a run under `arrival`:
    a vLLM closed loop's at its users' load band (the error grows with load), any other
    the all-runs figure; a CPU host none (the figures are GPU runs'). llama.cpp's GPU
    server has no published runs: its prediction says so rather than quote vLLM's error
    as its own."""
    if hw.kind != "gpu":
        return ""
    if engine == "llamacpp":
        return "expected |error| not known: no published llama.cpp GPU runs to check it on"
    if arrival is None:
        return expected_error_note(tier, engine=engine)
    users = band_users(engine, arrival.kind, arrival.concurrency)
    return expected_error_note(tier, users, engine)


def window_pool(
    su: SimSetup, model: ModelSpec, cfg: EngineConfig, cols: RequestColumns
) -> SimSetup:
    """A sliding-window model's paged pool in blocks at this workload's KV cost per token.

    The planner counts blocks at max_model_len's average cost (its window layers hold at
    most `sliding_window` tokens of a sequence: vLLM's "GPU KV cache size" is that
    concurrency x max_model_len, v1/core/kv_cache_utils.py), and the scheduler charges a
    block per `block_size` tokens of every sequence; a shorter sequence, whose every layer
    holds every token, was charged a fraction of its bytes: mistral-7b-v0.1 (window 4,096
    of 32,768) ran ~584 sequences of 1,280 tokens in a pool whose bytes hold 361. vLLM's
    pool is bytes, and a window layer's blocks outside its window are freed; the charge
    under which the workload's requests' blocks sum to their bytes at full length is the
    token-weighted cost sum(bytes(L_i)) / sum(L_i) (`plan.kv.kv_bytes_for_sequence`). An
    aggregate: a mix of short and long requests is charged one rate."""
    ev, sc = su.evaluation, su.sched
    if sc.mode != "paged" or ev is None or not len(cols):
        return su
    if not (model.sliding_window and model.sliding_window_layers):
        return su
    from servetune.plan.kv import kv_bytes_for_sequence, pool_blocks

    full = np.minimum(cols.prompt_tokens + np.maximum(cols.output_tokens, 0), sc.max_model_len)
    lengths, counts = np.unique(np.maximum(full, 1), return_counts=True)
    tp, pp, dtype = cfg.tensor_parallel_size, cfg.pipeline_parallel_size, ev.budget.kv_dtype_bytes
    total = sum(
        kv_bytes_for_sequence(model, dtype, int(n), tp, pp) * int(c)
        for n, c in zip(lengths, counts, strict=True)
    )
    rate = total / float((lengths * counts).sum())
    blocks = pool_blocks(ev.budget.kv_pool_bytes, sc.block_size, rate) - 1  # the null block
    if blocks >= sc.kv_blocks:  # never more than the planner's (kv_cache_tokens' cap kept)
        return su
    return replace(su, sched=replace(sc, kv_blocks=max(blocks, 0)))


def check_fits_capped(setup_: SimSetup, cols: RequestColumns) -> None:
    """A capped max_model_len (`start_length`) still has to hold the workload's longest
    request (prompt + output); otherwise no vLLM on this config serves it: refuse."""
    cap = setup_.capped_max_model_len
    if cap is None or not len(cols):
        return
    longest = int((cols.prompt_tokens + np.maximum(cols.output_tokens, 0)).max())
    if longest > cap:
        raise InputError(
            "config",
            f"the KV pool holds {cap:,} tokens, less than one request of "
            f"{longest:,} tokens (prompt + output): the engine cannot serve it",
            "grow the KV pool (gpu_memory_utilization, more GPUs, fp8 KV cache)",
        )


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
    requests: RequestColumns | list[Request],
    spec: WorkloadSpec | None,
    default_output: int | None = None,
) -> list[SimRequest]:
    """Scheduler requests from materialised ones (rid = position in the list)."""
    cols = (
        requests if isinstance(requests, RequestColumns) else RequestColumns.from_requests(requests)
    )
    shared = _shared_tokens(spec)
    outs = cols.output_tokens
    if (outs < 0).any():
        if default_output is None:
            bad = int(cols.index[int(np.flatnonzero(outs < 0)[0])])
            raise InputError(
                "workload",
                f"request {bad} has no output length",
                "give output_tokens (simulate replays fixed lengths, as bench's ignore_eos)",
            )
        outs = np.where(outs < 0, default_output, outs)
    # Per sub-workload: its index in the spec (prefix-group namespace) and shared tokens.
    sub_k = np.array([shared.get(name, (0, 0))[0] for name in cols.sub_names], dtype=np.int64)
    sub_sh = np.array([shared.get(name, (0, 0))[1] for name in cols.sub_names], dtype=np.int64)
    sh = sub_sh[cols.sub] if len(cols.sub_names) else np.zeros(len(cols), dtype=np.int64)
    has_group = (cols.prefix_group >= 0) & (sh > 0)
    group = np.where(has_group, sub_k[cols.sub] * 1_000_003 + cols.prefix_group, -1)
    shared_tok = np.where(has_group, np.minimum(sh, cols.prompt_tokens), 0)
    open_loop = ~np.isnan(cols.arrival_s)
    arrival = np.where(open_loop, cols.arrival_s, 0.0).tolist()
    prio = cols.priority.tolist()
    return [
        SimRequest(idx, rid, max(1, p), max(1, o), a, pr, g, st, a if ol else None)
        for rid, (idx, p, o, a, pr, g, st, ol) in enumerate(
            zip(
                cols.index.tolist(),
                cols.prompt_tokens.tolist(),
                outs.tolist(),
                arrival,
                prio,
                group.tolist(),
                shared_tok.tolist(),
                open_loop.tolist(),
                strict=True,
            )
        )
    ]


def run_sim(
    setup_: SimSetup,
    requests: RequestColumns | list[Request],
    spec: WorkloadSpec,
    *,
    trace: bool = False,
    shapes: set[int] | None = None,
) -> tuple[Scheduler, list[SimRequest]]:
    """Drive the scheduler over `requests` under `spec`'s arrival process. `shapes`: the
    step sizes the engine has already run (`StepModel.new_shape_s`); None: a fresh one."""
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
        shapes=shapes,
    )
    pool = sims if closed_users and spec.count is None else None
    sched.run(sims, pool)
    return sched, sims


def run_sessions(
    setup_: SimSetup,
    plan: SessionPlan,
    spec: WorkloadSpec,
    cols: RequestColumns | None = None,
    *,
    trace: bool = False,
    shapes: set[int] | None = None,
) -> Scheduler:
    """Drive the scheduler over a session plan: turns chained by `sim.sessions`; `cols`
    (the run's requests, one per turn) give the prompt token counts (a replay's are the
    server's)."""
    prompts = None
    if cols is not None:
        prompts = dict(zip(cols.index.tolist(), cols.prompt_tokens.tolist(), strict=True))
    sessions = session_requests(plan, setup_.sched.mode != "slots", prompts)
    arr = spec.arrival
    users = arr.concurrency if not arr.open_loop else None
    stop = spec.duration_s if users and spec.count is None else None
    cap = arr.concurrency if arr.open_loop else None  # turns in flight, as bench caps them
    clients = SessionClients(setup_.step_model, sessions, users, stop, cap)
    sched = Scheduler(setup_.sched, setup_.step_model, trace=trace, shapes=shapes, clients=clients)
    sched.run([])
    return sched


def records_from(sched: Scheduler, cols: RequestColumns | None = None) -> SimRecords:
    """The run's records in (send, index) order, chunk times as ranges of the step-end
    times (`sim.records`): one record per simulated send, built only when read."""
    api = sched.model.api_overhead_s
    times = np.rint((np.asarray(sched.step_end_s, dtype=np.float64) + api) * NS).astype(np.int64)
    done = sched.done
    n = len(done)

    def col(f: Any, dtype: Any) -> np.ndarray:
        return np.fromiter(map(f, done), dtype=dtype, count=n)

    send = np.rint(col(lambda r: r.arrival_s, float) * NS).astype(np.int64)
    sched_s = col(lambda r: np.nan if r.scheduled_s is None else r.scheduled_s, float)
    has_sched = ~np.isnan(sched_s)
    sched_ns = np.where(has_sched, np.rint(np.nan_to_num(sched_s) * NS), 0).astype(np.int64)
    idx = col(lambda r: r.index, np.int64)
    rejected = Phase.REJECTED  # a local: the enum class's attribute lookup is slow
    ok = col(lambda r: r.phase is not rejected, bool)
    order = np.lexsort((idx, send))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    rank_of = rank.tolist()
    seg_rec: list[int] = []
    flat: list[int] = []  # a0, b0, a1, b1, ... over all segments
    for k, r in enumerate(done):
        segs = r.token_step_ranges
        flat += segs
        seg_rec += [rank_of[k]] * (len(segs) // 2)
    bounds = np.asarray(flat, dtype=np.int64).reshape(-1, 2)
    seg_a, seg_b = bounds[:, 0], bounds[:, 1]
    rec_arr = np.asarray(seg_rec, dtype=np.int64)
    seg_order = np.argsort(rec_arr, kind="stable")
    reasons = {
        int(rank[k]): r.reject_reason or "" for k, r in enumerate(done) if r.phase is rejected
    }
    if cols is not None:
        sub_of = np.asarray(cols.sub_names, dtype=object)[cols.sub]
        sub = sub_of[idx[order]].tolist() if len(cols) else []
        group = cols.prefix_group[idx[order]]
    else:
        sub = ["default"] * n
        group = np.full(n, -1, dtype=np.int64)
    return SimRecords(
        times_ns=times,
        index=idx[order],
        send_ns=send[order],
        scheduled_ns=sched_ns[order],
        scheduled_has=has_sched[order],
        priority=col(lambda r: r.priority, np.int64)[order],
        prompt=col(lambda r: r.prompt_tokens, np.int64)[order],
        out=col(lambda r: r.output_tokens, np.int64)[order],
        ok=ok[order],
        seg_rec=rec_arr[seg_order],
        seg_a=seg_a[seg_order],
        seg_b=seg_b[seg_order],
        preemptions=col(lambda r: r.preemptions, np.int64)[order],
        cached=col(lambda r: r.prefix_hit_tokens, np.int64)[order],
        reasons=reasons,
        sub=sub,
        prefix_group=group,
    )


def simulate(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    spec: WorkloadSpec,
    requests: list[Request] | RequestColumns | None = None,
    *,
    profile: Profile | None = None,
    slo: SLO | None = None,
    trace: bool = False,
    keep_requests: bool = False,
    tokenizer: Tokenizer | None = None,
    shapes: set[int] | None = None,
    tier: str | None = None,
) -> tuple[RunResult, Scheduler]:
    """Simulate `spec` (or the given materialised `requests`) and return a RunResult.
    `tokenizer` counts a dataset's prompts (default: a word count, `CountingTokenizer`).
    `shapes`: step sizes the simulated engine already ran (updated in place), so runs
    against one long-lived engine can be chained; None simulates a freshly started one.
    `tier`: force a step-time tier (`setup`)."""
    clock = [time.perf_counter()]
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        clock.append(time.perf_counter())
        phases[name] = clock[-1] - clock[-2]

    su = setup(model, hw, cfg, profile, tier=tier)
    lap("setup")
    if requests is None:
        cols = materialize_for_sim(spec, tokenizer)
    elif isinstance(requests, RequestColumns):
        cols = requests
    else:
        cols = RequestColumns.from_requests(requests)
    check_fits_capped(su, cols)
    su = window_pool(su, model, cfg, cols)
    lap("materialize")
    if spec.sessions is not None:
        plan = plan_sessions(spec, tokenizer)
        sched = run_sessions(su, plan, spec, cols, trace=trace, shapes=shapes)
    else:
        sched, _ = run_sim(su, cols, spec, trace=trace, shapes=shapes)
    lap("loop")
    records = records_from(sched, cols)
    lap("records")
    metrics = compute_metrics(
        records, warmup_s=spec.warmup_s, cooldown_s=spec.cooldown_s, slo=slo, stream=spec.stream
    )
    if slo is not None:
        apply_turn_slo(metrics, records, slo, spec)
    sc = su.sched
    # Paged pool: peak blocks in use; llama.cpp slots preallocate KV, nothing to run over.
    paged = sc.mode != "slots" and sc.kv_blocks
    peak = sched.stats.max_blocks_used / sc.kv_blocks if paged else None
    apply_memory_slo(metrics, slo, peak)
    lap("metrics")
    created = datetime.now(timezone.utc)
    st = sched.stats
    result = RunResult(
        id=f"sim-{created:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}",
        created_utc=created.isoformat(timespec="seconds"),
        backend="sim",
        target=Target(
            engine=cfg.engine,
            model=model.name,
            hardware=hw.name,
            config=cfg.model_dump(mode="json", exclude_defaults=True),
            # the pool's dtype as the simulated engine resolves `auto` (as vLLM logs it)
            settings={
                "kv_cache_dtype": resolved_kv_cache_dtype(cfg.kv_cache_dtype, model, cfg.engine)
            },
            tier=su.step_model.tier,
            profile=profile.key if profile is not None else None,
            efficiency=su.step_model.notes or None,
            kv_blocks=su.sched.kv_blocks,
            kv_capacity_tokens=pool_tokens(su),
            max_num_seqs=su.sched.max_num_seqs,
            max_num_batched_tokens=su.sched.max_num_batched_tokens,
            sim=SimStats(
                steps=st.steps,
                jumps=st.jumps,
                preemptions=st.preemptions,
                rejected=st.rejected,
                prefix_hit_tokens=st.prefix_hit_tokens,
                prefill_tokens_computed=st.prefill_tokens,
                kv_evictions=st.evictions,
                max_kv_blocks_used=st.max_blocks_used,
                wall_s=time.perf_counter() - clock[0],
                phases_s=phases,
                expected_error=run_expected_error(su.step_model.tier, cfg.engine, hw, spec.arrival)
                or None,
            ),
        ),
        workload=spec.model_dump(mode="json"),
        load=Load.of(spec.arrival),
        slo=slo,
        anchor_ns=0,
        started_unix_s=time.time(),
        duration_s=int(records.end_ns.max(initial=0)) / NS,
        requests=[],
        metrics=metrics,
    )
    if keep_requests:
        result.requests = requests if isinstance(requests, list) else cols.requests()
    # Assigned, not validated: the lazy records stay columns until someone reads them.
    result.records = records  # type: ignore[assignment]
    return result, sched


def capacity_note(setup_: SimSetup, model: ModelSpec | None = None) -> str:
    """One line on what the pool holds, for the CLI; a sliding-window `model`'s paged pool
    says each point recounts it (`window_pool`)."""
    sc = setup_.sched
    if sc.mode == "radix":
        window = setup_.evaluation.budget.kv_window_pool_tokens
        if window:  # SGLang's hybrid sliding-window pools (plan.sglang_pool)
            return (
                f"{radix_note(sc)}; the full-attention layers' pool: the window layers' own "
                f"({window:,} tokens) is not simulated (it binds only below the window)"
            )
        return radix_note(sc)
    if sc.mode == "paged":
        recount = ""
        if model is not None and model.sliding_window and model.sliding_window_layers:
            recount = (
                f" (at max_model_len's KV cost; each point's pool is counted at its requests' "
                f"lengths: a sequence under the {model.sliding_window:,}-token window holds "
                "every layer's KV)"
            )
        return (
            f"KV pool {sc.kv_blocks:,} blocks x {sc.block_size} = "
            f"{sc.kv_blocks * sc.block_size:,} tokens{recount}; max_num_seqs {sc.max_num_seqs}, "
            f"max_num_batched_tokens {sc.max_num_batched_tokens}"
        )
    ctx = "shared" if sc.kv_unified else "per slot"
    batch = sc.max_num_batched_tokens
    return (
        f"{sc.max_num_seqs} slots, {sc.slot_ctx:,} tokens {ctx}, batch {batch}, "
        f"ubatch {sc.n_ubatch}"
    )
