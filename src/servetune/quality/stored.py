"""The store's side of `quality`: each model's throughput, P99 and errors from a stored
bench run (the result itself goes in with `Store.set_quality`)."""

from __future__ import annotations

from servetune.errors import InputError
from servetune.quality.verdict import Perf
from servetune.store import Store


def resolve_one(store: Store, ref: str, flag: str) -> str:
    ids = store.resolve([ref])
    if len(ids) != 1:
        raise InputError(flag, f"{ref!r} names {len(ids)} runs", "give one run id")
    return ids[0]


def perf(store: Store, ref: str, flag: str) -> Perf:
    """What §2's rule reads from the run (metrics computed from the records for a run
    that never finished)."""
    run_id = resolve_one(store, ref, flag)
    info = store.get(run_id)
    m = info.metrics or store.load_result(run_id).metrics.model_dump(mode="json")
    return Perf.from_metrics(m, info.gpu_count)
