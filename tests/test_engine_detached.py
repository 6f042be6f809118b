"""Detached engines without an engine: the state file, `engine ps` / `engine stop` and their
one-line errors, run against real process groups (bash + sleep) standing in for an engine.
The llama.cpp run of the same commands is in test_engine_llamacpp.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from servetune.engines import detached
from servetune.engines.process import engine_pids


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own state file (the CLI subprocesses inherit the variable)."""
    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path / "cache"))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie, read straight from /proc."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live processes in a process group."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(entry)) == pgid and alive(int(entry)):
                found.append(int(entry))
        except ProcessLookupError:
            continue
    return found


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def fake_engines():
    """Start process groups shaped like an engine (a leader with workers, one of which
    left the group) and record them as detached; kill whatever is left at the end."""
    started: list[subprocess.Popen] = []

    def start(script: str, engine: str = "llamacpp") -> tuple[detached.Detached, list[int]]:
        proc = subprocess.Popen(
            ["bash", "-c", f"{script} wait"], start_new_session=True, stdout=subprocess.DEVNULL
        )
        started.append(proc)
        # leader + two sleeps in the group, and the `setsid` one outside it: wait until it
        # has left (setsid(2) runs a moment after the fork; before, it still counts as in)
        assert wait_for(
            lambda: len(engine_pids(proc.pid, proc.pid)) >= 4 and len(group_members(proc.pid)) == 3
        )
        run_id, workdir = detached.new_run_dir(engine)
        srv = SimpleNamespace(
            engine=engine,
            model="/models/gemma.gguf",
            url="http://127.0.0.1:1",
            pid=proc.pid,
            started_at=time.monotonic() - 125.0,
            log_path=workdir / "engine.log",
        )
        return detached.record(run_id, srv), group_members(proc.pid)  # type: ignore[arg-type]

    yield start
    for entry in detached.entries():  # whatever a failing test left running
        for pid in entry.live_pids():
            os.kill(pid, signal.SIGKILL)
    for proc in started:
        proc.kill()
        proc.wait()


WORKERS = "sleep 300 & sleep 300 & setsid sleep 300 &"


def test_state_file_round_trip_and_ps_json(fake_engines) -> None:
    entry, _ = fake_engines(WORKERS)
    assert detached.entries() == [entry]
    assert entry.id.startswith("llamacpp-") and entry.state() == "alive"
    assert json.loads(detached.state_file().read_text())[0]["pid"] == entry.pid
    out = run_cli("ps", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert (row["id"], row["pid"], row["state"]) == (entry.id, entry.pid, "alive")
    assert 125 <= row["uptime_s"] < 200
    header, line = run_cli("ps").stdout.splitlines()
    assert header.split() == ["ID", "ENGINE", "MODEL", "URL", "PID", "UPTIME", "STATE"]
    *_, uptime, state = line.split()
    assert state == "alive" and uptime.startswith("2m")


def test_stop_kills_the_group_and_the_worker_that_left_it(fake_engines) -> None:
    entry, pids = fake_engines(WORKERS)
    escaped = entry.live_pids() - set(pids)  # `setsid sleep` runs in its own group
    assert len(escaped) == 1
    out = run_cli("stop", entry.id)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"stopped {entry.id} (llamacpp, pid {entry.pid})"
    assert group_members(entry.pid) == []
    assert not [p for p in escaped if alive(p)]
    assert detached.entries() == []


def test_sigkill_after_the_grace_period(fake_engines) -> None:
    # SIG_IGN is inherited: the leader and its sleeps all ignore SIGTERM.
    entry, _ = fake_engines("trap '' TERM; " + WORKERS)
    t0 = time.monotonic()
    out = run_cli("stop", "--all", "--grace", "1")
    assert out.returncode == 0, out.stderr
    assert 1.0 <= time.monotonic() - t0 < 30
    assert group_members(entry.pid) == [] and entry.live_pids() == set()


def test_dead_engine_is_listed_dead_and_cleaned_by_stop(fake_engines) -> None:
    live, _ = fake_engines(WORKERS)
    dead, dead_pids = fake_engines(WORKERS)
    for pid in dead.live_pids():
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: dead.state() == "dead")
    states = {r["id"]: r["state"] for r in json.loads(run_cli("ps", "--json").stdout)}
    assert states == {live.id: "alive", dead.id: "dead"}
    assert run_cli("ps").stdout.splitlines()[-1].split()[-2:] == ["-", "dead"]
    out = run_cli("stop", dead.id)
    assert out.returncode == 0
    assert out.stdout.strip() == f"{dead.id} had already exited; entry removed"
    assert [e.id for e in detached.entries()] == [live.id]
    assert live.state() == "alive"


def test_reused_pid_is_never_signalled(fake_engines) -> None:
    """An entry whose PID now names another process (start time differs) counts as dead."""
    entry, pids = fake_engines(WORKERS)
    before = entry.live_pids()
    stale = dataclasses.replace(
        entry,
        start_ticks=entry.start_ticks - 1,
        pids=tuple((pid, started - 1) for pid, started in entry.pids),
    )
    with detached._locked() as found:
        found[:] = [stale]
    assert [r["state"] for r in json.loads(run_cli("ps", "--json").stdout)] == ["dead"]
    out = run_cli("stop", entry.id)
    assert out.returncode == 0 and "already exited" in out.stdout
    assert entry.live_pids() == before  # untouched


def test_leader_dead_workers_left_are_shown_and_stopped(fake_engines) -> None:
    entry, _ = fake_engines(WORKERS)
    workers = entry.live_pids() - {entry.pid}
    os.kill(entry.pid, signal.SIGKILL)
    assert wait_for(lambda: entry.state() == "leader dead, 3 left")
    assert run_cli("stop", entry.id).returncode == 0
    assert entry.live_pids() == set()
    assert not [p for p in workers if alive(p)]  # the re-parented one too


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("stop", "llamacpp-0000"), "error: engine stop: unknown id 'llamacpp-0000'"),
        (("stop", "--all"), "error: engine stop --all: nothing to stop"),
        (("stop",), "error: engine stop: no engine id given"),
    ],
)
def test_stop_errors_are_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith(message)


def test_unknown_id_names_the_recorded_ones(fake_engines) -> None:
    entry, _ = fake_engines(WORKERS)
    out = run_cli("stop", "nope")
    assert out.returncode == 2 and f"recorded ids: {entry.id}" in out.stderr
    assert entry.state() == "alive"
    both = run_cli("stop", entry.id, "--all")
    assert both.returncode == 2 and "not both" in both.stderr


_ROW = {"id": "vllm-ab12", "engine": "vllm", "model": "m", "url": "http://127.0.0.1:8000",
        "pid": 1, "start_ticks": 1, "started_at": 1.0, "log": "x.log",
        "pids": [[1, 1]]}  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        # JSON, but a hand-edited field of another type: TypeError / ValueError tracebacks
        json.dumps([{**_ROW, "started_at": "yesterday"}]),
        json.dumps([{**_ROW, "pids": [[1]]}]),
        json.dumps([{**_ROW, "pid": "1"}]),
    ],
)
def test_corrupt_state_file_is_one_line_exit_2(text: str) -> None:
    path = detached.state_file()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    out = run_cli("ps")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert str(path) in out.stderr and "delete the file" in out.stderr


def test_empty_ps() -> None:
    out = run_cli("ps")
    assert out.returncode == 0 and out.stdout.startswith("no detached engines")
    assert json.loads(run_cli("ps", "--json").stdout) == []


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (59.9, "59s"), (187, "3m07s"), (7500, "2h05m"), (93_600, "1d02h"), (-3, "0s")],
)
def test_format_uptime(seconds: float, shown: str) -> None:
    assert detached.format_uptime(seconds) == shown


def test_run_ids_are_unique_and_claim_a_dir() -> None:
    made = [detached.new_run_dir("vllm") for _ in range(20)]
    assert len({run_id for run_id, _ in made}) == 20
    assert all(d.is_dir() and d.name == run_id for run_id, d in made)


def test_an_engine_dies_with_the_process_that_launched_it(tmp_path: Path) -> None:
    """A launcher killed by a signal that skips atexit (a test run under `timeout`, a
    SIGKILL) must not leave its engine running: the child asked Linux for SIGTERM on the
    parent's death, as `launch` does for every engine not started with --detach."""
    pidfile = tmp_path / "child.pid"
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from servetune.engines.process import _die_with_parent\n"
         "p = subprocess.Popen(['sleep', '120'], preexec_fn=_die_with_parent)\n"
         f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
         "time.sleep(120)\n"]
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert alive(child)
    launcher.kill()
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
