"""An engine's extra arguments (`EngineConfig.extra_args`, flags with no canonical knob that
the adapter passes to the engine as they are), read by the planner and the simulator where
they change what is sized or scheduled (SGLang's pool split, its scheduler's ratios); the
same reading serves a recorded launch command (the report's llama.cpp context)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.engines.base import Device
    from servetune.engines.config import EngineConfig


def split_extra(extra: str, engine: str | None = None) -> tuple[str, ...]:
    """`--extra`'s text as shell words; an unclosed quote is a one-line error, not
    shlex's ValueError traceback. For an engine whose CLI is checked in as data
    (`flagcheck.CHECKED`: SGLang, TGI, TensorRT-LLM, ...), the words are checked against
    it: `plan --engine sglang --extra '--bogus 1'` printed a launch command SGLang would
    refuse, and `simulate` ran it."""
    try:
        words = tuple(shlex.split(extra))
    except ValueError as exc:
        raise InputError("--extra", f"cannot split {extra!r}: {exc}", "close the quote") from None
    from servetune.engines import flagcheck

    if engine in flagcheck.CHECKED:
        cli = flagcheck.load(engine)
        problems = flagcheck.check_argv(cli, words)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise InputError(
                "--extra", problems[0] + more, f"see {engine} {cli.version}'s own --help"
            )
    return words


def extra_given(args: tuple[str, ...], name: str) -> bool:
    """Whether `name` is among an engine's extra arguments, alone or as `--x=v`."""
    return any(a == name or a.startswith(name + "=") for a in args)


def extra_flag(args: Sequence[str], *names: str) -> str | None:
    """The value of the first of `names` (a flag's spellings: `-c`, `--ctx-size`) among an
    engine's arguments (`--x v` or `--x=v`); None when absent."""
    for k, a in enumerate(args):
        if a in names and k + 1 < len(args):
            return args[k + 1]
        if any(a.startswith(name + "=") for name in names):
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


def knob_in_extra(cfg: EngineConfig, device: Device = "gpu") -> tuple[str, str] | None:
    """The first extra argument that is a canonical knob's own flag, and that knob
    (`--tp-size` is tensor_parallel_size for SGLang); None when there is none. The planner
    and the simulator read the knob, so such a flag would change what the engine runs and
    not what they size: SGLang at TP1 was simulated under `--extra '--tp-size 2'`. A knob
    at its default emits no flag, which is why the launch command's refusal of a repeated
    flag (`FlagBuilder.refuse_repeated`) let it through."""
    if not cfg.extra_args:
        return None
    from servetune.engines.base import flag_key, is_flag
    from servetune.engines.registry import launch_command

    spec = launch_command(cfg.engine, cfg.with_(extra_args=()), "model", device=device)
    for token in cfg.extra_args:
        knob = spec.knob_flags.get(flag_key(token)) if is_flag(token) else None
        if knob is not None:
            return token, knob
    return None
