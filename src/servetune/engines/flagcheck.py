"""Check an adapter's command line and metric names against the engine's own definitions.

SGLang, TGI and TensorRT-LLM cannot run on a CPU-only host, so their launch commands
are never parsed by the engine here. Instead each engine's published CLI (flag names,
value types, choices) and Prometheus metric families are checked in as data under
`servetune/data/engine_flags/<engine>.json`, extracted from the engine's own source at
a pinned version (the file names the version, the URL and how it was extracted);
each adapter's `TARGET_VERSION` must match it. `check_argv` and `check_metrics` list
every mismatch; the tests require both lists to be empty for every knob combination.
`transformers serve` runs here and is checked the same way: its file is its installed
`--help` read by `click_help_flags`, and its engine test re-reads the live CLI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import ModuleType
from typing import Any

CHECKED = ("sglang", "tgi", "trtllm", "transformers", "onnx")


@dataclass(frozen=True)
class EngineCli:
    """One engine's published CLI and metric families at one version."""

    engine: str
    version: str
    source: str
    flags: Mapping[str, Mapping[str, Any]]  # "--flag" -> {"type": ..., "choices": [...]}
    metrics: Mapping[str, str]  # family name -> gauge | counter | histogram


@cache
def load(engine: str) -> EngineCli:
    """The checked-in definition for `engine` (one of CHECKED)."""
    path = resources.files("servetune") / "data" / "engine_flags" / f"{engine}.json"
    raw = json.loads(path.read_text("utf-8"))
    return EngineCli(raw["engine"], raw["version"], raw["source"], raw["flags"], raw["metrics"])


# One option line of a click (or typer) command's plain-text --help: "  -h, --help",
# "  --port INTEGER", "  --reasoning [on|off|auto]", "  --compile / --no-compile".
_CLICK_OPTION = re.compile(
    r"^  (?:-\w, )?(?P<names>--[\w-]+(?: / --[\w-]+)?)"
    r"(?: (?P<meta>INTEGER|FLOAT|TEXT|PATH|\[[\w|.-]+\]))?(?:\s{2,}|$)"
)
_CLICK_TYPES = {"INTEGER": "int", "FLOAT": "float", "TEXT": "str", "PATH": "str"}


def click_help_flags(help_text: str) -> dict[str, dict[str, Any]]:
    """A click command's options from its plain `--help` text, in this module's flag
    format: `--on / --off` pairs and bare options are switches, INTEGER/FLOAT/TEXT give
    the type, `[a|b]` the choices. Used for the CLIs that are installed here (e.g.
    `transformers serve`), so the checked-in data and the live CLI compare exactly."""
    flags: dict[str, dict[str, Any]] = {}
    for line in help_text.splitlines():
        m = _CLICK_OPTION.match(line)
        if m is None:
            continue
        meta = m["meta"]
        if meta is None:
            spec: dict[str, Any] = {"type": "switch"}
        elif meta.startswith("["):
            spec = {"type": "str", "choices": meta[1:-1].split("|")}
        else:
            spec = {"type": _CLICK_TYPES[meta]}
        for name in m["names"].split(" / "):
            flags[name] = spec
    return flags


# A long option of a clap (Rust) command's `--help`: "      --max-batch <MAX_BATCH>",
# "  -h, --help", "      --backend <auto|ort|native>"; its "[possible values: a, b]" line.
_CLAP_OPTION = re.compile(r"^ {2,6}(?:-\w, )?(?P<name>--[\w-]+)(?: <(?P<meta>[^>]+)>)?\s*$")
_CLAP_VALUES = re.compile(r"^\s+\[possible values: (?P<values>[^\]]+)\]")


def clap_help_flags(help_text: str) -> dict[str, dict[str, Any]]:
    """A clap command's options from its long `--help` text: a switch, or a flag taking a
    value (`{"type": "value"}`: clap's help names no type) with its choices when listed.
    Used for the CLIs installed here (e.g. `onnx-genai serve`) to compare the checked-in
    data, whose types come from each flag's help, with the live CLI."""
    flags: dict[str, dict[str, Any]] = {}
    last: dict[str, Any] | None = None
    for line in help_text.splitlines():
        if m := _CLAP_OPTION.match(line):
            meta = m["meta"]
            last = {"type": "switch"} if meta is None else {"type": "value"}
            if meta and "|" in meta:
                last["choices"] = meta.split("|")
            flags[m["name"]] = last
        elif (v := _CLAP_VALUES.match(line)) and last is not None:
            last["choices"] = [c.strip() for c in v["values"].split(",")]
    return flags


def _value_error(spec: Mapping[str, Any], value: str) -> str | None:
    """Why `value` is not a valid value for a flag of this spec (None when it is)."""
    kind = spec["type"]
    parts = value.split(",") if spec.get("nargs") == "," else [value]
    for part in parts:
        try:
            if kind == "int":
                int(part)
            elif kind == "float":
                float(part)
            elif kind == "bool" and part.lower() not in ("true", "false"):
                return f"wants true/false, got {part!r}"
        except ValueError:
            return f"wants {kind}, got {part!r}"
        choices = spec.get("choices")
        if choices and part not in choices:
            return f"{part!r} is not one of {', '.join(choices)}"
    return None


def check_argv(cli: EngineCli, argv: Sequence[str]) -> list[str]:
    """Every problem in `argv` against the engine's CLI: unknown flag, a switch given a
    value, a valued flag missing its value, a value of the wrong type or not a choice.
    Tokens before the first `--flag` (executable, module, positional model) are skipped."""
    problems: list[str] = []
    start = next((i for i, tok in enumerate(argv) if tok.startswith("--")), len(argv))
    i = start
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("--"):
            problems.append(f"{tok!r}: a value with no flag before it")
            continue
        name, eq, inline = tok.partition("=")
        spec = cli.flags.get(name)
        if spec is None:
            problems.append(f"{name}: no such flag in {cli.engine} {cli.version}")
            if not eq and i < len(argv) and not argv[i].startswith("--"):
                i += 1  # its value, reported once with the flag
            continue
        if spec["type"] == "switch":
            if eq:
                problems.append(f"{name}: a switch, takes no value")
            continue
        if eq:
            value = inline
        elif i < len(argv) and not argv[i].startswith("--"):
            value, i = argv[i], i + 1
        else:
            problems.append(f"{name}: needs a {spec['type']} value")
            continue
        if why := _value_error(spec, value):
            problems.append(f"{name}: {why}")
    return problems


def _family(name: str) -> str:
    """Prometheus family name: counters are exported with or without `_total`."""
    return name.removesuffix("_total")


def check_metrics(cli: EngineCli, adapter: ModuleType) -> list[str]:
    """Every canonical-map entry of `adapter` (METRICS, HISTOGRAMS) whose source name the
    engine does not export, or exports as another kind: canonical `*_total` names must be
    counters, other METRICS gauges, HISTOGRAMS histograms. The name must be the one
    exported: the scrape parser takes a counter with or without `_total`, but PromQL
    (monitor's rules) matches it exactly, and an exporter that adds no suffix (TGI) left
    a rule that never had data."""
    kinds = {_family(name): kind for name, kind in cli.metrics.items()}
    exported = {_family(name): name for name in cli.metrics}
    problems: list[str] = []
    wanted = [
        (canon, src, "counter" if canon.endswith("_total") else "gauge")
        for canon, src in adapter.METRICS.items()
    ] + [(canon, src, "histogram") for canon, src in adapter.HISTOGRAMS.items()]
    for canon, src, want in wanted:
        got = kinds.get(_family(src))
        if got is None:
            problems.append(f"{canon}: {src} is not a {cli.engine} {cli.version} metric")
        elif got != want:
            problems.append(f"{canon}: {src} is a {got} in {cli.engine}, not a {want}")
        elif src not in cli.metrics:
            problems.append(f"{canon}: {cli.engine} exports {src} as {exported[_family(src)]}")
    return problems
