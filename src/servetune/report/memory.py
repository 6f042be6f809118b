"""The memory picture of a config, by the engine's own rule for its KV cache, and the
report's chart of them (one bar per config, the rule said once).

- vLLM (and the engines that take a fraction of device memory, or a KV space on CPU:
  VLLM_CPU_KVCACHE_SPACE): `servetune plan` itself, the same function the `plan` command
  runs, never a second formula.
- llama.cpp: `-c` tokens, split over the `-np` slots (one pool when --kv-unified),
  whatever memory is free. The tokens come from the launch command the run recorded, or
  the adapter's (`engines.llamacpp.build`) for its config; no `-c` is llama-server's
  `-c 0`, the model's training context. The bytes per token and the weights are the
  plan's (model, quantization and KV type).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from servetune.engines import llamacpp
from servetune.engines.config import EngineConfig
from servetune.engines.extra import extra_flag
from servetune.errors import InputError
from servetune.plan.service import PlanArgs, plan_to_json, run_plan
from servetune.report.charts import Chart, _go, _layout
from servetune.report.data import ReportData
from servetune.sim.engine import LLAMACPP_DEFAULT_SLOTS
from servetune.store.runinfo import RunInfo

GIB = 2**30
# ggml's block_q8_0 (ggml-common.h): 32 int8 values and one fp16 scale, 34 bytes for 32
# values where f16 takes 64: -ctk/-ctv q8_0 (the `int8` KV dtype) costs 34/64 of f16.
_KV_TYPE_SHARE = {"int8": 34 / 64}


@dataclass
class MemoryPicture:
    """One config's memory per GPU (or the host): parts in bytes, and what they rest on."""

    config: str
    engine: str
    parts: dict[str, float] = field(default_factory=dict)  # label -> bytes
    device_bytes: float | None = None
    kv_tokens: int = 0
    max_concurrency: int | None = None
    rule: str = ""  # the engine's rule for its KV cache, in one line (same for its configs)
    detail: str = ""  # what the rule gives for this config

    @property
    def free_bytes(self) -> float | None:
        if self.device_bytes is None:
            return None
        return max(0.0, self.device_bytes - sum(self.parts.values()))


def plan_args(info: RunInfo) -> PlanArgs:
    """`servetune plan`'s arguments for a stored run: its model, catalog hardware and knobs."""
    cfg = info.engine_config
    hw = info.meta.get("hardware") or {}
    return PlanArgs(
        model=info.model or "",
        gpu=hw.get("catalog") or hw.get("gpu") or "cpu-host",  # picture() checks it
        gpus=int(hw.get("gpu_count") or info.gpu_count or 1),
        scenario=None,
        dtype=cfg.get("dtype") or "auto",
        quant=cfg.get("quantization"),
        kv_dtype=cfg.get("kv_cache_dtype"),
        max_model_len=cfg.get("max_model_len"),
        gpu_memory_utilization=cfg.get("gpu_memory_utilization"),
        kv_cache_space=cfg.get("kv_cache_space_gib"),
        block_size=cfg.get("block_size") or 16,
        max_num_seqs=cfg.get("max_num_seqs"),
        max_num_batched_tokens=cfg.get("max_num_batched_tokens"),
        tp=cfg.get("tensor_parallel_size"),
        pp=cfg.get("pipeline_parallel_size") or 1,
        enforce_eager=bool(cfg.get("enforce_eager")),
        engine=cfg.get("engine") or info.engine or "vllm",
    )


def llamacpp_context(cfg: EngineConfig, launch: Any = None) -> tuple[int | None, int, bool]:
    """(-c tokens or None for the model's context, slots, unified) as llama-server is
    started: from the recorded launch command when it is llama-server's, else from the
    adapter's command for `cfg`. `-np` not given is llama-server's auto: 4 slots sharing
    one pool (tools/server/server.cpp turns --kv-unified on with it)."""
    argv = shlex.split(launch) if isinstance(launch, str) else list(launch or [])
    if not any(a == "-c" or a == "-np" or a.endswith("llama-server") for a in argv):
        argv = llamacpp.build(cfg, "model.gguf").argv
    ctx, slots = extra_flag(argv, "-c", "--ctx-size"), extra_flag(argv, "-np", "--parallel")
    unified = "--kv-unified" in argv or "-kvu" in argv or slots is None
    n_ctx = int(ctx) if ctx is not None and int(ctx) > 0 else None
    return n_ctx, int(slots) if slots else LLAMACPP_DEFAULT_SLOTS, unified


def kv_pool_tokens(info: RunInfo, planned: int) -> tuple[int, str]:
    """The KV tokens a config held and where the figure comes from: a simulated run's own
    pool (its blocks x block size, the null block left out, as the simulator ran it),
    else the plan's."""
    blocks = info.target.kv_blocks if info.backend == "sim" else None
    if not blocks:
        return planned, "plan"
    size = info.engine_config.get("block_size") or 16
    return blocks * size, f"the simulated pool: {blocks:,} blocks x {size}"


def picture(info: RunInfo, config: str) -> MemoryPicture:
    """The memory picture of the run's config (raises InputError when the plan cannot
    be made: model or hardware not in the catalog)."""
    engine = info.engine_config.get("engine") or info.engine or "vllm"
    hw = info.meta.get("hardware") or {}
    if not info.model:
        raise InputError("model", "not recorded with the run")
    if not (hw.get("catalog") or hw.get("gpu")) and engine != "llamacpp":
        raise InputError("hardware", "no GPU recorded with the run")
    plan = plan_to_json(run_plan(plan_args(info)))
    if engine != "llamacpp":
        kv_tokens, kv_source = kv_pool_tokens(info, plan["kv_capacity_tokens"])
        return MemoryPicture(
            config,
            engine,
            parts={
                "weights": plan["weights_per_gpu_bytes"],
                "activation": plan["activation_bytes"],
                "overhead": plan["overhead_bytes"],
                "KV cache pool": plan["kv_pool_bytes"],
            },
            device_bytes=plan["device_bytes"],
            kv_tokens=kv_tokens,
            max_concurrency=plan["max_concurrency"],
            rule=f"{engine}: the KV pool is what `servetune plan` leaves of the memory "
            "budget (gpu_memory_utilization x device, or the CPU KV space) after weights, "
            "activation and overheads",
            detail=f"{kv_tokens:,} KV tokens ({kv_source}), max concurrency "
            + (
                f"{plan['max_concurrency']} (plan)"
                if plan["max_concurrency"] is not None
                else f"none: the plan says it does not fit ({plan['verdict']})"
            ),
        )
    cfg = EngineConfig.model_validate(
        {k: v for k, v in info.engine_config.items() if v is not None}
    )
    n_ctx, slots, unified = llamacpp_context(cfg, info.meta.get("launch_command"))
    tokens = n_ctx or plan["max_model_len"]
    share = _KV_TYPE_SHARE.get(cfg.kv_cache_dtype, 1.0)
    per_token = plan["kv_bytes_per_token_per_gpu"] * share
    split = "shared by" if unified else f"{tokens // slots:,} tokens each for"
    given = f"-c {n_ctx:,}" if n_ctx else f"no -c: the model's context, {tokens:,} tokens"
    return MemoryPicture(
        config,
        engine,
        parts={"weights": plan["weights_per_gpu_bytes"], "KV cache pool": tokens * per_token},
        device_bytes=plan["device_bytes"],
        kv_tokens=tokens,
        max_concurrency=slots,
        rule="llama.cpp: the KV cache is -c tokens split over the -np slots, x the plan's "
        "bytes per token; it takes no share of free memory (compute buffers not shown)",
        detail=f"{given}, {split} {slots} slots, x {per_token:,.0f} bytes per token",
    )


def pictures(
    configs: list[tuple[str, RunInfo]], limit: int = 8
) -> tuple[list[MemoryPicture], list[str]]:
    """The pictures of up to `limit` configs, and one note per reason some have none
    (naming how many configs it applies to, never one line per run)."""
    out: list[MemoryPicture] = []
    why: dict[str, list[str]] = {}
    for name, info in configs[:limit]:
        try:
            out.append(picture(info, name))
        except InputError as exc:
            why.setdefault(exc.one_line(), []).append(name)
    notes = [
        f"no memory picture for {len(names)} config(s) ({names[0]}...): {reason}"
        if len(names) > 1
        else f"no memory picture for {names[0]}: {reason}"
        for reason, names in why.items()
    ]
    if len(configs) > limit:
        notes.append(f"the first {limit} of {len(configs)} configs are shown")
    return out, notes


MEMORY_COLORS = {
    "weights": "#1f77b4",
    "activation": "#ff7f0e",
    "overhead": "#7f7f7f",
    "KV cache pool": "#2ca02c",
}


def memory(data: ReportData) -> Chart:
    """Memory per GPU (or the host) of each config, by its engine's rule for the KV cache
    (`picture`: vLLM from `plan`, llama.cpp from -c and its slots)."""
    chart = Chart("memory", "Memory per config (the engine's own KV rule)")
    configs = [(name, data.series[name][0].info) for name in data.ordered()]
    pics, notes = pictures(configs)
    if not pics:
        chart.note = "No memory picture: " + "; ".join(notes)
        return chart
    go = _go()
    labels = [p.config for p in pics]
    details = [p.detail for p in pics]
    fig = go.Figure()
    for part, color in MEMORY_COLORS.items():
        xs = [p.parts.get(part) for p in pics]
        if all(x is None for x in xs):
            continue
        fig.add_trace(
            go.Bar(
                y=labels,
                x=[(x or 0) / GIB for x in xs],
                orientation="h",
                name=part,
                marker_color=color,
                customdata=details,
                hovertemplate="%{y}<br>%{x:.3f} GiB<br>%{customdata}<extra>" + part + "</extra>",
            )
        )
    free = [p.free_bytes for p in pics]
    if any(f is not None for f in free):
        fig.add_trace(
            go.Bar(
                y=labels,
                x=[(f or 0) / GIB for f in free],
                orientation="h",
                name="not taken by the engine",
                marker_color="#dddddd",
                visible="legendonly",
            )
        )
    fig.update_layout(barmode="stack", bargap=0.35)
    fig.update_xaxes(title_text="GiB per GPU (or host)")
    fig.update_yaxes(autorange="reversed", automargin=True)
    chart.fig = _layout(fig, 160 + 40 * len(pics))
    first = pics[0]
    chart.note = " ".join(
        [
            *(f"{r}." for r in dict.fromkeys(p.rule for p in pics)),
            f"{first.config}: {first.detail} (each config's in its hover).",
            *(f"{n[0].upper()}{n[1:]}." for n in notes),
            "Memory not taken by the engine: click its legend entry.",
        ]
    )
    return chart
