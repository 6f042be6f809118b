"""What every engine adapter produces: a `LaunchSpec` (argv + env + files), and the
shared rules for turning canonical knobs into flags.

Adapters are pure: the same EngineConfig gives the same command on any machine.
Machine-specific things (the venv python, cache dirs, a free port) are passed in
by the caller (`engines.process`, the CLI, the planner), never looked up here; so is
the planner's KV pool (`PlannedPool`), for engines that size KV their own way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from servetune.engines.config import EngineConfig
from servetune.errors import InputError

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
    with heredocs so the printed command is complete. `unset_env` names variables an
    inherited environment must not pass on (one that would override a flag).
    """

    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()
    unsupported: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    # every flag a plain knob maps to (`FlagBuilder.map`), emitted or at its default:
    # flag_key -> knob, for `engines.extra.knob_in_extra`
    knob_flags: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """Where a client reaches the engine: a wildcard listen address is reached on
        loopback, and an IPv6 literal is bracketed (RFC 3986 §3.2.2: `::1:8080` is no host)."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://{host_port(host, self.port)}"

    def shell(self) -> str:
        """One shell snippet: heredocs for `files`, then `[env -u NAME] ENV=... argv...`,
        all shlex-quoted: the printed command is the one `engines.process` runs."""
        parts: list[str] = []
        for name, text in self.files.items():
            body = text if text.endswith("\n") else text + "\n"
            parts.append(f"cat > {shlex.quote(name)} <<'EOF'\n{body}EOF")
        unset = ["env", *(f"-u {shlex.quote(k)}" for k in self.unset_env)] if self.unset_env else []
        assign = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        parts.append(" ".join([*unset, *assign, shlex.join(self.argv)]))
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

    def __init__(
        self, cfg: EngineConfig, argv: list[str], aliases: Mapping[str, str] | None = None
    ) -> None:
        self.cfg = cfg
        self.argv = argv
        self.aliases = aliases or {}  # another spelling of a flag -> the one emitted
        self.env: dict[str, str] = {}
        self.unset_env: list[str] = []
        self.unsupported: list[str] = []
        self.notes: list[str] = []
        self.files: dict[str, str] = {}
        self.knobs: dict[str, str] = {}  # flag -> the canonical knob it came from
        self.knob_flags: dict[str, str] = {}  # flag_key -> knob, for every mapped knob

    def flag(self, name: str, value: object | None = None, *, knob: str | None = None) -> None:
        """Add `name [value]`; `knob` names the canonical knob it comes from, for the error
        that refuses an `--extra` repeating it."""
        self.argv.append(name)
        if knob is not None:
            self.knobs[name] = knob
        if value is not None:
            self.argv.append(str(value))

    def map(self, flags: dict[str, str]) -> None:
        """The plain knob -> flag cases, in order: each knob that differs from its
        canonical default adds `flag value` (floats as `fmt_float`); a bool knob adds the
        bare switch (`enforce_eager: "--enforce-eager"`, or a negative flag such as
        `enable_prefix_caching: "--no-enable-prefix-caching"` for a default-on knob)."""
        for knob, name in flags.items():
            self.knob_flags[flag_key(name)] = knob
            value = getattr(self.cfg, knob)
            if value == getattr(_DEFAULTS, knob):
                continue
            if isinstance(value, bool):
                self.flag(name, knob=knob)
            else:
                shown = fmt_float(value) if isinstance(value, float) else value
                self.flag(name, shown, knob=knob)

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
        self.refuse_repeated(self.cfg.extra_args)
        self.argv.extend(self.cfg.extra_args)
        return LaunchSpec(
            engine=engine,
            argv=self.argv,
            env=self.env,
            unset_env=tuple(self.unset_env),
            unsupported=self.unsupported,
            notes=self.notes,
            files=self.files,
            host=host,
            port=port,
            knob_flags=self.knob_flags,
        )

    def refuse_repeated(self, extra: Sequence[str]) -> None:
        """Refuse an `--extra` flag the command already carries (`--max-num-seqs 8` beside
        the one `max_num_seqs` emitted, `--enable-prefix-caching` beside its `--no-` form):
        the engine's parser keeps one of the two, so the config servetune records would
        not be the one served."""

        def key(token: str) -> str:  # `-np`, `--parallel`: one option (`aliases`)
            name = flag_key(token)
            return self.aliases.get(name, name)

        emitted = {key(a): a for a in self.argv if is_flag(a)}
        for token in extra:
            flag = emitted.get(key(token)) if is_flag(token) else None
            if flag is None:
                continue
            knob = self.knobs.get(flag)
            fix = (
                f"set it with --set {knob}=VALUE instead"
                if knob
                else "drop it: servetune sets it (from --model, --host, --port or a --set knob)"
            )
            raise InputError("--extra", f"{token} repeats {flag}, already on the command", fix)


def host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 literal in brackets (`[::1]:8080`): the form a URL (RFC 3986
    §3.2.2) and Rust's SocketAddr parser (onnx-genai's --addr) take."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def is_flag(token: str) -> bool:
    """`--name`, `--name=value` or `-n`; not a negative number given as a value (`-1`)."""
    return re.match(r"--?[A-Za-z]", token) is not None


def flag_key(token: str) -> str:
    """One name for every spelling of a flag: without `=value`, `_` as `-` (vLLM and click
    accept both) and without a `--no-` prefix (the switch and its negation are one option)."""
    name = token.partition("=")[0].replace("_", "-")
    return "--" + name.removeprefix("--no-") if name.startswith("--no-") else name


def fmt_float(x: float) -> str:
    """Shortest exact-enough text for a float flag (0.9 -> '0.9', 2.0 -> '2')."""
    return f"{x:g}" if float(x) != int(x) else str(int(x))


GIB = 1 << 30

BuildFn = Callable[..., LaunchSpec]
