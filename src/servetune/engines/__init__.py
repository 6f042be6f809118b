"""Inference engines: the canonical EngineConfig and one adapter module per engine."""

from servetune.engines.config import ENGINES, EngineConfig

__all__ = ["ENGINES", "EngineConfig"]
