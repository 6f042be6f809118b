"""`servetune plan`: memory budget, KV capacity, parallelism, roofline bounds and flags."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100-sxm"
DEFAULT_SCENARIO = "chat"


def register(app: typer.Typer) -> None:
    app.command("plan", help="Will it fit, with how much KV cache, for how many users, how fast.")(
        plan
    )


def plan(
    model: str = typer.Option(
        DEFAULT_MODEL, "--model", "-m", help="Catalog name or path to a HF config.json / model dir."
    ),
    gpu: str = typer.Option(
        DEFAULT_GPU, "--gpu", "-g", help="Accelerator name (`servetune gpus` lists them)."
    ),
    gpus: int = typer.Option(1, "--gpus", help="GPUs available (TP x PP x DP)."),
    scenario: str = typer.Option(
        DEFAULT_SCENARIO,
        "--scenario",
        "-s",
        help="chat, rag, code, batch, long-context, cpu-edge, or none.",
    ),
    dtype: str = typer.Option("auto", "--dtype", help="auto, bfloat16, float16, float32."),
    quant: str | None = typer.Option(
        None,
        "--quant",
        help="fp8, int8, awq, gptq, mxfp4, q8_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k "
        "(default: the checkpoint's own quantization_config, else --dtype).",
    ),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="auto, fp16, bf16, fp8, int8."),
    max_model_len: int | None = typer.Option(None, "--max-model-len"),
    gpu_memory_utilization: float | None = typer.Option(None, "--gpu-memory-utilization"),
    kv_cache_space: float | None = typer.Option(
        None,
        "--kv-cache-space",
        help="KV pool in GiB instead of a memory fraction (CPU engines, TensorRT-LLM).",
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", help="KV block tokens (default: the engine's, vLLM 16, SGLang 1)."
    ),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs"),
    max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens"),
    tp: int | None = typer.Option(
        None, "--tp", help="Tensor parallel size (default: smallest that fits)."
    ),
    pp: int = typer.Option(1, "--pp", help="Pipeline parallel size (with --tp)."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="No CUDA graphs."),
    engine: str = typer.Option(
        "vllm", "--engine", help="vllm (gpu_memory_utilization) or sglang (mem_fraction_static)."
    ),
    extra: str | None = typer.Option(
        None,
        "--extra",
        help="With --engine sglang: its flags that size the pool, e.g. "
        "--extra '--swa-full-tokens-ratio 0.5'",
    ),
    avg_context: int | None = typer.Option(
        None, "--avg-context", help="Average tokens held per sequence, for concurrency."
    ),
    input_len: int | None = typer.Option(
        None, "--input-len", help="Prompt tokens for the TTFT bound."
    ),
    output_len: int | None = typer.Option(None, "--output-len", help="Output tokens per request."),
    overhead: list[str] = typer.Option(
        [], "--overhead", help="Override a fixed overhead, e.g. cuda_graphs_gib=1.0."
    ),
    hardware_file: Path | None = typer.Option(
        None, "--hardware-file", help="YAML/JSON with extra accelerators."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    remeasure: bool = typer.Option(
        False, "--remeasure", help="--gpu local: measure this host again (the cache is shared)."
    ),
) -> None:
    from servetune.engines.extra import split_extra
    from servetune.hardware import local
    from servetune.plan.service import PlanArgs, plan_to_json, run_plan

    if remeasure:
        from servetune.hardware.catalog import normalize_name

        local.request_remeasure(normalize_name(gpu))

    args = PlanArgs(
        model=model,
        gpu=gpu,
        gpus=gpus,
        scenario=scenario,
        dtype=dtype,
        quant=quant,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_space=kv_cache_space,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        tp=tp,
        pp=pp,
        enforce_eager=enforce_eager,
        avg_context=avg_context,
        input_len=input_len,
        output_len=output_len,
        overhead=overhead,
        hardware_file=hardware_file,
        engine=engine,
        extra=split_extra(extra, engine) if extra else (),
        from_flags=True,
    )
    result = run_plan(args)
    host = local.measurement_behind(result.hardware)  # None unless --gpu local
    if as_json:
        payload: dict[str, Any] = plan_to_json(result)
        if host is not None:
            payload["host_measurement"] = local.report_json(host, time.time())
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        from servetune.cli.render import console
        from servetune.plan.render import render_plan

        render_plan(result, console())
        if host is not None:
            typer.echo("\n".join(local.describe(host, time.time())))
    if not result.plan.evaluation.fits:
        from servetune.errors import InputError

        ev = result.plan.evaluation
        raise InputError(
            ev.breaking_term or "plan", f"does not fit: {ev.verdict}", "see the fixes listed above"
        )
