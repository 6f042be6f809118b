"""Where servetune keeps what it downloads, builds and measures once (engines, models, the
local hardware measurement, the fast mock): one function, so every layer agrees without
importing the engine installer."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """servetune's cache dir ($SERVETUNE_CACHE wins, then XDG, then ~/.cache)."""
    if env := os.environ.get("SERVETUNE_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servetune"
