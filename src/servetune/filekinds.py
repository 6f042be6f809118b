"""Which of servetune's YAML inputs a mapping reads as. A file given to the wrong flag (an
SLO to --workload, a tune preset to --slo) is named for what it is and the flag that
takes it, instead of "unknown key 'ttft_ms'" with a fix offering the expected file's keys.

The key names are listed here, not read from the models, so this module sits below the
loaders that call it (tests/test_filekinds.py checks them against the models' fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servetune.errors import InputError

SPACE_KEYS = ("engine", "knobs", "fixed", "baseline", "constraints")  # a space file's top level

# kind -> (the flag that takes it, its top-level keys)
KINDS: dict[str, tuple[str, frozenset[str]]] = {
    "workload": ("--workload", frozenset({
        "name", "seed", "api", "model", "stream", "count", "duration_s", "warmup_s",
        "cooldown_s", "arrival", "trace", "mix", "sampling", "sessions",
        # the one sub-workload's keys, given at the top (`WorkloadSpec._shorthand`)
        "input_tokens", "output_tokens", "dataset", "prefix", "priority",
    })),
    "SLO": ("--slo", frozenset({
        "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "error_rate", "goodput", "kv_cache_usage_max",
    })),
    "tune preset": ("--preset", frozenset({
        "engine", "model", "model_path", "hardware", "backend", "space", "workload", "slo",
        "slo_from_host", "tune",
    })),
    "search space": ("--space", frozenset(SPACE_KEYS)),
}  # fmt: skip


def check_kind(data: Mapping[Any, Any], expected: str, field: str) -> None:
    """InputError naming the kind(s) `data` reads as when a key is not `expected`'s and
    every key is another kind's; otherwise nothing (a typo is the caller's to name)."""
    keys = {str(k) for k in data}
    if not keys or keys <= KINDS[expected][1]:
        return
    others = [k for k, (_, own) in KINDS.items() if k != expected and keys <= own]
    if not others:
        return
    shown = ", ".join(sorted(keys)[:4]) + (", ..." if len(keys) > 4 else "")
    as_what = " or ".join(f"{_article(k)} {k} file" for k in others)
    take = " or ".join(KINDS[k][0] for k in others)
    raise InputError(
        field,
        f"this reads as {as_what}, not {_article(expected)} {expected} (keys: {shown})",
        f"give it with {take}",
    )


def _article(kind: str) -> str:
    return "an" if kind[0] in "AEIOSaeio" else "a"  # an SLO, a search space
