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


CALIBRATE = ["calibrate", "-m", "llama-3.1-8b", "-g", "cpu-host", "-o", "p.json", "--url", DEAD]

# case: (command line, the flag its one-line error names)
CASES = {
    "accept --html": (["accept", "--url", DEAD, "--engine", "vllm", "--html", "{dir}"], "--html"),
    "accept -o": (["accept", "--url", DEAD, "--engine", "vllm", "-o", "{missing}"], "--output"),
    "bench --csv": (["bench", "--url", DEAD, "--csv", "{dir}", "--no-store"], "--csv"),
    "bench -o": (["bench", "--url", DEAD, "-o", "{missing}", "--no-store"], "--output"),
    "calibrate --url -o": (
        ["calibrate", "-m", "llama-3.1-8b", "-g", "cpu-host", "-o", "{dir}", "--url", DEAD],
        "--output",
    ),  # fmt: skip
    "calibrate --runs-dir": ([*CALIBRATE, "--runs-dir", "{file}"], "--runs-dir"),
    "validate --profile-out": (
        ["validate", "--runs", "{dir}", "--profile-out", "{missing}"],
        "--profile-out",
    ),  # fmt: skip
    "runs export -o": (["runs", "export", "-o", "{dir}"], "--output"),
    "report -o": (["report", "last", "-o", "{dir}"], "--output"),
    "report --images": (["report", "last", "-o", "r.html", "--images", "{file}"], "--images"),
    "tune --report": (
        ["tune", "--backend", "sim", "--trials", "1", "--report", "{dir}"],
        "--report",
    ),  # fmt: skip
    # a file where the path wants a folder: "folder a-file.txt does not exist" read wrong
    "tune --report under a file": (
        ["tune", "--backend", "sim", "--trials", "1", "--report", "{under_file}"],
        "--report",
    ),
    # /proc passes every check root's access() makes and takes no new file: refused up
    # front, where it failed at the write (calibrate lost its sweep's first run)
    "bench -o /proc": (["bench", "--url", DEAD, "-o", "{proc}", "--no-store"], "--output"),
    "report --images /proc": (
        ["report", "last", "-o", "r.html", "--images", "{proc}"],
        "--images",
    ),  # fmt: skip
    "calibrate --runs-dir /proc": ([*CALIBRATE, "--runs-dir", "{proc}"], "--runs-dir"),
    "simulate --trace": (
        ["simulate", "--count", "4", "--no-store", "--trace", "{missing}"],
        "--trace",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_output_path_is_refused_before_anything_runs(case: str, tmp_path: Path) -> None:
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file.txt").write_text("x")
    paths = {
        "dir": str(tmp_path / "a-folder"),
        "file": str(tmp_path / "a-file.txt"),
        "missing": str(tmp_path / "no-such-folder" / "x.json"),
        "proc": "/proc/servetune-test",
        "under_file": str(tmp_path / "a-file.txt" / "r.html"),
    }
    line, flag = CASES[case]
    args = [a.format(**paths) for a in line]
    db = tmp_path / "st.db"
    out = _cli(*args, *(["--db", str(db)] if args[0] in ("runs", "report") else []), cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}: "), out.stderr
    assert "folder" in lines[0] and "Traceback" not in out.stderr
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "out").exists()


# -- writing the file: one function (`outfile.replaced`) for every command ---------------


def test_a_file_is_replaced_whole_and_a_symlink_keeps_pointing_at_it(tmp_path: Path) -> None:
    from servetune.outfile import replaced

    target, link = tmp_path / "target.csv", tmp_path / "link.csv"
    target.write_text("old")
    link.symlink_to(target)
    with replaced(link) as tmp:
        assert not tmp.exists() and tmp.parent == tmp_path  # written beside, not over it
        tmp.write_text("new")
        assert target.read_text() == "old"  # a reader still sees the whole old file
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "target.csv"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    from servetune.outfile import replaced

    out = tmp_path / "r.json"
    out.write_text("measured")
    with pytest.raises(RuntimeError), replaced(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the render failed")
    assert out.read_text() == "measured" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_pipe_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    import os
    import threading

    from servetune.outfile import replaced

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    with replaced(fifo) as tmp:
        assert tmp == fifo
        tmp.write_text("rows\n")
    reader.join(timeout=10)
    assert got == ["rows\n"] and fifo.is_fifo()


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
def test_a_place_that_refuses_the_write_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """/proc refuses new files even to root, after the folder checks pass: the write itself
    fails, and that is one line too (it was a FileNotFoundError traceback)."""
    db = tmp_path / "st.db"
    chat = Path(__file__).parents[1] / "examples" / "workloads" / "chat.yaml"
    run = _cli("simulate", "-w", str(chat), "--count", "4", "--db", str(db), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for args in (
        ["runs", "export", "-f", "json", "-o", "/proc/servetune-test.json"],
        ["runs", "export", "-f", "csv", "-o", "/proc/servetune-test.csv"],
        ["report", "last", "-o", "/proc/servetune-test.html"],
    ):
        out = _cli(*args, "--db", str(db), cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(lines) == 1 and lines[0].startswith("error: --output: "), out.stderr


def test_a_missing_sweep_base_names_its_point_files(tmp_path: Path) -> None:
    """`-o run.json` on a sweep writes run-<label>.json per point (`point_file`); a later
    command given run.json hears where they are, by kind then load, and nothing else that
    shares the stem (notes, record logs) passes for one."""
    from servetune.outfile import missing_file_fix, point_file, point_files_of

    base = tmp_path / "run.json"
    for label in ("conc16", "conc4", "rate0.5"):
        point_file(base, label, True).write_text("{}")
    (tmp_path / "run-notes.json").write_text("{}")
    (tmp_path / "run-conc4.records.jsonl").write_text("")
    assert [p.name for p in point_files_of(base)] == [
        "run-conc4.json", "run-conc16.json", "run-rate0.5.json"
    ]  # fmt: skip
    assert missing_file_fix(base, "check the path") == (
        f"a sweep writes one file per point, here {tmp_path}/run-conc4.json, "
        f"{tmp_path}/run-conc16.json, {tmp_path}/run-rate0.5.json"
    )
    assert missing_file_fix(tmp_path / "other.json", "check the path") == "check the path"
    assert missing_file_fix(tmp_path / "no" / "run.json", "check the path") == "check the path"
    assert point_file(base, "conc4", False) == base  # one point: the name given


def test_a_sweep_points_record_log_is_checked_before_the_first_point(tmp_path: Path) -> None:
    """`<stem>-conc2.records.jsonl` (the log flushed beside the second point's result) a
    folder: the sweep measured its first point, then stopped at the second with an
    IsADirectoryError traceback. Refused before any point now."""
    from servetune.mock.server import MockConfig, mock_in_thread

    (tmp_path / "o-conc2.records.jsonl").mkdir()
    with mock_in_thread(MockConfig()) as srv:
        out = _cli("bench", "--url", f"http://127.0.0.1:{srv.port}", "--concurrency", "1,2",
                   "--count", "2", "--tokenizer", "word", "--no-telemetry", "--no-store",
                   "-o", str(tmp_path / "o.json"), cwd=tmp_path)  # fmt: skip
        sent = srv.stats.requests
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    log = tmp_path / "o-conc2.records.jsonl"
    assert lines[-1] == f"error: --output: {log} is a folder (give a file name)", lines
    assert sent == 0 and not list(tmp_path.glob("o-conc1*")), sent


def test_a_file_where_a_folder_should_be_is_named_a_file(tmp_path: Path) -> None:
    """`-o ok.html/x.html` with ok.html a file read "folder ok.html does not exist"."""
    from servetune.errors import InputError
    from servetune.results.files import check_folder, check_writable

    (tmp_path / "ok.html").write_text("x")
    for check in (check_writable, check_folder):
        with pytest.raises(InputError) as e:
            check(tmp_path / "ok.html" / "x", "--report")
        assert e.value.problem == f"{tmp_path / 'ok.html'} is a file, not a folder", e.value
