"""Event-loop set-up shared by the load client and the mock server: both hold one socket
per request in flight and spend their time in the loop, so both want the faster loop and
the higher open-files limit."""

from __future__ import annotations

import asyncio

__all__ = ["install_fast_loop", "raise_fd_limit"]


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
