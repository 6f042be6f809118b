"""Linux /proc/PID/stat, read once for everyone who must tell a live process from a
recycled pid: the store (is a run's writer alive?) and the engine launcher (which
processes belong to an engine?). proc(5) numbers the fields from 1: pid, (comm), state,
ppid, pgrp, ... starttime is field 22, in clock ticks since boot."""

from __future__ import annotations

__all__ = ["stat_fields"]


def stat_fields(pid: int | str) -> list[str] | None:
    """Fields 3 onward of /proc/PID/stat (so [0] is the state, [1] ppid, [2] pgrp, [19]
    starttime), or None when the process is gone or a zombie (killed, not yet reaped).
    The command name may hold spaces and parentheses: the split starts after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields
