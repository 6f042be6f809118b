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
