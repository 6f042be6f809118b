"""An engine's extra arguments (`EngineConfig.extra_args`, flags with no canonical knob that
the adapter passes to the engine as they are), read by the planner and the simulator where
they change what is sized or scheduled (SGLang's pool split, its scheduler's ratios)."""

from __future__ import annotations

from servetune.errors import InputError


def extra_given(args: tuple[str, ...], name: str) -> bool:
    """Whether `name` is among an engine's extra arguments, alone or as `--x=v`."""
    return any(a == name or a.startswith(name + "=") for a in args)


def extra_flag(args: tuple[str, ...], name: str) -> str | None:
    """The value of `name` among an engine's extra arguments (`--x v` or `--x=v`); None
    when absent."""
    for k, a in enumerate(args):
        if a == name and k + 1 < len(args):
            return args[k + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def extra_number(args: tuple[str, ...], name: str, default: float) -> float:
    """A positive number given as an extra flag, else `default`; one-line errors."""
    raw = extra_flag(args, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InputError("extra_args", f"{name} {raw!r} is not a positive number", None)
    return value
