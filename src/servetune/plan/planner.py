"""`servetune plan`: will it fit, with how much KV cache, for how many users, how fast at best.

`make_plan` is the one entry point (CLI, simulator and tuner call it); `evaluate` scores a
single EngineConfig and is reused for parallelism options and the OOM fix list, so every
number in a plan comes from the same maths.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from servetune.engines.config import EngineConfig
from servetune.engines.rules import (
    TP_ENGINES,
    check_batch_limits,
    check_tensor_parallel,
    tp_splits_heads,
)
from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.plan import kv as kvmath
from servetune.plan import roofline
from servetune.plan.memory import (
    POOL_DOUBT,
    MemoryBudget,
    Overheads,
    memory_budget,
    pool_in_doubt,
)
from servetune.plan.presets import Scenario
from servetune.plan.quant import (
    VLLM_METHOD_RULES,
    WEIGHT_FORMATS,
    quantize_choice,
    served_format,
)
from servetune.plan.sglang_pool import page_tokens
from servetune.units import GiB, KiB, MiB


class PlanRequest(BaseModel):
    """What the user asks: a model on some GPUs under an engine config and a workload shape."""

    model: ModelSpec
    hardware: HardwareSpec
    gpus: int = Field(1, gt=0)
    config: EngineConfig = EngineConfig()
    tp_given: bool = False  # the user fixed TP; otherwise the smallest TP that fits is chosen
    avg_context: int | None = Field(None, gt=0)
    input_tokens: int = Field(1024, gt=0)
    output_tokens: int = Field(256, gt=0)
    scenario: str | None = None
    overheads: Overheads = Overheads()
    # The EngineConfig knobs the user set (`plan` knows which flags were passed); None:
    # unknown, and SGLang's sizing reads the canonical 0.9 and 16 as not given
    # (`plan.sglang_pool.page_tokens`, `sglang_pool`).
    given_knobs: frozenset[str] | None = None
    # why the KV dtype planned is not the one a scenario asked for (the engine has none)
    kv_dtype_note: str = ""

    @property
    def context(self) -> int:
        """Tokens a sequence holds at its end, for concurrency: --avg-context, else the
        workload's prompt + output."""
        return self.avg_context or self.input_tokens + self.output_tokens


class SmallerPool(BaseModel):
    """What a KV pool `share` smaller holds (`plan.memory.POOL_DOUBT`)."""

    share: float
    kv_capacity_tokens: int
    max_concurrency: int  # at avg_context, capped by max_num_seqs


class Evaluation(BaseModel):
    """One EngineConfig scored: memory terms, KV capacity, concurrency, verdict."""

    config: EngineConfig
    max_model_len: int
    budget: MemoryBudget
    kv_blocks: int
    kv_capacity_tokens: int
    max_concurrency: int  # at avg_context, capped by max_num_seqs
    max_concurrency_at_max_model_len: int
    concurrency_limited_by: str  # "kv_cache" | "max_num_seqs"
    fits: bool
    breaking_term: str | None
    verdict: str
    block_tokens: int = 16  # tokens per KV block (SGLang: per page) the pool is cut into
    # the same config on a pool POOL_DOUBT smaller: vLLM's own pool, which servetune knows
    # only to within that share (`plan.memory.pool_in_doubt`); None where the pool is known
    smaller_pool: SmallerPool | None = None


class ParallelOption(BaseModel):
    tp: int
    pp: int
    dp: int
    weights_per_gpu_gib: float
    kv_capacity_tokens: int
    max_concurrency: int | None  # None where it does not fit: it serves nobody
    fits: bool
    tp_comm_ms_per_token: float  # all-reduce time added to each decode step at batch 1


class Fix(BaseModel):
    """One step of seed 003 §13's OOM handling order, with what it would give."""

    step: int
    action: str
    change: dict[str, object]
    fits: bool
    kv_capacity_tokens: int
    max_concurrency: int
    effect: str


class Bounds(BaseModel):
    """Roofline lower bounds (seed 000 §4.2) for the chosen config."""

    tpot_lower_bound_ms: float
    ttft_lower_bound_ms: float
    prefill_tokens: int
    decode_context: int
    decode_bound_at_batch1: str
    compute_bound_batch: int | None
    tp_comm_ms_per_token: float
    throughput_curve: list[dict[str, float]]  # batch, step_ms, output_tok_s


class Plan(BaseModel):
    model: str
    hardware: str
    gpus: int
    scenario: str | None
    evaluation: Evaluation
    parallelism: list[ParallelOption]
    fixes: list[Fix]
    bounds: Bounds


def resolve_max_model_len(model: ModelSpec, cfg: EngineConfig) -> int:
    """vLLM's default max_model_len, and its ceiling, is the context it derives from
    config.json (`ModelSpec.context_limit`: max_position_embeddings, scaled by
    rope_scaling's factor as vLLM's `_get_and_verify_max_len` does); longer is refused
    ("User-specified max_model_len ... is greater than the derived max_model_len")."""
    limit = model.context_limit
    length = cfg.max_model_len or limit
    if length > limit:
        raise InputError(
            "max_model_len",
            f"{length} exceeds {model.context_limit_origin} ({limit})",
            f"use at most {limit}",
        )
    return length


def evaluate(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    avg_context: int | None = None,
    overheads: Overheads | None = None,
    given_knobs: frozenset[str] | None = None,
) -> Evaluation:
    """Score one config: the KV pool, its capacity in tokens and sequences, and whether
    the engine would start (vLLM refuses when one max_model_len sequence does not fit).
    `given_knobs`: `PlanRequest.given_knobs`."""
    max_len = resolve_max_model_len(model, cfg)
    budget = memory_budget(model, hw, cfg, max_len, overheads, given_knobs)
    block = page_tokens(cfg, given_knobs)  # SGLang: --page-size, 1 by default
    context = min(avg_context or max_len, max_len)
    if budget.kv_pool_tokens is not None:
        # SGLang: the pool as SGLang counts it (`plan.sglang_pool`, every layer at full
        # cost, --max-total-tokens applied), the number its max_running_requests came from
        blocks = budget.kv_pool_tokens // block
        kv_seqs = kvmath.max_sequences(blocks, block, context)
    else:
        blocks, kv_seqs = _pool_sequences(model, cfg, budget, budget.kv_pool_bytes, block, context)
    capacity = blocks * block
    at_max = min(kvmath.max_sequences(blocks, block, max_len), budget.max_num_seqs)
    concurrency = min(kv_seqs, budget.max_num_seqs)
    limited_by = "kv_cache" if kv_seqs < budget.max_num_seqs else "max_num_seqs"
    smaller = None
    if pool_in_doubt(cfg, hw) and budget.kv_pool_bytes > 0:
        pool = budget.kv_pool_bytes * (1 - POOL_DOUBT)
        less, less_seqs = _pool_sequences(model, cfg, budget, pool, block, context)
        smaller = SmallerPool(
            share=POOL_DOUBT,
            kv_capacity_tokens=less * block,
            max_concurrency=min(less_seqs, budget.max_num_seqs),
        )
    breaking, verdict = _verdict(budget, capacity, max_len, hw)
    if breaking == "max_model_len" and capacity == 0 and budget.kv_pool_bytes > 0:
        # the pool has room, but not for one block: the block size is what to change
        one = block * budget.kv_effective_bytes_per_token
        grow = "grow the KV pool (kv_cache_space, gpu_memory_utilization, more GPUs)"
        fix = f"lower block_size (vLLM's default 16) or {grow}" if block > 16 else grow
        breaking, verdict = (
            "block_size",
            (
                f"one block of {block:,} tokens takes {readable_bytes(one)}, more than the "
                f"{readable_bytes(budget.kv_pool_bytes)} KV pool: {fix}"
            ),
        )
    if breaking == "max_model_len" and cfg.engine == "sglang":
        # SGLang starts anyway and refuses longer requests (max_req_input_len caps both).
        breaking = None
        verdict = (
            f"fits: KV pool {budget.kv_pool_bytes / GiB:.2f} GiB holds {capacity:,} tokens "
            f"(less than one {max_len:,}-token context: SGLang refuses longer requests)"
        )
    return Evaluation(
        config=cfg,
        max_model_len=max_len,
        budget=budget,
        kv_blocks=blocks,
        kv_capacity_tokens=capacity,
        max_concurrency=concurrency,
        max_concurrency_at_max_model_len=at_max,
        concurrency_limited_by=limited_by,
        fits=breaking is None,
        breaking_term=breaking,
        verdict=verdict,
        block_tokens=block,
        smaller_pool=smaller,
    )


def _pool_sequences(
    model: ModelSpec,
    cfg: EngineConfig,
    budget: MemoryBudget,
    pool_bytes: float,
    block: int,
    context: int,
) -> tuple[int, int]:
    """(blocks, sequences of `context` tokens) a pool of `pool_bytes` in blocks of `block`
    tokens holds: blocks at the budget's per-token cost, sequences at the cost for that
    context (a sliding-window model's depends on it)."""
    blocks = kvmath.pool_blocks(pool_bytes, block, budget.kv_effective_bytes_per_token)
    ctx_bytes = kvmath.effective_kv_bytes_per_token(
        model,
        budget.kv_dtype_bytes,
        context,
        cfg.tensor_parallel_size,
        cfg.pipeline_parallel_size,
    )
    seqs = kvmath.max_sequences(kvmath.pool_blocks(pool_bytes, block, ctx_bytes), block, context)
    return blocks, seqs


def readable_bytes(n: float) -> str:
    """A size in the largest binary unit (GiB, MiB, KiB) that keeps it >= 1, so a tiny
    KV pool reads 100.00 KiB rather than 0.00 GiB."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def utilization_limit(b: MemoryBudget) -> float:
    """The highest gpu_memory_utilization (2 decimals, rounded down) whose (1 - utilization)
    headroom holds the CUDA context vLLM starts with: 1 - context / device."""
    return math.floor((1 - b.headroom_context_bytes / b.device_bytes) * 100) / 100


def explicit_pool_room(b: MemoryBudget) -> float:
    """Bytes an explicit KV pool (kv_cache_space) may take: the device less the weights,
    the activation peak and the fixed overheads."""
    return b.device_bytes - b.weights_bytes - b.activation_bytes - b.overhead_bytes


def _verdict(
    b: MemoryBudget, capacity: int, max_len: int, hw: HardwareSpec
) -> tuple[str | None, str]:
    """Name the first term that breaks the budget, in the order memory is claimed."""
    gib = GiB
    headroom = b.device_bytes - b.usable_bytes
    if b.headroom_context_bytes > headroom:
        # vLLM's worker refuses to start when the memory free at start-up (after the CUDA
        # context) is below utilization x total (vllm/v1/worker/gpu_worker.py `init_device`:
        # "Free memory on device ... is less than desired GPU memory utilization")
        limit = utilization_limit(b)
        fix = (
            f"lower gpu_memory_utilization to at most {limit:.2f} (1 - context / device)"
            if limit > 0
            else "the context is larger than the device"
        )
        return "gpu_memory_utilization", (
            f"the CUDA context ({b.headroom_context_bytes / gib:.1f} GiB) does not fit the "
            f"{headroom / gib:.1f} GiB that gpu_memory_utilization={b.memory_fraction:g} leaves "
            f"free on the {b.device_bytes / gib:.1f} GiB {hw.display_name} (vLLM refuses to "
            f"start with less than utilization x device free): {fix}"
        )
    if b.weights_bytes > b.usable_bytes:
        return "weights", (
            f"weights need {b.weights_bytes / gib:.1f} GiB per GPU but only "
            f"{b.usable_bytes / gib:.1f} GiB is usable"
        )
    if b.explicit_kv_pool:
        room = explicit_pool_room(b)
        if b.kv_pool_bytes > room:
            total = b.device_bytes - room + b.kv_pool_bytes
            fix = (
                f"lower kv_cache_space to at most {math.floor(room / gib * 100) / 100:.2f} GiB"
                if room >= 0.01 * gib
                else "no KV pool fits beside them"
            )
            return "kv_cache_space", (
                f"weights {b.weights_bytes / gib:.1f} + KV pool {b.kv_pool_bytes / gib:.1f} + "
                f"activations {b.activation_bytes / gib:.1f} + overheads "
                f"{b.overhead_bytes / gib:.1f} GiB = {total / gib:.1f} GiB exceed the "
                f"{b.device_bytes / gib:.1f} GiB of {hw.display_name}: {fix}"
            )
    elif b.kv_pool_bytes <= 0:
        term = "activation" if b.activation_bytes >= b.overhead_bytes else "overhead"
        return term, (
            f"no room left for KV cache: weights {b.weights_bytes / gib:.1f} + activations "
            f"{b.activation_bytes / gib:.1f} + overheads {b.overhead_bytes / gib:.1f} GiB "
            f">= usable {b.usable_bytes / gib:.1f} GiB"
        )
    if capacity < max_len:
        return "max_model_len", (
            f"KV pool holds {capacity:,} tokens, less than one max_model_len={max_len:,} "
            "sequence (the engine refuses to start): set max_model_len <= "
            f"{capacity:,}, or grow the KV pool (gpu_memory_utilization, kv_cache_space, more GPUs)"
        )
    return None, f"fits: KV pool {b.kv_pool_bytes / gib:.2f} GiB holds {capacity:,} tokens"


def tp_candidates(model: ModelSpec, hw: HardwareSpec, gpus: int) -> list[int]:
    """TP sizes that split the model's heads as vLLM can (`engines.rules.tp_splits_heads`)
    and stay within one node (seed 003 §6)."""
    limit = min(gpus, hw.devices_per_node)
    heads, kv = model.num_attention_heads, model.num_kv_heads
    return [t for t in range(1, limit + 1) if tp_splits_heads(t, heads, kv)]


def node_tp_fix(model: ModelSpec, hw: HardwareSpec) -> str:
    """The fix for a TP that splits no heads (`plan`'s and the simulator's): the sizes that
    do within one node, where vLLM's rule alone offered 16 on an 8-GPU node."""
    sizes = tp_candidates(model, hw, hw.devices_per_node)
    return f"use one of {', '.join(map(str, sizes))} (TP stays within one node)"


def check_tp_within_node(
    tp: int | None,
    pp: int,
    model: ModelSpec,
    hw: HardwareSpec,
    *,
    flag: str = "--tp",
    split: str = "--tp {tp} --pp {pp}",
    tail: str = "",
) -> None:
    """Tensor parallelism stays within one node (seed 003 §6: its all-reduce runs on every
    layer, over NVLink/PCIe, not the network); more GPUs than a node holds are pipeline
    stages. Refused rather than priced as if the node were larger: `plan`'s --tp, the
    simulator's knobs (`--set tensor_parallel_size=16` on an 8-GPU H100 node was simulated
    at NVLink speed) and simulate's and tune's --gpus (`check_gpus_as_tp`), each naming
    its `flag` and giving the TP x PP split in its own words (`split`, `{tp}` and `{pp}`
    filled; `tail` added to the fix)."""
    node = hw.devices_per_node
    if tp is None or tp <= node:
        return
    sizes = tp_candidates(model, hw, node) or [1]
    best = sizes[-1]
    stages = math.ceil(tp * pp / best)
    raise InputError(
        flag,
        f"{tp} is more than the {node} GPUs in one {hw.name} node (tensor parallelism "
        "runs within a node)",
        f"use {split.format(tp=best, pp=stages)} for {best * stages} GPUs (pipeline stages "
        f"span nodes){tail}",
    )


def check_gpus_as_tp(
    gpus: int, engine: str, model: ModelSpec, hw: HardwareSpec, split: str
) -> None:
    """`--gpus` N taken as one replica's tensor parallelism (simulate, tune): refused naming
    --gpus, not the knob it set, where the engine has no TP, the node cannot hold it
    (`check_tp_within_node`) or it splits no heads (`check_tensor_parallel`, with plan's
    sizes). `split` says how the command gives TP and PP apart; `{tp}`, `{pp}` filled.
    (simulate --engine llamacpp --gpus 2 had run as if llama.cpp split tensors.)"""
    if gpus <= 1:
        return
    if engine not in TP_ENGINES:
        raise InputError(
            "--gpus",
            f"{gpus} sets tensor parallelism, which {engine} has no flag for",
            "drop --gpus: one replica per GPU, `plan --gpus N` sizes the replicas",
        )
    if hw.kind == "gpu":  # a CPU host's "node" is itself: its TP is the engine's rule
        tail = "; --gpus sets TP alone"
        check_tp_within_node(gpus, 1, model, hw, flag="--gpus", split=split, tail=tail)
    try:
        cfg = EngineConfig(engine=engine, tensor_parallel_size=gpus)  # type: ignore[arg-type]
        check_tensor_parallel(cfg, model.num_attention_heads, model.num_kv_heads)
    except InputError as exc:
        sizes = node_tp_fix(model, hw) if hw.kind == "gpu" else exc.fix
        raise InputError("--gpus", exc.problem, sizes) from None


def parallel_options(req: PlanRequest) -> list[ParallelOption]:
    """Every TP within a node, and PP stages on the largest of them when that is not
    enough (across nodes, or within one when the heads allow no larger TP), with its
    per-GPU memory, capacity and TP communication cost. The layout the user gave (--tp,
    --pp) is a row too: `--tp 1 --pp 2` was in none, and no row was marked chosen."""
    model, hw = req.model, req.hardware
    options = []
    sizes = tp_candidates(model, hw, req.gpus)
    layouts = set()
    for tp in sizes:
        layouts.add((tp, 1))
        if tp == sizes[-1]:  # the largest TP that splits the heads within a node
            top = min(req.gpus // tp, model.num_layers)  # a layer a stage
            layouts.update((tp, pp) for pp in range(2, top + 1))
    given = (req.config.tensor_parallel_size, req.config.pipeline_parallel_size)
    if req.tp_given and given[0] * given[1] <= req.gpus:
        layouts.add(given)
    for tp, pp in sorted(layouts):
        cfg = req.config.with_(tensor_parallel_size=tp, pipeline_parallel_size=pp)
        ev = evaluate(model, hw, cfg, req.context, req.overheads, req.given_knobs)
        ev = request_verdict(ev, req.input_tokens + req.output_tokens)
        # a token's all-reduces: one stage's, once per stage (`bounds`)
        comm = roofline.comm_s(model, hw, tp, 1, pp) * pp
        options.append(
            ParallelOption(
                tp=tp,
                pp=pp,
                dp=req.gpus // (tp * pp),
                weights_per_gpu_gib=ev.budget.weights_bytes / GiB,
                kv_capacity_tokens=ev.kv_capacity_tokens,
                max_concurrency=ev.max_concurrency if ev.fits else None,
                fits=ev.fits,
                tp_comm_ms_per_token=comm * 1e3,
            )
        )
    return options


def choose_parallelism(req: PlanRequest, options: list[ParallelOption]) -> EngineConfig:
    """Smallest TP that fits (then smallest PP); DP replicas use the remaining GPUs."""
    if req.tp_given:
        tp, pp = req.config.tensor_parallel_size, req.config.pipeline_parallel_size
        if tp * pp > req.gpus:
            flag = "--tp" if tp > 1 or pp == 1 else "--pp"
            raise InputError(
                flag,
                f"tp x pp = {tp * pp} needs more than the {req.gpus} GPUs given",
                f"raise --gpus or lower {flag}",
            )
    else:
        fitting = [o for o in options if o.fits]
        best = min(fitting, key=lambda o: (o.tp * o.pp, o.pp)) if fitting else options[-1]
        tp, pp = best.tp, best.pp
    return req.config.with_(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=max(1, req.gpus // (tp * pp)),
    )


def _lower(
    action: str, knob: str, current: float, new: float
) -> list[tuple[str, dict[str, object]]]:
    """A "lower <knob>" step, or none when `new` would not be lower than `current`."""
    return [(action, {knob: new})] if new < current else []


def _engine_takes(cfg: EngineConfig, hw: HardwareSpec, change: dict[str, object]) -> bool:
    """Whether the engine has a flag for every knob of `change` (its adapter's launch
    command, as `simulate --set` checks): llama.cpp was offered FP8 weights, an FP8 KV
    cache, --enforce-eager and TP 2, each priced as if it ran."""
    from servetune.engines.registry import launch_command

    spec = launch_command(cfg.engine, cfg, "model", device="gpu" if hw.kind == "gpu" else "cpu")
    return all(spec.why_unsupported(k) is None for k in change)


def oom_fixes(req: PlanRequest, base: Evaluation) -> list[Fix]:
    """Seed 003 §13's OOM handling order, each step evaluated on the same maths. A "lower"
    step that would not lower its knob is left out. With an explicit KV pool
    (kv_cache_space) the first step lowers it to what fits, and utilization, which does
    not size that pool, is not offered."""
    cfg, b = base.config, base.budget
    steps: list[tuple[str, dict[str, object]]] = []
    if b.explicit_kv_pool:
        room = math.floor(explicit_pool_room(b) / GiB * 100) / 100
        if room > 0:
            steps += _lower(
                "lower kv_cache_space to what fits",
                "kv_cache_space_gib",
                b.kv_pool_bytes / GiB,
                room,
            )
    elif b.memory_fraction is not None:
        util = round(max(b.memory_fraction - 0.05, 0.05), 2)
        if base.breaking_term == "gpu_memory_utilization":  # the verdict's "at most" value:
            util = utilization_limit(b)  # the most KV the headroom allows (it offered 0.94)
        if util > 0:
            steps += _lower(
                "lower gpu_memory_utilization", "gpu_memory_utilization", b.memory_fraction, util
            )
    batched = b.max_num_batched_tokens
    # halved, never below 256 nor, on vLLM, below max_num_seqs (`check_batch_limits`: vLLM
    # refuses max_num_batched_tokens < max_num_seqs at start-up)
    floor = max(256, b.max_num_seqs if cfg.engine == "vllm" else 0)
    steps += _lower(
        "lower max_num_batched_tokens",
        "max_num_batched_tokens",
        batched,
        max(batched // 2, floor),
    )
    steps += _lower(
        "lower max_num_seqs", "max_num_seqs", b.max_num_seqs, max(b.max_num_seqs // 2, 1)
    )
    shorter = max(base.max_model_len // 2, 256)
    if shorter >= max(req.input_tokens + req.output_tokens, req.avg_context or 0):
        # never a max_model_len the workload's requests outgrow: the engine would refuse them
        steps += _lower("lower max_model_len", "max_model_len", base.max_model_len, shorter)
    quant = quantize_choice(req.hardware)  # a format vLLM starts on this GPU
    if cfg.quantization is None and req.model.quantization is None and quant:  # 16-bit
        how = (
            "quantize weights"
            if VLLM_METHOD_RULES[quant].quantizes_at_load
            else f"load a pre-quantized {quant.upper()} release (vLLM cannot quantize to it)"
        )
        steps.append((f"{how} ({WEIGHT_FORMATS[quant].note})", {"quantization": quant}))
    if b.kv_dtype_bytes > 1:  # not already an 8-bit pool (asked for, or the checkpoint's)
        steps.append(("fp8 KV cache", {"kv_cache_dtype": "fp8"}))
    if not cfg.enforce_eager and req.hardware.kind == "gpu":
        steps.append(("drop CUDA graphs (--enforce-eager)", {"enforce_eager": True}))
    bigger = [
        t
        for t in tp_candidates(req.model, req.hardware, req.hardware.devices_per_node)
        if t > cfg.tensor_parallel_size
    ]
    if bigger:
        steps.append(("raise TP / add GPUs", {"tensor_parallel_size": bigger[0]}))
    fixes = []
    steps = [(a, c) for a, c in steps if _engine_takes(cfg.with_(**c), req.hardware, c)]
    for i, (action, change) in enumerate(steps, start=1):
        given = None if req.given_knobs is None else req.given_knobs | set(change)
        try:
            ev = evaluate(
                req.model, req.hardware, cfg.with_(**change), req.context, req.overheads, given
            )
            ev = request_verdict(ev, req.input_tokens + req.output_tokens)
            # a fix the engine would refuse at start-up is no fix
            check_batch_limits(ev.config, ev.budget.max_num_seqs, ev.budget.max_num_batched_tokens)
        except (InputError, ValueError):
            continue
        ratio = ev.kv_capacity_tokens / base.kv_capacity_tokens if base.kv_capacity_tokens else 0
        effect = (
            f"{ratio:.2f}x capacity -> {ev.kv_capacity_tokens:,} tokens, "
            f"{ev.max_concurrency} sequences"
            if base.kv_capacity_tokens
            else f"{ev.kv_capacity_tokens:,} tokens, {ev.max_concurrency} sequences"
        )
        if not ev.fits:
            effect += f" (still does not fit: {ev.breaking_term})"
        fixes.append(
            Fix(
                step=i,
                action=action,
                change=change,
                fits=ev.fits,
                kv_capacity_tokens=ev.kv_capacity_tokens,
                max_concurrency=ev.max_concurrency,
                effect=effect,
            )
        )
    return fixes


def bounds(req: PlanRequest, ev: Evaluation) -> Bounds:
    """Roofline TPOT/TTFT floors and the decode throughput ceiling versus batch.

    Each roofline term is one GPU of the most loaded PP stage (its weights, KV, FLOPs and
    all-reduces); a token passes every stage in turn, so per-token time is pp x one stage.
    KV reads honour sliding windows: the per-token KV at a context is the sequence's bytes
    over its length (`kv.effective_kv_bytes_per_token`), not every layer in full. MoE
    experts are read at their own bytes (`roofline.weight_bytes_read` with the format)."""
    model, hw, cfg = req.model, req.hardware, ev.config
    fmt = served_format(cfg.dtype, cfg.quantization, model, hw)
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    w = ev.budget.weights_bytes
    dtype_bytes = ev.budget.kv_dtype_bytes
    # the request fits max_model_len (`check_workload`), so nothing here is clamped
    context = req.avg_context or (req.input_tokens + req.output_tokens // 2)
    prompt = req.input_tokens
    kv_decode = kvmath.effective_kv_bytes_per_token(model, dtype_bytes, context, tp, pp)
    kv_prefill = kvmath.effective_kv_bytes_per_token(model, dtype_bytes, prompt, tp, pp)
    step1 = roofline.decode_step(
        model, hw, w, kv_decode, 1, context, fmt.compute, tp, pp=pp, weight_format=fmt
    )
    prefill = roofline.prefill_time(model, hw, w, kv_prefill, prompt, fmt.compute, tp, pp)
    max_batch = max(1, min(ev.budget.max_num_seqs, max(ev.max_concurrency, 1)))
    curve = roofline.throughput_curve(
        model, hw, w, kv_decode, context, fmt.compute, max_batch, tp, pp=pp, weight_format=fmt
    )
    return Bounds(
        tpot_lower_bound_ms=step1.time_s * pp * 1e3,
        ttft_lower_bound_ms=prefill.time_s * pp * 1e3,
        prefill_tokens=prompt,
        decode_context=context,
        decode_bound_at_batch1=step1.bound,
        compute_bound_batch=roofline.compute_bound_batch(
            model, hw, w, kv_decode, context, fmt.compute, tp, pp=pp, weight_format=fmt
        ),
        tp_comm_ms_per_token=step1.comm_s * pp * 1e3,
        throughput_curve=[
            {
                "batch": b,
                "step_ms": ms * pp,
                "output_tok_s": tps / pp * cfg.data_parallel_size,
            }
            for b, ms, tps in curve
        ],
    )


def check_workload(req: PlanRequest, max_len: int) -> None:
    """A request (or --avg-context) longer than max_model_len never runs, so the plan is
    refused, never made on a clamped length. `plan.service.check_request_fits` says the
    same in the user's flags first; this guards other callers."""
    longest = max(req.input_tokens + req.output_tokens, req.avg_context or 0)
    if longest > max_len:
        raise InputError(
            "max_model_len",
            f"{max_len:,} is shorter than the workload's {longest:,}-token requests",
            f"raise it to at least {longest:,}, or shorten the requests",
        )


def request_verdict(ev: Evaluation, request_tokens: int) -> Evaluation:
    """SGLang starts with a KV pool smaller than max_model_len and refuses requests longer
    than the pool (`evaluate`): if the workload's requests are, none of them runs."""
    if not ev.fits or request_tokens <= ev.kv_capacity_tokens:
        return ev
    verdict = (
        f"KV pool holds {ev.kv_capacity_tokens:,} tokens, less than one {request_tokens:,}-"
        "token request (SGLang refuses each): grow the KV pool "
        "(mem_fraction_static, kv_cache_space, more GPUs) or shorten the requests"
    )
    return ev.model_copy(update={"fits": False, "breaking_term": "kv_cache", "verdict": verdict})


def make_plan(req: PlanRequest) -> Plan:
    """Plan a deployment: choose parallelism, size memory and KV, list fixes and bounds."""
    options = parallel_options(req)
    if not options:
        raise InputError(
            "--gpus",
            f"no TP size divides {req.model.num_attention_heads} attention heads "
            f"within {req.gpus} GPUs",
            "give more GPUs",
        )
    cfg = choose_parallelism(req, options)
    ev = evaluate(req.model, req.hardware, cfg, req.context, req.overheads, req.given_knobs)
    check_workload(req, ev.max_model_len)
    ev = request_verdict(ev, req.input_tokens + req.output_tokens)
    return Plan(
        model=req.model.name,
        hardware=req.hardware.name,
        gpus=req.gpus,
        scenario=req.scenario,
        evaluation=ev,
        parallelism=options,
        fixes=oom_fixes(req, ev),
        bounds=bounds(req, ev),
    )


def scenario_config(
    scenario: Scenario, base: EngineConfig, explicit: set[str], model: ModelSpec
) -> EngineConfig:
    """Apply a scenario's starting knobs (seed 003 §12), its weight format included (cpu-edge:
    GGUF Q4_K_M), without overriding what the user set."""
    knobs = {
        "max_model_len": min(scenario.max_model_len, model.context_limit),
        "max_num_seqs": scenario.max_num_seqs,
        "max_num_batched_tokens": scenario.max_num_batched_tokens,
        "gpu_memory_utilization": scenario.gpu_memory_utilization,
        "enable_prefix_caching": scenario.prefix_caching,
        "enable_chunked_prefill": scenario.chunked_prefill,
        "kv_cache_dtype": scenario.kv_cache_dtype,
        "quantization": scenario.quantization,
    }
    return base.with_(**{k: v for k, v in knobs.items() if k not in explicit})
