"""What Linux says about processes, read in one place. /proc/PID/stat, for everyone who
must tell a live process from a recycled pid: the store (is a run's writer alive?) and the
engine launcher (which processes belong to an engine?). proc(5) numbers the fields from 1:
pid, (comm), state, ppid, pgrp, ... starttime is field 22, in clock ticks since boot. And
the cores this process may run on, for whoever sizes a pool of workers."""

from __future__ import annotations

import os

__all__ = ["stat_fields", "usable_cores"]


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or `taskset`'s
    limit, not the machine's count); os.cpu_count() where the mask cannot be read."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


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
