"""The status words servetune writes and reads, one vocabulary per thing that has a status.

Each is a str-valued enum: a member equals, hashes and serialises as its value, so the
strings stored by earlier versions compare equal to the members and read back unchanged.
A bottom-layer module that imports nothing: bench's worker processes, which keep their
imports light, use it too.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A str enum that prints as its value, like Python 3.11's `enum.StrEnum` (servetune
    supports 3.10): f-strings, `str()` and JSON all give the bare word."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RequestStatus(StrEnum):
    """How one request ended (RequestRecord.status)."""

    OK = "ok"  # completed normally
    ERROR = "error"  # failed; RequestRecord.error names the class (ERROR_CLASSES)
    CANCELLED = "cancelled"  # cancelled by the client on purpose (a cancellation test)
    ABORTED = "aborted"  # still in flight when the run stopped


class RunStatus(StrEnum):
    """Where a run stands (RunResult.status, the store's run rows)."""

    RUNNING = "running"  # the writer is still measuring (store only)
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"  # stopped by the user (Ctrl-C) or a study's stop
    CIRCUIT_BREAKER = "circuit_breaker"  # stopped early: too many errors in a row
    SLO_MISSED = "slo_missed"  # stopped early: its SLO miss was decided (a tuner's probe)
    FAILED = "failed"  # could not measure (engine would not start or died)
    INCOMPLETE = "incomplete"  # the writer died before finishing (store only)


class TrialStatus(StrEnum):
    """What a tuning trial found for its config (TrialResult.status)."""

    OK = "ok"  # measured; some load point met the SLO
    NO_SLO = "no_slo"  # measured; no load point met the SLO
    INFEASIBLE = "infeasible"  # the engine would not start or died under load
    SKIPPED = "skipped"  # the planner or simulator proved it cannot run; never launched
