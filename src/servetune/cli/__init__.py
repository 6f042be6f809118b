"""The command line (`servetune ...`): a thin layer that parses options into settings and
calls one entry point per command; `main` runs it (the typer app is `cli.app.app`)."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {"main": "app"}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
