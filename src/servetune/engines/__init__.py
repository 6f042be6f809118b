"""Inference engines: the canonical EngineConfig and one adapter module per engine.

The adapters (and the registry that imports all five) load on first use, so code that
only needs EngineConfig -- the simulator, the planner -- does not pay for them."""

from typing import Any

from servetune.engines.config import ENGINES, EngineConfig

__all__ = ["ENGINES", "EngineConfig", "LaunchSpec", "launch_command", "launch_commands"]


def __getattr__(name: str) -> Any:
    if name == "LaunchSpec":
        from servetune.engines.base import LaunchSpec

        return LaunchSpec
    if name in ("launch_command", "launch_commands"):
        from servetune.engines import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'servetune.engines' has no attribute {name!r}")
