"""`diagnose` input mistakes are one line naming the real problem (bug-hunt findings)."""

from __future__ import annotations

import pytest

from cli_run import run_cli


def _one_line(code: int, err: str, needle: str) -> None:
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_unknown_engine_is_named_not_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    # nothing listens on port 9: the engine must be refused before the URL is read
    code, _, err = run_cli(capsys, "diagnose", "--url", "http://127.0.0.1:9", "--engine", "bogus")
    _one_line(code, err, "--engine: unknown engine 'bogus'")
    assert "--url" not in err


def test_an_empty_run_is_named_empty_not_a_folder(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "diagnose", "")
    _one_line(code, err, "RUN: is empty (give a run id or a result file)")


def test_a_ref_too_long_for_a_path_is_looked_up_as_a_run_id(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    """4,000 characters: stat() raised OSError (File name too long), a traceback."""
    db = str(tmp_path / "s.db")
    code, _, err = run_cli(capsys, "diagnose", "x" * 4000, "--db", db)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://[::1", "--url: 'http://[::1' is not a valid URL (Invalid IPv6 URL)"),
        ("http://127.0.0.1:abc", "--url: the port in 'http://127.0.0.1:abc' is not a number"),
        ("http://127.0.0.1:99999", "is out of range (1-65535"),
    ],
)
def test_a_bad_url_gets_benchs_one_line_check(
    capsys: pytest.CaptureFixture[str], url: str, needle: str
) -> None:
    """diagnose read the URL with httpx first: an IPv6 host left open and a port of letters
    were httpx tracebacks. Each command that takes a server's URL now checks it alike
    (`bench.reach.check_url`); bench and calibrate gave the first one a traceback too."""
    for command in (["diagnose", "--url", url, "--window", "1"], ["bench", "--url", url]):
        code, _, err = run_cli(capsys, *command)
        _one_line(code, err, needle)


def test_an_unreadable_telemetry_url_is_refused_before_the_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Sampled, an exporter nobody answers at only counts errors: the window read as a
    quiet GPU, `no symptom found`, exit 0."""
    from servetune.mock.server import MockConfig, mock_in_thread

    dead = "http://127.0.0.1:9/metrics"
    with mock_in_thread(MockConfig()) as srv:
        url = f"127.0.0.1:{srv.port}"  # no scheme: taken as bench takes it
        code, _, err = run_cli(capsys, "diagnose", "--url", url, "--window", "1",
                               "--telemetry-url", dead)  # fmt: skip
    _one_line(code, err, "--telemetry-url: cannot read http://127.0.0.1:9/metrics (ConnectError)")
