"""A writer killed with SIGKILL mid-run leaves a readable database: the run shows as
incomplete, every committed batch of records is there, and its metrics can be computed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from servetune.status import RunStatus
from servetune.store import Store

WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])  # the tests folder, for the synthetic runs
    from servetune.store import Store
    from synthetic_runs import synthetic_run

    result, meta = synthetic_run(8, n_requests=400)
    store = Store.open(sys.argv[1])
    run_id = store.begin_run(meta)
    print(run_id, flush=True)
    i = 0
    while True:  # append until killed; each batch is its own transaction
        batch = result.records[i % 400 : i % 400 + 10]
        store.append_records(run_id, batch)
        i += 10
        if i == 50:
            print("ready", flush=True)
    """
)


def _start(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "ready"
    return proc, run_id


def test_killed_writer_leaves_readable_db_with_run_incomplete(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    proc, run_id = _start(db)
    try:
        time.sleep(0.3)
        with Store.open(str(db), create=False) as reader:  # a reader while it writes
            assert reader.get(run_id).status == RunStatus.RUNNING
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-run, likely mid-transaction
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    stored_n, chunk_sum = con.execute(
        "SELECT n_records, (SELECT sum(n) FROM record_chunks WHERE run_id = runs.id) "
        "FROM runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    con.close()
    assert stored_n == chunk_sum >= 50  # committed batches and the counter agree

    with Store.open(str(db), create=False) as store:
        info = store.get(run_id)
        assert info.status == RunStatus.INCOMPLETE
        records = store.records(run_id)
        assert len(records) == stored_n
        result = store.load_result(run_id)  # metrics recomputed from what was kept
        assert result.status == RunStatus.INTERRUPTED and result.metrics.measured > 0
        assert [i.id for i in store.list_runs(status=RunStatus.INCOMPLETE)] == [run_id]

    with Store.open(str(db)) as writer:  # the next writer persists the verdict
        writer.begin_run({"model": "next"})
    con = sqlite3.connect(db)
    status = con.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    con.close()
    assert status == ("incomplete",)
