"""What every engine adapter produces: a `LaunchSpec` (argv + env + files), and the
shared rules for turning canonical knobs into flags.

Adapters are pure: the same EngineConfig gives the same command on any machine.
Machine-specific things (the venv python, cache dirs, a free port) are passed in
by the caller (`engines.process`, the CLI, the planner), never looked up here; so is
the planner's KV pool (`PlannedPool`), for engines that size KV their own way.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from servetune.engines.config import EngineConfig

Device = Literal["gpu", "cpu"]

# Knobs that belong to llama.cpp's slot server; other engines report them as unsupported.
LLAMACPP_ONLY = ("parallel_slots", "batch_size", "ubatch_size", "threads", "kv_unified")
# EngineConfig's own defaults, used to tell "set away from default" (reported when unmapped).
_DEFAULTS = EngineConfig()


@dataclass(frozen=True)
class PlannedPool:
    """The KV pool `servetune plan` sized for one GPU (or the host) of a replica.

    vLLM, SGLang and TGI take a fraction of device memory, which is what the plan is
    computed from; llama.cpp (`-c` tokens) and TensorRT-LLM (a fraction of the memory
    left free after loading) need these figures to size the same pool."""

    kv_tokens: int  # KV capacity in tokens
    kv_bytes: float  # the pool
    free_after_load_bytes: float  # device - weights - activation peak - fixed overheads


@dataclass(frozen=True)
class LaunchSpec:
    """A real, copy-pasteable launch command for one engine.

    `files` are small config files the command reads (name relative to the working
    directory -> text), e.g. TensorRT-LLM's `--config` YAML; `shell()` writes them
    with heredocs so the printed command is complete.
    """

    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def shell(self) -> str:
        """One shell snippet: heredocs for `files`, then `ENV=... argv...`, all shlex-quoted."""
        parts: list[str] = []
        for name, text in self.files.items():
            body = text if text.endswith("\n") else text + "\n"
            parts.append(f"cat > {shlex.quote(name)} <<'EOF'\n{body}EOF")
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        parts.append(f"{prefix} {cmd}" if prefix else cmd)
        return "\n".join(parts)

    def why_unsupported(self, knob: str) -> str | None:
        """None when the engine has a flag for `knob`; else the one-line reason the engine
        gave for having none ("" when it gave none). One reading for every caller that
        refuses such a knob (`--set`, the tuner's space)."""
        if knob not in self.unsupported:
            return None
        return next((n.partition(": ")[2] for n in self.notes if n.startswith(f"{knob}:")), "")

    def write_files(self, directory: Path) -> None:
        """Write `files` into the directory the engine will run in."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (directory / name).write_text(text)


class Adapter(Protocol):
    """One module per engine implements this (see engines/vllm.py etc.)."""

    name: str
    default_port: int
    health_path: str

    def build(
        self,
        cfg: EngineConfig,
        model: str,
        *,
        host: str = ...,
        port: int | None = ...,
        device: Device = ...,
        prefix: Sequence[str] | None = ...,
        pool: PlannedPool | None = ...,
    ) -> LaunchSpec: ...


class FlagBuilder:
    """Collects argv/env/unsupported while an adapter walks the canonical knobs."""

    def __init__(self, cfg: EngineConfig, argv: list[str]) -> None:
        self.cfg = cfg
        self.argv = argv
        self.env: dict[str, str] = {}
        self.unsupported: list[str] = []
        self.notes: list[str] = []
        self.files: dict[str, str] = {}

    def flag(self, name: str, value: object | None = None) -> None:
        self.argv.append(name)
        if value is not None:
            self.argv.append(str(value))

    def map(self, flags: dict[str, str]) -> None:
        """The plain knob -> flag cases, in order: each knob that differs from its
        canonical default adds `flag value` (floats as `fmt_float`); a bool knob adds the
        bare switch (`enforce_eager: "--enforce-eager"`, or a negative flag such as
        `enable_prefix_caching: "--no-enable-prefix-caching"` for a default-on knob)."""
        for knob, name in flags.items():
            value = getattr(self.cfg, knob)
            if value == getattr(_DEFAULTS, knob):
                continue
            if isinstance(value, bool):
                self.flag(name)
            else:
                self.flag(name, fmt_float(value) if isinstance(value, float) else value)

    def unsupported_if_set(self, knob: str, why: str | None = None) -> None:
        """Report `knob` when it differs from the canonical default (nothing to map it to)."""
        if getattr(self.cfg, knob) != getattr(_DEFAULTS, knob):
            self.unsupported.append(knob)
            if why:
                self.notes.append(f"{knob}: {why}")

    def unsupported_knob(self, knob: str, why: str | None = None) -> None:
        self.unsupported.append(knob)
        if why:
            self.notes.append(f"{knob}: {why}")

    def finish(self, engine: str, host: str, port: int) -> LaunchSpec:
        self.argv.extend(self.cfg.extra_args)
        return LaunchSpec(
            engine=engine,
            argv=self.argv,
            env=self.env,
            unsupported=self.unsupported,
            notes=self.notes,
            files=self.files,
            host=host,
            port=port,
        )


def fmt_float(x: float) -> str:
    """Shortest exact-enough text for a float flag (0.9 -> '0.9', 2.0 -> '2')."""
    return f"{x:g}" if float(x) != int(x) else str(int(x))


GIB = 1 << 30

BuildFn = Callable[..., LaunchSpec]
