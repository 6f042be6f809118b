"""Is a run's writer still alive? A writer notes its host, pid and the kernel's start time
of that pid (so a recycled pid is not mistaken for it); on the same host /proc answers,
elsewhere a heartbeat older than STALE_AFTER_S does. A "running" run whose writer is gone
is incomplete, whatever its row says."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from pathlib import Path

from servetune.procfs import stat_fields
from servetune.status import RunStatus

STALE_AFTER_S = 900  # a running run silent this long on another host counts as dead


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (so a recycled pid is not mistaken for ours)."""
    fields = stat_fields(pid)
    return None if fields is None else fields[19]  # starttime (procfs.stat_fields)


def writer_token() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start(pid) or 0}"


def writer_alive(token: str | None) -> bool | None:
    """True/False for a writer on this host; None when it cannot be told (other host)."""
    if not token or token.count(":") < 2:
        return None
    host, pid, start = token.rsplit(":", 2)
    if host != socket.gethostname() or not Path("/proc").is_dir():
        return None
    return _proc_start(int(pid)) == start


def effective_status(status: str, writer: str | None, updated_utc: str, now: datetime) -> RunStatus:
    """A "running" run whose writer is gone is incomplete, whatever the row says."""
    if status != RunStatus.RUNNING:
        return RunStatus(status)
    alive = writer_alive(writer)
    if alive is False:
        return RunStatus.INCOMPLETE
    if alive is None:
        beat = datetime.fromisoformat(updated_utc.replace("Z", "+00:00"))
        if now - beat > timedelta(seconds=STALE_AFTER_S):
            return RunStatus.INCOMPLETE
    return RunStatus.RUNNING
