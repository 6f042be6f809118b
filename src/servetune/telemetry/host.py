"""Host and engine-process samples from psutil and /proc: CPU per core (busy, steal),
memory, and the engine's process tree (CPU cores used, RSS, time its threads waited for a
CPU). Rates are deltas between two reads, so the first read of a source returns only
gauges (memory) and primes the counters.

The maths is in small pure functions; `HostSource` holds the previous read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

TREE_REFRESH_S = 5.0

# proc(5): /proc/stat's cpu fields; guest and guest_nice are already inside user and nice,
# so they are left out of the total.
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def core_shares(prev: Any, cur: Any) -> tuple[float, float]:
    """(busy, steal) fractions of one core between two psutil `cpu_times` reads. Busy is
    everything but idle and iowait, steal included (time the hypervisor gave elsewhere)."""
    d = {f: getattr(cur, f, 0.0) - getattr(prev, f, 0.0) for f in _CPU_FIELDS}
    total = sum(d.values())
    if total <= 0:
        return 0.0, 0.0
    return 1.0 - (d["idle"] + d["iowait"]) / total, d["steal"] / total


def tree_delta(prev: Mapping[int, float], cur: Mapping[int, float]) -> float:
    """What a set of processes added to a cumulative counter: per pid, for pids seen in both
    reads (a process that started or ended between them is counted from its next read)."""
    return sum(max(0.0, v - prev[pid]) for pid, v in cur.items() if pid in prev)


def read_runq_wait_s(pids: Iterable[int]) -> dict[int, float]:
    """pid -> seconds its threads spent runnable but waiting for a CPU (proc(5)
    /proc/PID/task/TID/schedstat, second field, ns). Linux only; {} elsewhere."""
    out: dict[int, float] = {}
    for pid in pids:
        total = 0
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                    total += int(fh.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
        out[pid] = total / 1e9
    return out


class HostSource:
    """Host CPU and memory, the engine's process tree (`engine_pids`) and the client (this
    process and its children in its session that are not the engine)."""

    name = "host"

    def __init__(self, engine_pids: Callable[[], Iterable[int]] | None = None) -> None:
        import psutil

        self.psutil = psutil
        self.engine_pids = engine_pids
        self.me = psutil.Process()
        self._procs: dict[int, Any] = {}
        self._prev: dict[str, Any] | None = None
        self._trees: tuple[float, set[int], set[int]] | None = None

    def _pids(self, now: float) -> tuple[set[int], set[int]]:
        """The engine's and the client's pids, re-listed every TREE_REFRESH_S: walking the
        process table costs milliseconds, and engines fork their workers once, at start."""
        if self._trees is None or now - self._trees[0] >= TREE_REFRESH_S:
            engine = set(self.engine_pids()) if self.engine_pids else set()
            client = ({self.me.pid} | self._own_children()) - engine
            self._trees = (now, engine, client)
        return self._trees[1], self._trees[2]

    def _proc(self, pid: int) -> Any:
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = self.psutil.Process(pid)
        return p

    def _own_children(self) -> set[int]:
        """This process's descendants in its own session: bench's sender processes. An
        engine or any other program started in a session of its own is not the client."""
        try:
            sid = os.getsid(0)
            kids = self.me.children(recursive=True)
        except (self.psutil.Error, OSError):
            return set()
        out = set()
        for c in kids:
            try:
                if os.getsid(c.pid) == sid:
                    out.add(c.pid)
            except OSError:
                continue
        return out

    def _tree(self, pids: Iterable[int]) -> tuple[dict[int, float], float]:
        """pid -> CPU seconds (user + system) and the summed RSS bytes of `pids`."""
        cpu: dict[int, float] = {}
        rss = 0.0
        for pid in pids:
            try:
                p = self._proc(pid)
                t = p.cpu_times()
                cpu[pid] = t.user + t.system
                rss += p.memory_info().rss
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, ProcessLookupError):
                self._procs.pop(pid, None)
        return cpu, rss

    def read(self) -> dict[str, float]:
        ps = self.psutil
        now = time.monotonic()
        cores = ps.cpu_times(percpu=True)
        mem = ps.virtual_memory()
        engine, client = self._pids(now)
        eng_cpu, eng_rss = self._tree(engine)
        cli_cpu, _ = self._tree(client)
        runq = read_runq_wait_s(engine)
        out: dict[str, float] = {
            "host_mem_used_bytes": float(mem.total - mem.available),
            "host_mem_available_bytes": float(mem.available),
        }
        if engine:
            out["engine_rss_bytes"] = eng_rss
            out["engine_processes"] = float(len(eng_cpu))
        prev, self._prev = (
            self._prev,
            {
                "t": now,
                "cores": cores,
                "eng": eng_cpu,
                "cli": cli_cpu,
                "runq": runq,
            },
        )
        if prev is None:
            return out
        dt = now - prev["t"]
        if dt <= 0:
            return out
        shares = [core_shares(a, b) for a, b in zip(prev["cores"], cores, strict=False)]
        for i, (busy, _) in enumerate(shares):
            out[f"cpu{i}_busy"] = busy
        busy_cores = sum(b for b, _ in shares)
        out["host_cpu_busy"] = busy_cores / max(1, len(shares))
        out["host_cpu_steal"] = sum(s for _, s in shares) / max(1, len(shares))
        out["host_cpu_cores"] = float(len(shares))
        client_cores = tree_delta(prev["cli"], cli_cpu) / dt
        out["client_cpu_cores"] = client_cores
        if engine:
            eng_cores = tree_delta(prev["eng"], eng_cpu) / dt
            out["engine_cpu_cores"] = eng_cores
            # Wait share: of the time the engine's threads were runnable, the part spent
            # waiting for a CPU (schedstat run_delay over run_delay + cpu time).
            wait = tree_delta(prev["runq"], runq) / dt
            out["engine_runq_wait_cores"] = wait
            out["engine_runq_wait_share"] = wait / (wait + eng_cores) if wait + eng_cores else 0.0
            out["other_cpu_cores"] = max(0.0, busy_cores - eng_cores - client_cores)
        return out

    def close(self) -> None:
        self._procs.clear()


def others_now(seconds: float = 2.0) -> tuple[int, float]:
    """(the host's cores, the cores' worth other processes kept busy over `seconds`):
    the host as it is before an engine starts. This process and its children are not
    "others" (`HostSource`'s client)."""
    src = HostSource()
    src.read()
    time.sleep(seconds)
    got = src.read()
    cores = int(got.get("host_cpu_cores", os.cpu_count() or 1))
    busy = got.get("host_cpu_busy", 0.0) * cores
    return cores, max(0.0, busy - got.get("client_cpu_cores", 0.0))


LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", ""}


def local_server_pids(url: str) -> Callable[[], set[int]] | None:
    """For a server on this machine, a function giving the process tree that listens on
    the URL's port (re-read on each call: an engine forks its workers after it listens).
    None for a remote URL, whose processes this machine cannot see."""
    from urllib.parse import urlsplit

    import psutil

    parts = urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)

    def listener() -> int | None:
        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return None
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
        return None

    root = listener()
    if root is None or root == os.getpid():
        return None  # nothing listening, or the server runs inside this process (a mock)

    def pids() -> set[int]:
        try:
            p = psutil.Process(root)
            return {root} | {c.pid for c in p.children(recursive=True)}
        except psutil.Error:
            return set()

    return pids
