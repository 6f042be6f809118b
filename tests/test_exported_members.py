"""Each package's public names are pinned: `__all__` lists exactly what its __init__
defines for export (names it imports from servetune modules or defines itself, plus any
it serves lazily through a module `__getattr__`), once each, and every listed name
resolves. A name added to a package without `__all__`, or listed but gone, fails here."""

from __future__ import annotations
import __future__

import importlib
import pkgutil
from types import ModuleType

import pytest

import servetune


def packages() -> list[str]:
    """servetune and every package below it."""
    found = [
        m.name
        for m in pkgutil.walk_packages(servetune.__path__, "servetune.")
        if m.ispkg and "migrations" not in m.name.split(".")  # alembic's, not ours
    ]
    return ["servetune", *sorted(found)]


def defined_for_export(module: ModuleType) -> set[str]:
    """Public attributes of the package itself (and `__version__`): not submodules, not
    `from __future__` features, not names imported from outside servetune (typing.Any)."""
    out = set()
    for name, value in vars(module).items():
        private = name.startswith("_") and name != "__version__"
        if private or isinstance(value, (ModuleType, __future__._Feature)):
            continue
        origin = getattr(value, "__module__", None)
        if isinstance(origin, str) and not origin.startswith("servetune"):
            continue
        out.add(name)
    return out


def test_every_package_is_checked() -> None:
    names = packages()
    assert {"servetune.store", "servetune.results", "servetune.report", "servetune.mock"} <= set(
        names
    )
    assert "servetune.cli" in names and len(names) >= 15


@pytest.mark.parametrize("name", packages())
def test_all_lists_exactly_the_exported_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__dict__.get("__all__")
    assert isinstance(exported, list), f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    lazy = {n for n in exported if n not in vars(module)}
    for n in exported:
        value = getattr(module, n)
        assert value is not None, f"{name}.{n} does not resolve"
        # a submodule of the same name replaces a lazily served attribute once imported
        assert not isinstance(value, ModuleType), f"{name}.{n} is a module, not the export"
    assert set(exported) == defined_for_export(module) | lazy


def test_the_check_catches_an_unlisted_name() -> None:
    fake = ModuleType("servetune.fake")
    exec(
        "from __future__ import annotations\n"
        "from typing import Any\n"
        "from servetune.errors import InputError\n"
        "def helper() -> Any: ...\n",
        vars(fake),
    )
    assert defined_for_export(fake) == {"InputError", "helper"}
