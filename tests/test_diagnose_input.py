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
