"""Inference engines: the canonical EngineConfig and one adapter module per engine.

The adapters (and the registry that imports all five) load on first use, so code that
only needs EngineConfig -- the simulator, the planner -- does not pay for them."""

from servetune.engines.config import ENGINES, EngineConfig
from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {"LaunchSpec": "base", "launch_command": "registry", "launch_commands": "registry"}
__all__ = ["ENGINES", "EngineConfig", *_WHERE]
__getattr__ = _lazy_exports(__name__, _WHERE)
