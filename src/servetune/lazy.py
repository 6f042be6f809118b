"""Package exports that load on first use (PEP 562 module `__getattr__`).

A package's `__init__` names its public API in `__all__` without importing the modules
behind it: `servetune --help`, bench's worker processes and the planner must not pay for
pydantic models, numpy or plotly they never touch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` serving each name in `where` (name -> the
    module, relative to `package`, that defines it) from that module on first access."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
