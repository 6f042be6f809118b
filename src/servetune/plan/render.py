"""Rich tables for a plan: memory breakdown, KV capacity, parallelism, bounds, fixes, flags."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servetune.plan.memory import context_in_headroom
from servetune.plan.service import PlanResult
from servetune.units import GiB


def _gib(value: float) -> str:
    return f"{value / GiB:,.2f}"


def _overheads_label(result: PlanResult) -> str:
    """Name the terms the fixed-overheads row holds: they depend on the engine, the host and
    whether vLLM's headroom takes the CUDA context (`Overheads.total_bytes`)."""
    cfg = result.plan.evaluation.config
    if result.hardware.kind == "cpu":
        return "fixed overheads (none on a CPU host)"
    if cfg.engine == "sglang":
        return "taken before start-up (CUDA context, NCCL)"
    terms = [] if context_in_headroom(cfg) else ["context"]
    terms.append("workspace")
    if not cfg.enforce_eager:
        terms.append("graphs")
    if cfg.world_size > 1:
        terms.append("NCCL")
    return f"fixed overheads ({', '.join(terms)})"


def render_plan(result: PlanResult, console: Console | None = None) -> None:
    console = console or Console()
    plan, ev, m, hw = result.plan, result.plan.evaluation, result.model, result.hardware
    b, cfg = ev.budget, ev.config
    params = f"{m.params_total / 1e9:.2f}B params"
    if m.moe:
        params += f" ({m.params_active / 1e9:.2f}B active)"
    console.print(
        f"[bold]{m.name}[/] ({params}) on {plan.gpus} x {hw.display_name} "
        f"[dim]scenario={plan.scenario or 'none'}[/]"
    )
    style = "green" if ev.fits else "bold red"
    console.print(f"[{style}]{'FITS' if ev.fits else 'DOES NOT FIT'}[/]: {ev.verdict}")

    console.print(
        f"Weights: [bold]{b.weight_format}[/] ({b.weight_format_note}) "
        f"from {result.weight_format_origin}",
        highlight=False,
    )
    mem = Table(title=f"Memory per GPU ({b.weight_format} weights, GiB)", title_justify="left")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    mem.add_column("% of device", justify="right")
    sglang = cfg.engine == "sglang"  # its terms: plan.sglang_pool
    headroom = hw.kind == "gpu" and context_in_headroom(cfg)
    rows = [
        ("weights", b.weights_bytes),
        (
            "reserved: activations, CUDA graphs (1 - mem_fraction_static)"
            if sglang
            else "activation peak (prefill of max_num_batched_tokens)",
            b.activation_bytes,
        ),
        (_overheads_label(result), b.overhead_bytes),
        ("KV cache pool", max(b.kv_pool_bytes, 0.0)),
        (
            "left free (1 - utilization), CUDA context in it"
            if headroom
            else "left free (1 - gpu_memory_utilization)",
            max(b.free_after_kv_bytes, 0.0),
        ),
    ]
    for name, value in rows:
        mem.add_row(name, _gib(value), f"{100 * value / b.device_bytes:.1f}%")
    mem.add_row("[bold]device[/]", _gib(b.device_bytes), "100%")
    console.print(mem)

    kv = Table(title="KV cache", title_justify="left", show_header=False)
    kv.add_column("what")
    kv.add_column("value", justify="right")
    kv.add_row("bytes / token (this GPU, all its layers)", f"{b.kv_bytes_per_token:,}")
    if b.kv_effective_bytes_per_token < b.kv_bytes_per_token:  # sliding-window layers
        # what the blocks are counted at (vLLM's "GPU KV cache size" is concurrency at
        # max_model_len x max_model_len): blocks x the full bytes overran the pool
        kv.add_row(
            f"bytes / token at max_model_len={ev.max_model_len:,} (windows capped)",
            f"{b.kv_effective_bytes_per_token:,.0f}",
        )
    kv.add_row("KV dtype bytes", str(b.kv_dtype_bytes))
    kv.add_row("block size / blocks", f"{ev.block_tokens} / {ev.kv_blocks:,}")
    if b.kv_window_pool_tokens:  # SGLang's hybrid sliding-window pools (plan.sglang_pool)
        kv.add_row("capacity (tokens, full-attention layers' pool)", f"{ev.kv_capacity_tokens:,}")
        kv.add_row("sliding-window layers' pool (tokens)", f"{b.kv_window_pool_tokens:,}")
    else:
        kv.add_row("capacity (tokens)", f"{ev.kv_capacity_tokens:,}")
    none = "none (does not fit)"  # a config that does not start serves nobody
    kv.add_row(
        f"sequences at max_model_len={ev.max_model_len:,}",
        f"{ev.max_concurrency_at_max_model_len:,}" if ev.fits else none,
    )
    kv.add_row(
        f"sequences at avg context (cap max_num_seqs={b.max_num_seqs})",
        f"{ev.max_concurrency:,} (limited by {ev.concurrency_limited_by})" if ev.fits else none,
    )
    less = ev.smaller_pool
    if ev.fits and less is not None and less.max_concurrency < ev.max_concurrency:
        kv.add_row(
            f"if vLLM's pool is {less.share:.0%} smaller",
            f"{less.kv_capacity_tokens:,} tokens, {less.max_concurrency:,} sequences",
        )
    console.print(kv)
    if result.kv_dtype_note:
        console.print(f"[yellow]KV dtype:[/] {result.kv_dtype_note}", highlight=False)

    par = Table(title="Parallelism options", title_justify="left")
    for col in (
        "TP",
        "PP",
        "DP",
        "weights/GPU GiB",
        "KV tokens",
        "seqs",
        "TP comm ms/token",
        "fits",
    ):
        par.add_column(col, justify="right")
    for o in plan.parallelism:
        chosen = o.tp == cfg.tensor_parallel_size and o.pp == cfg.pipeline_parallel_size
        par.add_row(
            str(o.tp),
            str(o.pp),
            str(o.dp),
            f"{o.weights_per_gpu_gib:.2f}",
            f"{o.kv_capacity_tokens:,}",
            "-" if o.max_concurrency is None else str(o.max_concurrency),
            f"{o.tp_comm_ms_per_token:.3f}",
            ("[bold]yes *[/]" if chosen else "yes") if o.fits else "no",
        )
    console.print(par)

    bd = plan.bounds
    bt = Table(title="Roofline bounds (lower bounds, no queueing)", title_justify="left")
    dp = ev.config.data_parallel_size  # the ceiling is every replica's, the batch one's
    bt.add_column("batch" if dp == 1 else "batch / replica", justify="right")
    bt.add_column("decode step ms", justify="right")
    bt.add_column("output tok/s ceiling" + ("" if dp == 1 else f", {dp} replicas"), justify="right")
    for p in bd.throughput_curve:
        bt.add_row(str(int(p["batch"])), f"{p['step_ms']:.2f}", f"{p['output_tok_s']:,.0f}")
    console.print(bt)
    knee = bd.compute_bound_batch
    console.print(
        f"TPOT >= [bold]{bd.tpot_lower_bound_ms:.2f} ms[/] (batch 1, {bd.decode_bound_at_batch1}-"
        f"bound, context {bd.decode_context}); TTFT >= [bold]{bd.ttft_lower_bound_ms:.2f} ms[/] "
        f"for a {bd.prefill_tokens}-token prompt; decode turns compute-bound at batch "
        f"{knee if knee else 'never (KV reads dominate)'}"
    )

    fx = Table(title="If it runs out of memory: seed 003 §13 order", title_justify="left")
    fx.add_column("#", justify="right")
    for col in ("fix", "change", "gives"):  # `gpu_memory_utilization=0.85` folds, never cut
        fx.add_column(col, overflow="fold")
    for f in plan.fixes:
        fx.add_row(
            str(f.step), f.action, ", ".join(f"{k}={v}" for k, v in f.change.items()), f.effect
        )
    console.print(fx)

    console.print(f"[bold]Engine:[/] {result.engine} — {result.engine_reason}")
    if result.launch_withheld:
        console.print(f"Launch commands: none: {result.launch_withheld}", highlight=False)
    elif not result.launch:
        console.print("Launch commands: none while it does not fit (a fix above first)")
    for name, spec in result.launch.items():
        console.print(f"[bold]{name}[/]: {spec.shell()}", soft_wrap=True, highlight=False)
        if spec.unsupported:
            console.print(f"  [yellow]no equivalent flag:[/] {', '.join(spec.unsupported)}")
        for note in spec.notes:
            console.print(f"  [dim]note:[/] {note}", soft_wrap=True, highlight=False)
