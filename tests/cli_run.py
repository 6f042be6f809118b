"""Run the servetune CLI inside the test process (no interpreter start-up per call)."""

from __future__ import annotations

import sys

import pytest

from servetune.cli.app import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """servetune ARGS in this process: exit code, stdout, stderr."""
    argv, sys.argv = sys.argv, ["servetune", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *needles: str) -> str:
    """Assert a bad-input exit: code 2, one line on stderr, no traceback, holding every
    needle; returns that line."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
