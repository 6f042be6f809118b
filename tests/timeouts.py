"""Per-test time bounds that hold while bench sends load: a pytest-timeout hook (imported
by conftest.py, and by tests/test_timeouts.py's inner session).

pytest-timeout's "signal" method raises from a SIGALRM handler. bench runs its load on
uvloop, and uvloop hands whatever a signal handler raises to the loop's exception handler,
which logs it and carries on: a test past its bound inside a bench run kept running (an
accept test bounded at 600 s ran 804 s on a busy host). So, while an event loop runs, the
handler cancels the loop's tasks (the run ends at once) and fires again shortly, until it
lands in plain Python code, where the timeout fails the test as usual. The repeat stops
with the phase (setup, call, teardown) it fired in: left running, it fired inside pytest's
own report code on a slow host (an INTERNALERROR in CI).
"""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

TIMEOUT_RETRY_S = 2.0


def _cancel_running_loop(why: str) -> bool:
    """Cancel every task of the event loop running on this thread (their CancelledError
    says `why`); False when none runs."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    for task in asyncio.all_tasks(loop):
        task.cancel(why)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> bool | None:
    """pytest-timeout's signal method, made to hold inside uvloop (see above)."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own implementation
    from pytest_timeout import timeout_sigalrm

    fired = item._timeout_fired = []
    why = f"Timeout >{settings.timeout}s"

    def handler(signum, frame) -> None:
        __tracebackhide__ = True
        if _cancel_running_loop(why):
            signal.setitimer(signal.ITIMER_REAL, TIMEOUT_RETRY_S)
        if fired:
            pytest.fail(why, pytrace=False)
        fired.append(why)
        timeout_sigalrm(item, settings)  # dumps every thread's stack, then fails the test

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # what pytest-timeout's cancel hook calls
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


def _end_of_phase(item: pytest.Item):
    """Stop the handler's repeat when the phase it fired in ends; a phase that swallowed
    every CancelledError and Failed still fails."""
    try:
        result = yield
    finally:
        fired: list[str] = getattr(item, "_timeout_fired", [])
        why = fired[0] if fired else None
        if why:
            signal.setitimer(signal.ITIMER_REAL, 0)  # after a fire, only the repeat is armed
            fired.clear()
    if why:
        pytest.fail(why, pytrace=False)
    return result


pytest_runtest_call = pytest.hookimpl(wrapper=True)(_end_of_phase)
pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(_end_of_phase)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _engine_needs_its_bound(item)
    return (yield from _end_of_phase(item))


def _engine_needs_its_bound(item: pytest.Item) -> None:
    """A test that starts a real engine names its own bound: the default (a hang guard of
    20 minutes) is far above what any one of them should take."""
    if item.get_closest_marker("engine") and not item.get_closest_marker("timeout"):
        pytest.fail(
            f"{item.nodeid}: an engine test needs its own @pytest.mark.timeout(seconds)",
            pytrace=False,
        )
