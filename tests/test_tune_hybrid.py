"""The hybrid flow on the real llama.cpp + Gemma 3 270M, short: the simulator is calibrated
on the engine before it ranks anything, and every verified config gets a sim-vs-real line.
What is asserted is the flow, not the figures: the errors move with the host's load."""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune.measure import BackendSpec
from servetune.sim.profile import load_profile
from servetune.slo import parse_slo
from servetune.tune.calibration import CalibrationCache, calibrate_first
from servetune.tune.capacity import concurrency_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import parse_space
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import Tuner, TuneSettings
from servetune.workload.spec import parse_workload

pytestmark = pytest.mark.engine


@pytest.mark.timeout(900)  # ~3-5 min on a busy 2-core host, engine starts included
def test_hybrid_calibrates_first_then_prints_sim_vs_real(
    llamacpp_install, gemma_gguf, tmp_path: Path
) -> None:
    workload = parse_workload(
        {
            "name": "hybrid-test",
            "api": "completions",
            "count": 4,
            "input_tokens": {"dist": "uniform", "low": 32, "high": 64},
            "output_tokens": {"dist": "fixed", "value": 8},
            "arrival": {"kind": "closed", "concurrency": 1},
        }
    )
    common = dict(
        engine="llamacpp",
        model="gemma-3-270m",
        hardware="cpu-host",
        workload=workload.model_dump(mode="json"),
        slo=parse_slo({"ttft_ms": {"p95": 60000}}).model_dump(mode="json", exclude_none=True),
        per_user=2,
        request_timeout_s=60,
        launch_timeout_s=240,
    )
    sim = BackendSpec(kind="sim", **common)
    real = BackendSpec(kind="real", model_path=str(gemma_gguf), device="cpu", **common)
    space = parse_space({"engine": "llamacpp", "fixed": {"threads": 1},
                         "knobs": {"parallel_slots": [1, 2]}})  # fmt: skip
    settings = TuneSettings(
        space=space,
        mode="hybrid",
        objective=Objective("goodput"),
        search=SearchSettings("concurrency", concurrency_lattice(2), max_probes=2),
        sim=sim,
        real=real,
        strategy="grid",
        top_k=1,
        finalists=0,
        repeats=0,
        db=str(tmp_path / "hybrid.db"),
        study="hybrid",
        edge=False,
        verbose=False,
        calibration_dir=str(tmp_path / "calibration"),
        time_budget_s=120,
    )
    said: list[str] = []
    tuner = Tuner(settings, said.append)
    out = tuner.run()

    # calibrated first: the sweep and the fit are said before the simulator ranks
    first_cal = next(i for i, m in enumerate(said) if m.startswith("calibration: "))
    ranked = next(i for i, m in enumerate(said) if "simulator ranked" in m)
    assert first_cal < ranked
    assert any(m.startswith("calibration: cal-study-c4: ") for m in said[:ranked])
    cal = out.calibration
    assert cal is not None and not cal.reused
    assert tuner.s.sim is not None and tuner.s.sim.profile == cal.entry.profile
    assert load_profile(cal.entry.profile).fit.method == "least squares + replay"

    # a sim-vs-real line per verified config, and the check recorded in the cache
    lines = [m for m in said if "sim vs real, " in m]
    assert len(lines) == len(out.sim_vs_real) >= 1
    assert all("req/s/GPU" in m and "P50 TTFT" in m and "P50 TPOT" in m for m in lines)
    assert all(row["req_s_error"] is not None for row in out.sim_vs_real)
    # one verdict line: each judged figure against 25% and the host's floor (the baseline
    # trial against the sweep it shares users with: 1 and 2 here), in the cache check too
    verdict = next(m for m in said if "sim vs real on " in m)
    assert set(out.sim_error) == {"req_s", "ttft_p50", "tpot_p50"}
    for fig in out.sim_error.values():
        assert fig["verdict"] in ("met", "missed", "too noisy") and fig["floor"] is not None
    assert "throughput" in verdict and "floor" in verdict
    assert cal.check is not None and cal.check["figures"] == out.sim_error
    cache = CalibrationCache(tmp_path / "calibration")
    entry = cache.load(cal.key)
    assert entry is not None and len(entry.checks) == 1
    # stale when the check missed, or from the start when the fit itself had low
    # confidence (a busy host's sweep: `Profile.fit_for_use`; seen in CI once)
    fit_ok = load_profile(cal.entry.profile).fit_for_use
    assert (entry.stale is None) == (cal.check["stale"] is None and fit_ok), entry.stale
    if not fit_ok and cal.check["stale"] is None:
        assert entry.stale == "its fit has low confidence"

    # the next study calibrates again when the check marked the profile stale; else it
    # reuses it only if it predicts the baseline measured now (one block of the sweep)
    again = calibrate_first(real, sim, space.baseline_config(), cache=cache, force=False,
                            say=said.append)  # fmt: skip
    if entry.stale is not None:
        assert not again.reused and again.baseline_check is None
    else:
        check = again.baseline_check
        assert check is not None and again.reused == check.holds
        assert set(check.errors) == {"req_s", "ttft_p50", "tpot_p50"}
        assert any("calibration check on this study's baseline" in m for m in said)
        assert cache.load(cal.key).checks[-1]["kind"] == "baseline"
