"""Bad input to the store's commands is one line naming the real problem (bug-hunt
findings): an empty --db or $SERVETUNE_DB, an empty run, a folder, a bad --since, and
`runs tag --remove` counting only the runs that had the tag."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.store import Store
from synthetic_runs import synthetic_sweep


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three stored runs in study `sweep`; the working folder is empty."""
    path = tmp_path / "runs.db"
    monkeypatch.setenv("SERVETUNE_DB", str(path))
    monkeypatch.chdir(tmp_path)
    with Store.open(str(path)) as s:
        for r, m in synthetic_sweep((1, 2, 4), seed=1, n_requests=20):
            s.save_result(r, m, study="sweep")
    return path


def _one_line(code: int, err: str, needle: str) -> None:
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "list"),
        ("runs", "import", "x.json"),
        ("report", "sweep"),
        ("diagnose", "bench-x"),
    ],
)
def test_an_empty_db_is_refused_by_every_command(
    capsys: pytest.CaptureFixture[str],
    db: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: tuple[str, ...],
) -> None:
    code, _, err = run_cli(capsys, *args, "--db", "")
    _one_line(code, err, "--db: is empty (give a file path or URL)")
    monkeypatch.setenv("SERVETUNE_DB", "")
    code, _, err = run_cli(capsys, *args)
    _one_line(code, err, "$SERVETUNE_DB: is empty")
    assert not (tmp_path / "servetune.db").exists()  # never the default silently


def test_empty_refs_and_folders_say_the_real_problem(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    code, _, err = run_cli(capsys, "report", "")
    _one_line(code, err, "RUNS: an empty value names nothing")
    code, _, err = run_cli(capsys, "runs", "import", str(tmp_path))
    _one_line(code, err, f"FILE: {tmp_path} is a folder (give a result")


def test_untagging_counts_only_the_runs_that_had_the_tag(
    capsys: pytest.CaptureFixture[str], db: Path
) -> None:
    code, out, _ = run_cli(capsys, "runs", "tag", "sweep", "notthere", "--remove")
    assert code == 0 and out.startswith("untagged 0 run(s): notthere (3 did not have it)")
    run_cli(capsys, "runs", "tag", "bench-20260101T000100-c1-s1", "gold")
    code, out, _ = run_cli(capsys, "runs", "tag", "sweep", "gold")
    assert code == 0 and out.startswith("tagged 2 run(s): gold (1 already had it)")
    code, out, _ = run_cli(capsys, "runs", "tag", "sweep", "gold", "--remove")
    assert code == 0 and out.startswith("untagged 3 run(s): gold\n")


def test_a_bad_date_names_its_flag(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    code, _, err = run_cli(capsys, "runs", "list", "--since", "yesterday")
    _one_line(code, err, "--since: not an ISO date/time: 'yesterday'")
    code, _, err = run_cli(capsys, "runs", "list", "--until", "yesterday")
    _one_line(code, err, "--until: not an ISO date/time: 'yesterday'")
    code, out, _ = run_cli(capsys, "runs", "list", "--until", "2026-01-01", "--json")
    assert code == 0 and out.count('"id"') == 3  # a bare date includes its whole day
