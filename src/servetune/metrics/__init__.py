"""Pure metric functions over raw request records (the contract: docs/metrics.md)."""

from servetune.metrics.compute import (
    cap_note,
    client_warnings,
    compute_metrics,
    measurement_window,
    resent_note,
    schedule_note,
    token_count_note,
    tpot_note,
    window_note,
)
from servetune.metrics.stats import ks_exponential, summarize

__all__ = [
    "cap_note",
    "client_warnings",
    "compute_metrics",
    "ks_exponential",
    "measurement_window",
    "resent_note",
    "schedule_note",
    "summarize",
    "token_count_note",
    "tpot_note",
    "window_note",
]
