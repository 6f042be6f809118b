"""Engines left running in the background (`engine launch --detach`), and the small state
file that lets `engine ps` and `engine stop` find them again from another shell.

The file lives in servetune's cache (per user), one JSON list under an flock. An entry
names its engine by group-leader PID *and* start time, so a PID the kernel has since
given to another process is never signalled. Stopping reuses the launcher's group
termination (SIGTERM, SIGKILL after a grace period, checked by PID), so nothing a
detached engine started is left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from servetune.engines.process import (
    RUN_DIRS_KEPT,
    EngineError,
    EngineServer,
    engine_pids,
    leader_pids,
    prune_run_dirs,
    still_running,
    terminate_group,
)
from servetune.errors import InputError
from servetune.paths import cache_root


def state_dir() -> Path:
    """Where detached engines are recorded, with one run dir (log, launch files) each."""
    return cache_root() / "state"


def state_file() -> Path:
    return state_dir() / "engines.json"


@dataclass(frozen=True)
class Detached:
    """One background engine: what `engine ps` shows and what `engine stop` needs."""

    id: str
    engine: str
    model: str
    url: str
    pid: int
    start_ticks: int  # the leader's start time, /proc/PID/stat field 22
    started_at: float  # epoch seconds, for the uptime
    log: str
    # (pid, start ticks) of every process it had when it became ready, so a worker that
    # left the group is still found after the leader died and it was re-parented.
    pids: tuple[tuple[int, int], ...] = ()

    def live_pids(self) -> set[int]:
        """Its live processes: the leader, its group and descendants, and any process known
        at launch that still runs (same start time); empty once it is all gone."""
        return still_running(self.pids) | set(leader_pids(self.pid, self.start_ticks))

    def state(self) -> str:
        """alive, dead, or - when the leader died but workers linger - how many are left."""
        left = self.live_pids()
        if self.pid in left:
            return "alive"
        return f"leader dead, {len(left)} left" if left else "dead"


def _read(path: Path) -> list[Detached]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    try:
        rows = json.loads(text or "[]")
        return [_row(r) for r in rows]
    except (ValueError, TypeError) as exc:
        raise InputError(
            str(path),
            f"unreadable detached-engine state ({exc})",
            "delete the file; engines it listed keep running (find them with ps -ef)",
        ) from None


_TYPES = {"id": str, "engine": str, "model": str, "url": str, "log": str, "pid": int,
          "start_ticks": int, "started_at": (int, float)}  # fmt: skip


def _row(r: dict) -> Detached:
    """One recorded engine, its fields of the types `engine ps` and `stop` compute with
    (a hand-edited `started_at: "x"` was a TypeError traceback in the uptime's sum)."""
    for name, kind in _TYPES.items():
        if name in r and (isinstance(r[name], bool) or not isinstance(r[name], kind)):
            raise TypeError(f"{name} {r[name]!r} is not a {getattr(kind, '__name__', 'number')}")
    pids = tuple(tuple(p) for p in r.get("pids", ()))
    if not all(len(p) == 2 and all(isinstance(x, int) for x in p) for p in pids):
        raise TypeError(f"pids {r.get('pids')!r} are not [pid, start ticks] pairs")
    return Detached(**{**r, "pids": pids})


def _write(path: Path, entries: list[Detached]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(e) for e in entries], indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _locked() -> Iterator[list[Detached]]:
    """The entries, for a read-modify-write that no other servetune interleaves with;
    whatever the caller leaves in the list is written back."""
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = _read(path)
        before = list(entries)
        yield entries
        if entries != before:
            _write(path, entries)


def entries() -> list[Detached]:
    """Every recorded detached engine, live or dead, oldest first."""
    with _locked() as found:
        return list(found)


def new_run_dir(engine: str) -> tuple[str, Path]:
    """A fresh id and its run dir (claimed by creating it). Kept apart from the launcher's
    runs/ so a tuning study's pruning never deletes a live engine's log; the pruning here
    spares every recorded engine's dir too: a long-running engine's is the oldest, and
    a dead one's log, still listed by `engine ps`, says why it died. `engine stop` leaves
    the dir (its log may be wanted) for a later prune."""
    root = state_dir() / "runs"
    root.mkdir(parents=True, exist_ok=True)
    prune_run_dirs(root, keep=RUN_DIRS_KEPT, spare={Path(e.log).parent for e in entries()})
    while True:
        run_id = f"{engine}-{secrets.token_hex(2)}"
        with contextlib.suppress(FileExistsError):
            (root / run_id).mkdir()
            return run_id, root / run_id


def record(run_id: str, srv: EngineServer) -> Detached:
    """Write a ready engine to the state file (the caller then detaches it)."""
    pids = engine_pids(srv.pid, srv.pid)
    if srv.pid not in pids:
        raise EngineError(srv.engine, "crash", "exited right after it became ready")
    entry = Detached(
        id=run_id,
        engine=srv.engine,
        model=srv.model,
        url=srv.url,
        pid=srv.pid,
        start_ticks=pids[srv.pid],
        started_at=time.time() - (time.monotonic() - srv.started_at),
        log=str(srv.log_path),
        pids=tuple(sorted(pids.items())),
    )
    with _locked() as found:
        found.append(entry)
    return entry


def select(ids: list[str], every: bool) -> list[Detached]:
    """The entries `engine stop` acts on; a one-line error for an unknown id or none."""
    known = entries()
    if every and ids:
        raise InputError("engine stop", "give engine ids or --all, not both")
    if every:
        if not known:
            raise InputError(
                "engine stop --all", "nothing to stop", "no detached engines are recorded"
            )
        return known
    if not ids:
        raise InputError("engine stop", "no engine id given", "an id from `servetune engine ps`")
    by_id = {e.id: e for e in known}
    for run_id in ids:
        if run_id not in by_id:
            listed = ", ".join(by_id) or "none"
            raise InputError("engine stop", f"unknown id {run_id!r}", f"recorded ids: {listed}")
    return [by_id[i] for i in dict.fromkeys(ids)]


def stop(entry: Detached, grace_s: float) -> bool:
    """Stop one detached engine and drop its entry. True if it was running, False if it
    had already died (a stale entry, only cleaned). Keeps the entry if anything survives."""
    was_alive = bool(entry.live_pids())
    # Its group, unless the leader's PID now names another process (then the old group is
    # empty: Linux never reuses a PID whose group still has members).
    group = entry.pid if leader_pids(entry.pid, entry.start_ticks) else None
    survivors = terminate_group(group, entry.live_pids, grace_s) if was_alive else set()
    if survivors:
        raise EngineError(
            entry.engine, "crash", f"{entry.id}: processes {sorted(survivors)} survived SIGKILL"
        )
    with _locked() as found:
        found[:] = [e for e in found if e.id != entry.id]
    return was_alive


def format_uptime(seconds: float) -> str:
    """Compact uptime like `ps`: 42s, 3m07s, 2h05m, 1d02h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
