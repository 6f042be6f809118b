"""The store's side of `quality`: each model's throughput, P99 and errors from a stored
bench run (the result itself goes in with `Store.set_quality`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.quality.verdict import Perf
from servetune.store import Store
from servetune.store.runinfo import RunInfo
from servetune.tune.objective import gpus_of


def resolve_one(store: Store, ref: str, flag: str) -> str:
    """The one bench run `ref` names. A simulated run is refused: §2 judges the measured
    throughput, P99 and errors, and a simulation measured none of them."""
    ids = store.resolve([ref])
    if len(ids) != 1:
        raise InputError(flag, f"{ref!r} names {len(ids)} runs", "give one run id")
    if store.get(ids[0]).backend == "sim":
        raise InputError(
            flag,
            f"{ids[0]} is a simulated run, not a measurement",
            "give a bench run of the build (servetune bench)",
        )
    return ids[0]


# What may differ between the two runs' workloads: the load is compared on its own, the
# rest (names, seeds, how many requests) does not change what a token costs.
_FREE = ("arrival", "count", "duration_s", "warmup_s", "cooldown_s", "seed", "name")


def check_comparable(store: Store, baseline: str, candidate: str) -> None:
    """§2 compares the builds' throughput, P99 and errors: only runs of the same workload
    at the same load say which build carries more. A candidate measured at twice the
    concurrency shows +90% throughput that is the load's, not the build's."""
    b = store.get(resolve_one(store, baseline, "--baseline-run"))
    c = store.get(resolve_one(store, candidate, "--candidate-run"))
    if b.id == c.id:  # one build against itself: +0%, "no gain", whatever the builds are
        raise InputError(
            "--candidate-run", f"is the baseline run itself ({b.id})", "bench the candidate build"
        )
    if b.load_label() != c.load_label():
        raise InputError(
            "--candidate-run",
            f"measured at {c.load_label()}, the baseline run at {b.load_label()}",
            "bench both builds at one load (a saturating one, e.g. --concurrency 64)",
        )
    bw, cw = (
        {k: v for k, v in (r.part("workload") or {}).items() if k not in _FREE} for r in (b, c)
    )
    if bw and cw and bw != cw:
        differ = sorted(k for k in bw.keys() | cw.keys() if bw.get(k) != cw.get(k))
        raise InputError(
            "--candidate-run",
            f"its workload differs from the baseline run's ({', '.join(differ)})",
            "bench both builds with one workload file",
        )


def perf(store: Store, ref: str, flag: str) -> Perf:
    """What §2's rule reads from the run (metrics computed from the records for a run
    that never finished)."""
    run_id = resolve_one(store, ref, flag)
    info = store.get(run_id)
    return Perf.from_metrics(store.metrics(info), build_gpus(info))


def build_gpus(info: RunInfo) -> int | None:
    """GPUs the measured build occupies (TP x PP x DP of its engine config), not the
    host's count: a TP=2 build and a TP=1 build on one 8-GPU host cost 2 and 1 GPUs.
    The host's count only when the run recorded no usable config."""
    cfg: dict[str, Any] = info.engine_config or dict(info.target.config or {})
    if not cfg:
        return info.gpu_count
    try:
        return gpus_of(EngineConfig.model_validate(cfg))
    except ValidationError:
        return info.gpu_count
