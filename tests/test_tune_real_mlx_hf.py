"""`tune --backend real` on the two engines without /metrics: MLX (mlx-lm's server) and
Hugging Face `transformers serve`, each on a two-config space over the seeded test Llama
with real weights. Each study must end with a recommendation, store every point as a
real run, and say that its figures are client-side (no server series, the report's note).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune.cli.tune_cmd import write_report
from servetune.status import TrialStatus
from servetune.store import Store
from servetune.tune.tuner import Tuner
from test_tune_real import _settings

# Bound per test, the two engine starts included.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(420)]

WORKLOAD = {
    "api": "completions",
    "count": 3,
    "input_tokens": {"dist": "fixed", "value": 32},
    "output_tokens": {"dist": "fixed", "value": 8},
    "arrival": {"kind": "closed", "concurrency": 1},
}
# Loose: the point is a finished study on a busy host, not which config wins.
SLO = {"ttft_ms": {"p95": 30000}, "tpot_ms": {"p95": 5000}, "error_rate": 0.25}


def _study(tmp: Path, engine: str, model: Path, knob_flag: str, fixed: dict) -> None:
    """A two-config study (max_num_seqs 1 vs 4) that must end with a recommendation and a
    stored, client-side-only study; `knob_flag` is what max_num_seqs 4 turns into. One
    load point a config (1 user): the point is the flow, not which config wins."""
    space = {"engine": engine, "fixed": fixed, "baseline": {"max_num_seqs": 1},
             "knobs": {"max_num_seqs": [1, 4]}}  # fmt: skip
    s = _settings(tmp, space, engine=engine, model=str(model / "config.json"),
                  model_path=str(model), workload=WORKLOAD, slo=SLO, max_load=1,
                  repeats=0)  # fmt: skip
    tuner = Tuner(s)
    out = tuner.run()
    assert len(out.ranked) == 2  # the baseline is not run twice
    assert all(t.status == TrialStatus.OK for t in out.ranked), [t.reason for t in out.ranked]
    # the recommendation: a winner with the command that launches it
    assert out.winner is not None and out.winner.launch_command
    assert out.baseline is not None and out.baseline.config["max_num_seqs"] == 1
    by_seqs = {t.config["max_num_seqs"]: t for t in out.ranked}
    assert knob_flag in by_seqs[4].launch_command
    assert knob_flag not in by_seqs[1].launch_command
    with Store.open(str(tmp / "real.db")) as st:
        meta = st.study_meta("real")  # the study itself, with its recommendation
        assert meta is not None and meta["status"] == "done"
        assert meta["summary"]["winner"]["launch_command"] == out.winner.launch_command
        runs = st.list_runs(study="real")
        assert len(runs) >= 2 and all(r.backend == "real" and r.n_records > 0 for r in runs)
        results = [st.load_result(r.id) for r in runs]
    assert all(res.target.engine == engine and res.server is None for res in results)
    write_report(tuner.store, out, tmp / "report.html")  # what `servetune tune` does
    assert out.report_path is not None
    html = out.report_path.read_text()
    assert f"{engine} exports no /metrics" in html and "client-side" in html


def test_mlx_decode_concurrency_study(tmp_path: Path) -> None:
    from servetune.engines.install import install_mlx
    from servetune.engines.testmodel import make_llama_weights

    install_mlx(say=lambda _: None)
    _study(tmp_path, "mlx", make_llama_weights(), "--decode-concurrency 4", {})


def test_transformers_continuous_batching_study(tmp_path: Path) -> None:
    from servetune.engines.install import install_transformers
    from servetune.engines.testmodel import make_llama_weights

    install_transformers(say=lambda _: None)
    # float32: the test Llama's float16 weights decode ~2.8x slower on this CPU
    _study(tmp_path, "transformers", make_llama_weights(), "--continuous-batching",
           {"dtype": "float32"})  # fmt: skip
