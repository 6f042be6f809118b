"""A test's time bound holds while bench's event loop (uvloop) runs: an inner pytest
session, with the suite's timeout hooks (tests/timeouts.py), runs a test that loops on the
same loop bench installs for 6 s under a 1 s bound; and an engine test without a bound of
its own fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP_S = 6

INNER = f"""
import asyncio
import time

import pytest

from servetune.aio import install_fast_loop

LOOP_S = {LOOP_S}


async def requests_for(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # many short awaits, like bench's request tasks
        await asyncio.gather(*(asyncio.sleep(0.01) for _ in range(4)))
    return "ran to the end"


@pytest.mark.timeout(1)
def test_loops_past_its_bound():
    assert install_fast_loop() == "uvloop"
    print(asyncio.run(requests_for(LOOP_S)))


def test_the_next_test_still_runs():
    assert True


@pytest.mark.engine
@pytest.mark.timeout(30)
def test_engine_with_its_bound():
    assert True


@pytest.mark.engine
def test_engine_without_a_bound():
    assert True
"""


def _inner(tmp: Path, conftest: str) -> tuple[str, float]:
    """The inner session's output, and how long its bounded test ran (pytest's own figure)."""
    (tmp / "test_inner.py").write_text(INNER)
    (tmp / "conftest.py").write_text(conftest)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             "-p", "no:randomly", "-p", "no:warnings", "--durations=0", "--durations-min=0",
             "--rootdir", str(tmp), "-c", os.devnull, str(tmp)],
            capture_output=True, text=True, cwd=tmp, env=env, timeout=120,
        ).stdout  # fmt: skip
    except subprocess.TimeoutExpired as e:  # say where it hung
        raise AssertionError(f"inner session hung: {e.stdout!r:.3000} {e.stderr!r:.3000}") from e
    took = re.search(r"([0-9.]+)s call +test_inner.py::test_loops_past_its_bound", out)
    assert took, out[-2000:]
    return out, float(took.group(1))


def test_the_bound_holds_inside_the_bench_event_loop(tmp_path: Path) -> None:
    out, took = _inner(tmp_path, "from timeouts import *\n")
    assert "1 failed, 2 passed, 1 error" in out and "Timeout >1" in out, out[-2000:]
    assert "test_engine_without_a_bound: an engine test needs its own" in out  # the error
    assert "ran to the end" not in out
    assert took < 0.75 * LOOP_S, took  # stopped at its bound, not at the loop's end


def test_without_the_hook_uvloop_swallows_the_timeout(tmp_path: Path) -> None:
    """Why the hook exists: pytest-timeout alone lets the loop run to its end."""
    out, took = _inner(tmp_path, "")
    assert "4 passed" in out and "ran to the end" in out, out[-2000:]
    assert took >= LOOP_S
