"""`validate`: a flag of the other mode is refused, not ignored; a tier given twice counts
once; a bad saved run names --runs."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from tests.cli_run import run_cli

from servetune.validate import published as pub


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--published", "--profile", "nope.json"], "--profile: not used with --published"),
        (["--published", "--profile-out", "p.json"], "--profile-out: not used with --published"),
        (["--published", "--engine", "vllm"], "--engine: not used with --published"),
        (["--published", "--repeats", "2"], "--repeats: not used with --published"),
        (["--runs", "d", "--tier", "gpu"], "--tier: not used with --runs"),
        (["--runs", "d", "--measure", "median"], "--measure: not used with --runs"),
        (["--runs", "d", "--repeats", "2"], "--repeats: not used with --runs"),
        (["--live", "--per-run"], "--per-run: not used with --live"),
        (["--live", "--jobs", "2"], "--jobs: not used with --live"),
        (["--live", "--published-file", "x.csv"], "--published"),  # the modes' own clash
    ],
)
def test_a_flag_of_the_other_mode_is_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    code, out, err = run_cli(capsys, "validate", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and says in err, err


def test_the_fix_names_the_modes_that_read_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run_cli(capsys, "validate", "--published", "--profile", "p.json")
    assert "(drop it, or use --runs/--live)" in err
    _, _, err = run_cli(capsys, "validate", "--runs", "d", "--tier", "gpu")
    assert "(drop it, or use --published)" in err


def test_a_tier_given_twice_counts_its_runs_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = (resources.files("servetune") / pub.PACKAGED).read_text("utf-8").splitlines()
    one = tmp_path / "one.csv"
    one.write_text("\n".join(lines[:2]) + "\n")
    args = ("--published-file", str(one), "--tier", "gpu", "--tier", "gpu", "--jobs", "1")
    code, out, err = run_cli(capsys, "validate", *args, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert list(data) == ["gpu"] and len(data["gpu"]["runs"]) == 1
    assert data["gpu"]["all"]["runs"] == 1


def test_a_run_the_simulated_engine_serves_no_request_of_is_refused_not_minus_100(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A row whose prompts no context holds (10,000,000 tokens): every simulated request
    refused, its 0 ms read as a -100% error and pulled the medians; now counted refused."""
    import csv
    import io

    text = (resources.files("servetune") / pub.PACKAGED).read_text("utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    row = {**rows[0], "isl": "10000000"}
    out_csv = io.StringIO()
    w = csv.DictWriter(out_csv, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerow(row)
    one = tmp_path / "huge.csv"
    one.write_text(out_csv.getvalue())
    args = ("--published-file", str(one), "--tier", "gpu", "--jobs", "1")
    code, out, err = run_cli(capsys, "validate", "--published", *args, "--json")
    assert code == 0, err
    data = json.loads(out)["gpu"]
    assert data["all"]["refused"] == 1, data["all"]
    (run,) = data["runs"]
    assert run["tpot_err_pct"] is None and "completed no request" in run["refused"], run


def test_a_bad_saved_run_names_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"x": 1}')
    code, _, err = run_cli(capsys, "validate", "--runs", str(tmp_path))
    assert code == 2 and err.startswith("error: --runs: ") and "is not a RunResult" in err
