"""Which of servetune's YAML inputs a mapping reads as. A file given to the wrong flag (an
SLO to --workload, a tune preset to --slo) is named for what it is and the flag that
takes it, instead of "unknown key 'ttft_ms'" with a fix offering the expected file's keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servetune.errors import InputError


def _kinds() -> dict[str, tuple[str, frozenset[str]]]:
    """kind -> (the flag that takes it, its top-level keys); imported late: the models
    import this module's callers."""
    from servetune.slo import SLO
    from servetune.tune.preset import Preset
    from servetune.tune.space import SPACE_KEYS
    from servetune.workload.spec import SHORTHAND_KEYS, WorkloadSpec

    return {
        "workload": ("--workload", frozenset(WorkloadSpec.model_fields) | set(SHORTHAND_KEYS)),
        "SLO": ("--slo", frozenset(SLO.model_fields)),
        "tune preset": ("--preset", frozenset(Preset.model_fields)),
        "search space": ("--space", frozenset(SPACE_KEYS)),
    }


def check_kind(data: Mapping[Any, Any], expected: str, field: str) -> None:
    """InputError naming the kind(s) `data` reads as when a key is not `expected`'s and
    every key is another kind's; otherwise nothing (a typo is the caller's to name)."""
    kinds = _kinds()
    keys = {str(k) for k in data}
    if not keys or keys <= kinds[expected][1]:
        return
    others = [k for k, (_, own) in kinds.items() if k != expected and keys <= own]
    if not others:
        return
    shown = ", ".join(sorted(keys)[:4]) + (", ..." if len(keys) > 4 else "")
    as_what = " or ".join(f"{_article(k)} {k} file" for k in others)
    take = " or ".join(kinds[k][0] for k in others)
    raise InputError(
        field,
        f"this reads as {as_what}, not {_article(expected)} {expected} (keys: {shown})",
        f"give it with {take}",
    )


def _article(kind: str) -> str:
    return "an" if kind[0] in "AEIOSaeio" else "a"  # an SLO, a search space
