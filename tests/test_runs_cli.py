"""`servetune runs ...` through the real entry point (main(): one-line errors, exit 2)."""

from __future__ import annotations

import csv
import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.engines.config import EngineConfig
from servetune.store import Store
from synthetic_runs import synthetic_run, synthetic_sweep


@pytest.fixture
def db(db: Path) -> Path:
    """A store with a 3-point sweep, a config variant, and a run changing two knobs."""
    path = db
    with Store.open(str(path)) as s:
        for r, m in synthetic_sweep((1, 2, 4), seed=1, n_requests=40):
            s.save_result(r, m, study="sweep")
        one, m1 = synthetic_run(4, seed=1, n_requests=40, config=EngineConfig(max_num_seqs=32))
        one.id = m1.id = "bench-one-knob"
        s.save_result(one, m1, tags=["candidate"])
        two, m2 = synthetic_run(
            4,
            seed=1,
            n_requests=40,
            config=EngineConfig(max_num_seqs=32, enable_prefix_caching=False),
        )
        two.id = m2.id = "bench-two-knobs"
        s.save_result(two, m2)
    return path


BASE = "bench-20260101T000400-c4-s1"


def test_list_and_filters(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    code, out, _ = run_cli(capsys, "runs", "list")
    assert code == 0 and "5 runs in" in out and BASE in out
    code, out, _ = run_cli(capsys, "runs", "list", "--study", "sweep", "--json")
    rows = json.loads(out)
    assert [r["concurrency"] for r in rows] == [1, 2, 4]
    assert all(r["metrics"]["ttft_ms.p99"] > 0 for r in rows)
    code, out, _ = run_cli(capsys, "runs", "list", "--tag", "candidate", "--json")
    assert [r["id"] for r in json.loads(out)] == ["bench-one-knob"]
    code, out, _ = run_cli(capsys, "runs", "list", "--studies", "--json")
    assert [(s["name"], s["runs"]) for s in json.loads(out)] == [("sweep", 3)]


def test_show_prints_the_section_16_record(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    code, out, _ = run_cli(capsys, "runs", "show", BASE)
    assert code == 0
    for heading in (
        "Experiment",
        "Model & precision",
        "Hardware",
        "Software stack",
        "Request distribution",
        "Core parameters",
        "Performance",
        "Quality",
        "Stability",
        "Conclusion",
    ):
        assert heading in out
    assert "max_num_seqs=64" in out and "TTFT ms P50/P95/P99" in out
    code, out, _ = run_cli(capsys, "runs", "show", "last", "--json")
    assert json.loads(out)["id"] == "bench-two-knobs"


def test_show_names_what_a_run_did_not_measure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed loop offers no rate, even when its load kept the rate of the arrival it
    replaced (bench's built-in workload run with --concurrency stores rate 1); an open
    loop shows its rate. GPU use and quality, which nothing records, say how to."""
    from servetune.results.schema import Load

    monkeypatch.setenv("SERVETUNE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("COLUMNS", "250")
    with Store.open(str(tmp_path / "runs.db")) as s:
        for rid, load in (
            ("closed", Load(kind="closed", rate=1.0, concurrency=2)),
            ("open", Load(kind="poisson", rate=2.5)),
        ):
            run, meta = synthetic_run(2, n_requests=20)
            run.id = meta.id = rid
            s.save_result(run.model_copy(update={"load": load}), meta)

    def shown(rid: str, label: str) -> str:
        code, out, _ = run_cli(capsys, "runs", "show", rid)
        assert code == 0
        return " ".join(next(line for line in out.splitlines() if line.startswith(label)).split())

    assert shown("closed", "rate (").startswith("rate (offered / achieved) - (closed")
    assert shown("open", "rate (").startswith("rate (offered / achieved) 2.5 req/s / ")
    assert "not measured: no GPU telemetry" in shown("closed", "GPU memory / util")
    assert "nvidia-smi" in shown("closed", "GPU memory / util")
    code, out, _ = run_cli(capsys, "runs", "list", "--json")
    assert {r["id"]: r["rate"] for r in json.loads(out)} == {"closed": None, "open": 2.5}
    code, out, _ = run_cli(capsys, "runs", "show", "closed")
    quality = out[out.index("Quality") :].splitlines()[1]
    assert "not measured" in quality and "set_quality" in " ".join(out.split())


def test_compare_highlights_exactly_the_differing_knob(
    capsys: pytest.CaptureFixture[str], db: Path
) -> None:
    code, out, _ = run_cli(capsys, "runs", "compare", BASE, "bench-one-knob", "--json")
    comp = json.loads(out)
    assert code == 0
    assert comp["differing"] == ["max_num_seqs"]
    assert comp["factors"]["max_num_seqs"] == [64, 32]
    assert comp["warnings"] == []
    ttft = next(m for m in comp["metrics"] if m["metric"] == "TTFT P99 ms")
    assert ttft["delta"][0] == 0 and ttft["pct"][1] == pytest.approx(
        100 * (ttft["values"][1] - ttft["values"][0]) / ttft["values"][0]
    )
    # each percentile rests on its own sample: an ITL P99 on the token gaps
    itl = next(m for m in comp["metrics"] if m["metric"] == "ITL P99 ms")
    code, shown, _ = run_cli(capsys, "runs", "show", BASE, "--json")
    assert itl["n"][0] == json.loads(shown)["metrics"]["itl_ms"]["count"] > ttft["n"][0]
    code, out, _ = run_cli(capsys, "runs", "compare", BASE, "bench-one-knob")
    assert f"(n={itl['n'][0]:g})" in out
    knob_table = out.split("Metrics (delta vs A)")[0]
    assert "max_num_seqs" in knob_table and "warning" not in out
    for same in ("enable_prefix_caching", "block_size", "load.concurrency", "model"):
        assert same not in knob_table


def test_compare_names_a_different_server_and_slo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one config at one load against two servers, one with an SLO: both
    differences are factors (before: "nothing else differs", the TPOT gap read as the
    knob's)."""
    from servetune.slo import SLO

    monkeypatch.setenv("SERVETUNE_DB", str(tmp_path / "runs.db"))
    with Store.open(str(tmp_path / "runs.db")) as s:
        for rid, port, slo in (("a", 8001, None), ("b", 8002, {"ttft_ms": {"p95": 800}})):
            run, meta = synthetic_run(2, n_requests=20)
            target = run.target.model_copy(update={"url": f"http://h:{port}"})
            update = {"target": target, "slo": SLO.model_validate(slo) if slo else None}
            run.id = meta.id = rid
            s.save_result(run.model_copy(update=update), meta)
    code, out, _ = run_cli(capsys, "runs", "compare", "a", "b", "--json")
    comp = json.loads(out)
    assert code == 0 and comp["differing"] == ["target.url", "slo"], comp["differing"]
    assert comp["factors"]["target.url"] == ["http://h:8001", "http://h:8002"]
    assert "2 things differ" in comp["warnings"][0]


def test_simulated_runs_of_two_servetune_builds_differ_in_their_simulator(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two simulated runs of one config by two servetune builds: the build is the factor
    (their simulators may price the config apart); a simulated run beside a real one is
    told apart by the backend alone, and two of one build have nothing differing."""
    from servetune.build import build_id

    monkeypatch.setenv("SERVETUNE_DB", str(tmp_path / "runs.db"))
    with Store.open(str(tmp_path / "runs.db")) as s:
        for rid, backend, build in (
            ("old", "sim", "0123456789ab"),
            ("new", "sim", None),
            ("new2", "sim", None),
            ("real", "real", None),
        ):
            run, meta = synthetic_run(2, n_requests=20, backend=backend)
            run.id = meta.id = rid
            if build:
                meta.software["servetune_build"] = build
            s.save_result(run, meta)

    def compared(*ids: str) -> dict:
        code, out, _ = run_cli(capsys, "runs", "compare", *ids, "--json")
        assert code == 0, out
        return json.loads(out)

    comp = compared("old", "new")
    assert comp["differing"] == ["software.servetune_build"], comp["differing"]
    assert comp["factors"]["software.servetune_build"] == ["0123456789ab", build_id()]
    assert compared("new", "new2")["differing"] == []
    assert compared("new", "real")["differing"] == ["backend"]


def test_compare_warns_when_more_than_one_knob_differs(
    capsys: pytest.CaptureFixture[str], db: Path
) -> None:
    code, out, _ = run_cli(capsys, "runs", "compare", BASE, "bench-two-knobs", "--json")
    comp = json.loads(out)
    assert comp["differing_knobs"] == ["max_num_seqs", "enable_prefix_caching"]
    assert len(comp["warnings"]) == 1 and "2 things differ" in comp["warnings"][0]
    code, out, _ = run_cli(capsys, "runs", "compare", f"{BASE},bench-two-knobs")
    assert code == 0 and "warning: 2 things differ" in " ".join(out.split())


def test_tag_conclude_export_import_delete(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    assert run_cli(capsys, "runs", "tag", "sweep", "prod")[0] == 0
    assert run_cli(capsys, "runs", "tag", BASE, "prod", "--remove")[0] == 0
    code, out, _ = run_cli(capsys, "runs", "list", "--tag", "prod", "--json")
    assert len(json.loads(out)) == 2
    assert run_cli(capsys, "runs", "conclude", BASE, "keep", "--note", "sweet spot")[0] == 0
    code, out, _ = run_cli(capsys, "runs", "show", BASE, "--json")
    assert json.loads(out)["conclusion"] == "keep"

    csv_path = tmp_path / "runs.csv"
    code, out, _ = run_cli(capsys, "runs", "export", "sweep", "-f", "csv", "-o", str(csv_path))
    rows = list(csv.DictReader(csv_path.open()))
    assert code == 0 and len(rows) == 3 and float(rows[0]["ttft_ms_p99"]) > 0
    assert rows[0]["cfg.max_num_seqs"] == "64"
    pq_path = tmp_path / "req.parquet"
    code, out, _ = run_cli(
        capsys, "runs", "export", BASE, "-f", "parquet", "--records", "-o", str(pq_path)
    )
    import pyarrow.parquet as pq

    assert code == 0 and pq.read_table(pq_path).num_rows == 40
    js = tmp_path / "all.json"
    assert run_cli(capsys, "runs", "export", "-f", "json", "-o", str(js))[0] == 0

    code, out, err = run_cli(capsys, "runs", "delete", "sweep")
    assert code == 2 and "--yes" in err
    assert run_cli(capsys, "runs", "delete", "sweep", "--yes")[0] == 0
    code, out, _ = run_cli(capsys, "runs", "list", "--json")
    assert len(json.loads(out)) == 2
    code, out, _ = run_cli(capsys, "runs", "import", str(js), "--db", str(tmp_path / "b.db"))
    assert code == 0 and out.count(": imported") == 5


def _one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0]


def test_bad_input_is_one_line_exit_2_and_leaves_data(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    _one_line_error(*run_cli(capsys, "runs", "show", "no-such-run"), "no run or study")
    _one_line_error(*run_cli(capsys, "runs", "compare", "bench-one-knbo", BASE), "did you mean")
    _one_line_error(*run_cli(capsys, "runs", "conclude", BASE, "maybe"), "verdict")
    _one_line_error(
        *run_cli(capsys, "runs", "export", "-f", "xml", "-o", str(tmp_path / "x")), "--format"
    )
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before

    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"\x00garbage" * 100)
    _one_line_error(*run_cli(capsys, "runs", "list", "--db", str(corrupt)), "not a SQLite")
    assert corrupt.read_bytes() == b"\x00garbage" * 100

    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.commit()
    con.close()
    fbytes = foreign.read_bytes()
    _one_line_error(*run_cli(capsys, "runs", "list", "--db", str(foreign)), "not a servetune")
    assert foreign.read_bytes() == fbytes

    con = sqlite3.connect(db)
    con.execute("UPDATE servetune_info SET value = '7' WHERE key = 'schema'")
    con.commit()
    con.close()
    newer = db.read_bytes()
    _one_line_error(*run_cli(capsys, "runs", "list"), "schema 7", "upgrade servetune")
    assert db.read_bytes() == newer

    _one_line_error(
        *run_cli(capsys, "runs", "list", "--db", "postgresql://x@127.0.0.1:1/db"), "cannot open"
    )


def test_entry_point_stays_light_and_errors_cleanly(tmp_path: Path) -> None:
    code = (
        "import sys, servetune.cli.app; print('sqlalchemy' in sys.modules, 'plotly' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "servetune.cli.app",
            "runs",
            "show",
            "x",
            "--db",
            str(tmp_path / "none.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    _one_line_error(out.returncode, out.stdout, out.stderr, "no servetune database")
