"""`servetune diagnose`: a run (or a live deployment) in, seed 003 §13's symptoms and the
seeds' ordered actions out, each with the numbers that triggered it and a knob with a next
value (docs/diagnose.md). Rules are pure functions over `Evidence` (diagnose.rules)."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "Evidence": "evidence",
    "from_result": "evidence",
    "from_window": "evidence",
    "Action": "rules",
    "Finding": "rules",
    "diagnose": "rules",
    "Diagnosis": "run",
    "diagnose_result": "run",
    "load_run": "run",
    "render": "run",
    "watch": "run",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
