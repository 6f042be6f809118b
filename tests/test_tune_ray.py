"""The Ray executor: a local Ray cluster (started here, loopback only) runs simulator
trials in parallel, and every worker writes into the same store."""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune.status import TrialStatus
from servetune.store import Store
from servetune.tune.tuner import Tuner

ray = pytest.importorskip("ray")


@pytest.mark.paced  # two Ray workers must both start and overlap
def test_ray_runs_sim_trials_in_parallel_into_one_store(tmp_path: Path) -> None:
    from test_tune_sim import CHAT, sim_settings

    space = {
        "engine": "vllm",
        "fixed": {"max_model_len": 8192},
        "knobs": {"max_num_seqs": [8, 16, 32, 64, 128, 256], "gpu_memory_utilization": [0.9]},
    }
    s = sim_settings(tmp_path, space, strategy="grid", study="ray", executor="ray", num_cpus=2,
                     workload={**CHAT, "count": 400})  # fmt: skip
    try:
        out = Tuner(s).run()
    finally:
        if ray.is_initialized():
            ray.shutdown()
    trials = out.ranked
    assert len(trials) == 7 and all(t.status == TrialStatus.OK for t in trials)
    workers = {t.worker for t in trials}
    assert len(workers) >= 2, workers  # more than one process ran trials
    spans = sorted((t.started_unix_s, t.ended_unix_s) for t in trials)
    overlaps = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    assert overlaps, spans  # some trials ran at the same time
    with Store.open(str(tmp_path / "tune.db")) as st:
        runs = [r for r in st.list_runs(study="ray") if "trial" in r.tags]
    assert sorted(r.tune.key for r in runs) == sorted(t.key for t in trials)
    assert out.winner is not None and out.winner.score > 0
