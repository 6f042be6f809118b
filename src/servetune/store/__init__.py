"""The experiment store (seed 003 §16): every run recorded, as it goes.

    from servetune.store import RunMeta, Store

    with Store.open(db) as store:                   # URL/path, $SERVETUNE_DB, ./servetune.db
        run_id = store.begin_run(RunMeta(model=..., engine_config=cfg.model_dump(),
                                         hardware=host_info(), study="sweep-1"))
        store.append_records(run_id, batch)         # repeatedly; each call is committed
        store.finish_run(run_id, result)            # the final RunResult
        # or, for a finished result:  store.save_result(result, meta, study=..., tags=...)
        store.import_file(path)                     # bench JSON / JSONL log / export JSON

Bench and simulate write through `ResultStore` (a store failure never stops a
measurement). SQLite by default (WAL where the library is safe), any SQLAlchemy URL for
a team (PostgreSQL tested). Schema migrations ship in `migrations/` and run on open;
foreign, corrupt or newer databases are refused with a one-line InputError. See docs/store.md.
"""

from __future__ import annotations

from servetune.store.meta import RunMeta, host_info, software_info
from servetune.store.runinfo import RunInfo
from servetune.store.store import Store
from servetune.store.writer import ResultStore

__all__ = ["ResultStore", "RunInfo", "RunMeta", "Store", "host_info", "software_info"]
