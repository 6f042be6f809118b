"""The engine simulator: a vLLM-v1 (paged) or llama.cpp (slots) scheduler driven by a
step-time tier (roofline, or a profile calibrated on real runs). Exports load on first
use, so `servetune --help` and the planner do not pay for numpy-heavy modules."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "simulate": "engine",
    "setup": "engine",
    "SimSetup": "engine",
    "capacity_note": "engine",
    "Scheduler": "scheduler",
    "SchedConfig": "scheduler",
    "PagedPolicy": "policies",
    "SlotPolicy": "policies",
    "FcfsQueue": "queues",
    "PriorityQueue": "queues",
    "Phase": "request",
    "SimRequest": "request",
    "StepModel": "steptime",
    "roofline_model": "steptime",
    "calibrated_model": "steptime",
    "Profile": "profile",
    "load_profile": "profile",
    "save_profile": "profile",
    "fit_profile": "calibrate",
    "fit_by_replay": "calibrate",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
