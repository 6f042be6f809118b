"""The CLI's outer contract: fast help, version, one-line errors with exit code 2."""

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("servetune ")


def test_help_lists_plan() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    assert "plan" in out.stdout


def test_unknown_command_is_one_line_exit_2() -> None:
    out = run_cli("no-such-command")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
