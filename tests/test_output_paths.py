"""Every output path is refused before anything is measured: a folder given as a file, a
file given as a folder, a missing parent. A live check, a sweep or a fit that ran first and
then failed to write would lose what it measured (`results.files.check_outputs`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEAD = "http://127.0.0.1:9"  # nothing listens: a command that got past its paths would say so


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


CASES = {
    "accept --html": ["accept", "--url", DEAD, "--engine", "vllm", "--html", "{dir}"],
    "accept -o": ["accept", "--url", DEAD, "--engine", "vllm", "-o", "{missing}"],
    "bench --csv": ["bench", "--url", DEAD, "--csv", "{dir}", "--no-store"],
    "bench -o": ["bench", "--url", DEAD, "-o", "{missing}", "--no-store"],
    "calibrate --url -o": [
        "calibrate",
        "-m",
        "llama-3.1-8b",
        "-g",
        "cpu-host",
        "-o",
        "{dir}",
        "--url",
        DEAD,
    ],  # fmt: skip
    "calibrate --runs-dir": [
        "calibrate",
        "-m",
        "llama-3.1-8b",
        "-g",
        "cpu-host",
        "-o",
        "p.json",
        "--url",
        DEAD,
        "--runs-dir",
        "{file}",
    ],  # fmt: skip
    "validate --profile-out": ["validate", "--runs", "{dir}", "--profile-out", "{missing}"],
    "runs export -o": ["runs", "export", "-o", "{dir}"],
    "report -o": ["report", "last", "-o", "{dir}"],
    "report --images": ["report", "last", "-o", "r.html", "--images", "{file}"],
    "tune --report": ["tune", "--backend", "sim", "--trials", "1", "--report", "{dir}"],
    "simulate --trace": ["simulate", "--count", "4", "--no-store", "--trace", "{missing}"],
}
FLAG = {
    "accept --html": "--html",
    "accept -o": "--output",
    "bench --csv": "--csv",
    "bench -o": "--output",
    "calibrate --url -o": "--output",
    "calibrate --runs-dir": "--runs-dir",
    "validate --profile-out": "--profile-out",
    "runs export -o": "--output",
    "report -o": "--output",
    "report --images": "--images",
    "tune --report": "--report",
    "simulate --trace": "--trace",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_output_path_is_refused_before_anything_runs(case: str, tmp_path: Path) -> None:
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file.txt").write_text("x")
    paths = {
        "dir": str(tmp_path / "a-folder"),
        "file": str(tmp_path / "a-file.txt"),
        "missing": str(tmp_path / "no-such-folder" / "x.json"),
    }
    args = [a.format(**paths) for a in CASES[case]]
    db = tmp_path / "st.db"
    out = _cli(*args, *(["--db", str(db)] if args[0] in ("runs", "report") else []), cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {FLAG[case]}: "), out.stderr
    assert "folder" in lines[0] and "Traceback" not in out.stderr
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "out").exists()
