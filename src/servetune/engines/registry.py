"""Engine name -> adapter module, and `launch_commands` (what the planner prints)."""

from __future__ import annotations

from types import ModuleType

from servetune.engines import hf_serve, llamacpp, mlx, onnx_rt, sglang, tgi, trtllm, vllm
from servetune.engines.base import Device, LaunchSpec, PlannedPool
from servetune.engines.config import ENGINES, EngineConfig
from servetune.errors import InputError, closest

ADAPTERS: dict[str, ModuleType] = {
    "vllm": vllm,
    "sglang": sglang,
    "tgi": tgi,
    "trtllm": trtllm,
    "llamacpp": llamacpp,
    # Launched and benchmarked here, but not a seed engine of the planner or simulator:
    # `launch_commands` (what `plan` prints) stays with ENGINES.
    "mlx": mlx,
    "transformers": hf_serve,
    "onnx": onnx_rt,
}
assert tuple(ADAPTERS)[: len(ENGINES)] == ENGINES


def adapter(engine: str) -> ModuleType:
    """The adapter module for `engine`, or a one-line error naming the close ones."""
    try:
        return ADAPTERS[engine]
    except KeyError:
        near = closest(engine, ADAPTERS)
        # every engine it has an adapter for (mlx, transformers and onnx were left out,
        # and they run)
        hint = f"did you mean {', '.join(near)}?" if near else f"one of {', '.join(ADAPTERS)}"
        raise InputError("engine", f"unknown engine {engine!r}", hint) from None


def exports_metrics(engine: str) -> bool:
    """Whether servetune reads `engine`'s own metrics (a Prometheus /metrics it maps to
    canonical names). Without them every figure of a run is client-side: the load
    client's clocks and token counts, nothing from the server."""
    mod = adapter(engine)
    return bool(mod.METRICS or mod.HISTOGRAMS)


def launch_command(
    engine: str,
    cfg: EngineConfig,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    device: Device = "gpu",
    prefix: list[str] | None = None,
    pool: PlannedPool | None = None,
) -> LaunchSpec:
    """One engine's launch command from the canonical config (and the planned KV pool,
    when a plan sized one)."""
    return adapter(engine).build(
        cfg, model, host=host, port=port, device=device, prefix=prefix, pool=pool
    )


def launch_commands(
    cfg: EngineConfig, model: str, *, device: Device = "gpu", pool: PlannedPool | None = None
) -> dict[str, LaunchSpec]:
    """The SAME config as a starting command for every engine (each on its default port)."""
    return {name: launch_command(name, cfg, model, device=device, pool=pool) for name in ENGINES}
