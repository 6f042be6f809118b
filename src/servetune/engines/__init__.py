"""Inference engines: the canonical EngineConfig and one adapter module per engine."""

from servetune.engines.base import LaunchSpec
from servetune.engines.config import ENGINES, EngineConfig
from servetune.engines.registry import launch_command, launch_commands

__all__ = ["ENGINES", "EngineConfig", "LaunchSpec", "launch_command", "launch_commands"]
