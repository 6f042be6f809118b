"""Event-loop set-up shared by the load client and the mock server: both hold one socket
per request in flight and spend their time in the loop, so both want the faster loop and
the higher open-files limit."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

__all__ = ["install_fast_loop", "loop_in_thread", "raise_fd_limit"]

T = TypeVar("T")


def install_fast_loop() -> str:
    """uvloop when installed (a faster event loop); returns the loop's name."""
    try:
        import uvloop  # optional: absent on Windows

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    except ImportError:  # pragma: no cover
        return "asyncio"


def raise_fd_limit() -> None:
    """One socket per request in flight: lift the soft open-files limit to the hard one."""
    try:
        import resource  # POSIX only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover
        pass


@contextlib.contextmanager
def loop_in_thread(start: Callable[[], Awaitable[T]], name: str) -> Iterator[T]:
    """Run `start()` (a coroutine that begins serving and returns) on a new event loop in
    a daemon thread, keep the loop running, and yield what `start` returned; the loop stops
    on exit. The mock server and the accept shedder run in tests and beside the CLI so."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    started: list[T] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        started.append(loop.run_until_complete(start()))
        ready.set()
        loop.run_forever()

    th = threading.Thread(target=run, daemon=True, name=name)
    th.start()
    if not ready.wait(10):
        raise RuntimeError(f"{name} did not start")
    try:
        yield started[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
