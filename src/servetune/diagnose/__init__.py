"""`servetune diagnose`: a run (or a live deployment) in, seed 003 §13's symptoms and the
seeds' ordered actions out, each with the numbers that triggered it and a knob with a next
value (docs/diagnose.md). Rules are pure functions over `Evidence` (diagnose.rules)."""

from servetune.diagnose.evidence import Evidence, from_result, from_window
from servetune.diagnose.rules import Action, Finding, diagnose
from servetune.diagnose.run import Diagnosis, diagnose_result, load_run, render, watch

__all__ = [
    "Action",
    "Diagnosis",
    "Evidence",
    "Finding",
    "diagnose",
    "diagnose_result",
    "from_result",
    "from_window",
    "load_run",
    "render",
    "watch",
]
