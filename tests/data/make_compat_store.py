"""Write `compat_store.db`: a small experiment store as an older servetune wrote it, so
tests can check that the current code still reads every run stored before a schema change.

Run it with the servetune whose format is to be frozen on the path, e.g.

    PYTHONPATH=/path/to/old/checkout/src python tests/data/make_compat_store.py

It stores, in one SQLite file: a bench sweep (two rates) against the mock server, one
`simulate` run, a two-config `tune --backend sim` study, and the point-level runs a real
tune backend writes (a measured point, an interrupted one and a launch failure; the
simulator stands in for the engine), then compacts the file.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "compat_store.db"

WORKLOAD = """\
name: compat
count: 20
arrival: {kind: poisson, rate: 20}
input_tokens: {dist: fixed, value: 20}
output_tokens: {dist: fixed, value: 6}
"""
SLO = "ttft_ms: {p95: 800}\ntpot_ms: {p95: 40}\n"
SIM_WORKLOAD = """\
name: compat-sim
count: 40
arrival: {kind: poisson, rate: 5}
input_tokens: {dist: fixed, value: 256}
output_tokens: {dist: fixed, value: 16}
"""
SPACE = """\
engine: vllm
fixed: {max_model_len: 4096}
knobs:
  max_num_seqs: [8, 32]
"""
TUNE_WORKLOAD = """\
name: compat-tune
count: 16
arrival: {kind: closed, concurrency: 1}
input_tokens: {dist: fixed, value: 128}
output_tokens: {dist: fixed, value: 16}
"""


def cli(*args: str, cwd: Path) -> None:
    """One servetune command in a child process (same interpreter and PYTHONPATH)."""
    cmd = [sys.executable, "-m", "servetune.cli.app", *args]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"servetune {args[0]} failed:\n{done.stderr}")


def tune_points(db: str) -> None:
    """What a real-engine study stores per point, written through the tuner's recorder.
    The imports and calls are those of the servetune being frozen (the one on the path
    when this runs), not the current tree's: do not update them with the code."""
    import yaml  # noqa: I001 - tune.backends is the old layout's module

    from servetune.engines.config import EngineConfig
    from servetune.tune.backends import BackendSpec, Infeasible, SimBackend
    from servetune.tune.space import config_key
    from servetune.tune.study import Recorder
    from servetune.tune.trial import point_id

    class Stand_in(SimBackend):
        name = "real"

    spec = BackendSpec(
        kind="sim",
        engine="vllm",
        model="llama-3.1-8b",
        hardware="h100-sxm",
        workload=yaml.safe_load(TUNE_WORKLOAD),
        slo=yaml.safe_load(SLO),
    )
    backend = Stand_in(spec)
    rec = Recorder(db, "compat-points", "real")
    cfg = EngineConfig(engine="vllm", max_num_seqs=16, max_model_len=4096)
    key = config_key(cfg)
    with backend.session(cfg) as sess:
        for load, finish in ((2.0, True), (4.0, False)):
            where = ("concurrency", load, "probe", 0)
            pid = point_id(key, *where)
            run_id = rec.begin_point(pid, backend, cfg, sess.launch_command, where)
            point, res = sess.probe("concurrency", load)
            if finish:
                rec.finish_point(pid, run_id, res, point)
            else:
                rec.abandon_point(run_id)
    bad = EngineConfig(engine="vllm", max_num_seqs=512, max_model_len=4096)
    exc = Infeasible("oom", "CUDA out of memory", ["loading weights", "torch.OutOfMemoryError"])
    rec.record_failure(point_id(config_key(bad), "launch", 0, "launch"), backend, bad, exc)
    rec.store.close()


def cli_runs(db: str, workdir: Path) -> None:
    """The bench sweep, the simulate run and the tune study, through the command line
    (the same commands work on the old and the current servetune)."""
    from servetune.mock.server import MockConfig, mock_in_thread

    files = {
        "w.yaml": WORKLOAD,
        "slo.yaml": SLO,
        "sim.yaml": SIM_WORKLOAD,
        "space.yaml": SPACE,
        "tune.yaml": TUNE_WORKLOAD,
    }
    for name, text in files.items():
        (workdir / name).write_text(text)
    with mock_in_thread(MockConfig()) as srv:
        cli("bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", "w.yaml",
            "--rate", "20,40", "--slo", "slo.yaml", "--tokenizer", "word",
            "--study", "compat-bench", "--db", db, cwd=workdir)  # fmt: skip
    cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
        "--set", "max_num_seqs=32", "--set", "max_model_len=4096",
        "--workload", "sim.yaml", "--slo", "slo.yaml", "--db", db, cwd=workdir)  # fmt: skip
    cli("tune", "--backend", "sim", "--engine", "vllm", "--model", "llama-3.1-8b",
        "--gpu", "h100-sxm", "--space", "space.yaml", "--workload", "tune.yaml",
        "--slo", "slo.yaml", "--strategy", "grid", "--max-load", "4", "--no-edge",
        "--study", "compat-tune", "--db", db, "-o", "r.html", "-q", cwd=workdir)  # fmt: skip


def main() -> None:
    OUT.unlink(missing_ok=True)
    db = f"sqlite:///{OUT}"
    with tempfile.TemporaryDirectory() as tmp:
        cli_runs(db, Path(tmp))
    tune_points(db)
    con = sqlite3.connect(OUT)
    con.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
    con.execute("VACUUM")
    con.close()
    os.chmod(OUT, 0o644)
    print(f"{OUT.name}: {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
