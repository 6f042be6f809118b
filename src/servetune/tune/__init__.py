"""`servetune tune`: the best config under the SLO — a search over engine configs whose
points are measured through `servetune.measure` (simulator, real engine or both), every
trial recorded in the store. Exports load on first use (optuna and ray stay lazy)."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "Tuner": "tuner",
    "TuneSettings": "tuner",
    "TuneOutcome": "tuner",
    "SearchSpace": "space",
    "load_space": "space",
    "parse_space": "space",
    "make_strategy": "strategies",
    "make_executor": "executors",
    "open_study": "study",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
