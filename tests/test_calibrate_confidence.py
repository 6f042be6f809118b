"""The calibrated profile's confidence rules (`sim.confidence`) and what a low one is
refused: synthetic runs (the simulator under a known profile, or hand-made noise), fast."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calibrate_truth import CFG, TRUTH, scaled, sim_run
from servetune.engines.config import EngineConfig
from servetune.results.files import write_result
from servetune.results.schema import RunResult
from servetune.sim.calibrate import fit_profile, repeat_spread
from servetune.sim.confidence import Coverage, Fit, coverage_of, judge
from servetune.sim.profile import FitQuality, load_profile
from servetune.validate import calibration_cases, closed_workload, fixed_tokens
from servetune.workload.spec import PrefixGroups

FULL = Coverage(8, 4, 1, 2, 1, 1, fastest_ttft_s=0.05)
GOOD = Fit("least squares + replay", 900, 0.4, 0.08, [], 6, 0.004)


def test_a_good_fit_of_runs_that_cover_everything_is_high() -> None:
    v = judge(GOOD, FULL)
    assert (v.confidence, v.problems, v.fixes) == ("high", [], [])


def test_a_fit_rule_failed_is_low_and_names_the_rule_and_the_fix() -> None:
    v = judge(replace(GOOD, error=0.296), FULL)  # the profile: 29.6% RMS log error
    assert v.confidence == "medium"  # 29.6% <= 30%: usable, said
    v = judge(replace(GOOD, error=0.35), FULL)
    assert v.confidence == "low" and "35% RMS log error" in v.problems[0]
    # the profile: a per-chunk API overhead of 1.5 s, the fastest TTFT 50 ms
    v = judge(replace(GOOD, api_overhead_s=1.5), FULL)
    assert v.confidence == "low" and "1,500 ms exceeds the fastest TTFT" in v.problems[0]
    assert any("batch 1" in f for f in v.fixes)
    # least squares only: R^2 0.014 is low, 0.6 medium, 0.95 on 900 gaps high
    ls = replace(GOOD, method="least squares", error=0.3)
    assert judge(replace(ls, r2=0.014), FULL).confidence == "low"
    assert judge(replace(ls, r2=0.6), FULL).confidence == "medium"
    assert judge(replace(ls, r2=0.95), FULL).confidence == "high"


def test_a_replay_error_is_put_on_the_host_only_when_repeats_differ_as_much() -> None:
    """The fix a replay error gets follows its cause: unknown without repeats; the host
    when repeats of one workload differ by most of the error; else the replay's knobs or
    a cost the step model lacks, with the worst-replayed runs named."""
    bad = replace(GOOD, error=0.35, worst=("cal-c2-p768 45%", "cal-c4-p64 31%"))
    assert "--repeats 2 or more" in judge(bad, FULL).fixes[0]
    host = judge(replace(bad, spread=0.30), FULL)
    assert "quieter host" in host.fixes[0] and "repeats differ by 30%" in host.problems[0]
    misfit = judge(replace(bad, spread=0.05), FULL)
    assert misfit.confidence == "low" and "quieter host" not in misfit.fixes[0]
    assert "--set" in misfit.fixes[0] and "(cal-c2-p768 45%, cal-c4-p64 31%)" in misfit.fixes[0]
    # the line is spread^2 = error^2 / 2 (24.7% of 35%); a medium verdict gets the same fix
    assert "--set" not in judge(replace(bad, spread=0.25), FULL).fixes[0]
    assert "--set" in judge(replace(bad, spread=0.24), FULL).fixes[0]
    # a host this noisy is a cause too (past the 15% a high profile may miss): both said
    both = judge(replace(bad, error=0.75, spread=0.42), FULL).fixes[0]
    assert "quieter host" in both and "--set" in both
    mid = judge(replace(bad, error=0.2, spread=0.02), FULL)
    assert mid.confidence == "medium" and "--set" in mid.fixes[0]


def test_repeat_spread_reads_how_far_repeats_of_one_workload_differ() -> None:
    """A repeat on an engine 1.5x as slow in everything moves every figure by log 1.5;
    each of the two runs carries half of it in squares. Identical repeats differ by 0, and
    runs of different workloads are never compared."""
    slow = scaled(TRUTH, 1.5)
    w = closed_workload("w", 2, 6, fixed_tokens(200), fixed_tokens(8))
    other = closed_workload("other", 1, 4, fixed_tokens(64), fixed_tokens(8))
    one, again, slower, alone = sim_run(w), sim_run(w), sim_run(w, slow), sim_run(other)
    spread = repeat_spread([one, slower, alone])
    assert spread == pytest.approx(np.log(1.5) / np.sqrt(2), rel=0.05)
    assert repeat_spread([one, again, alone]) == 0.0
    assert repeat_spread([one, alone]) is None


def test_a_fit_on_the_least_disturbed_runs_keeps_the_spread_of_all_measured() -> None:
    """The harness fits, as `calibrate --url` does, on the least disturbed run of each
    workload (`least_disturbed_per_case`): those no longer repeat, so the spread that tells
    the host from a misfit is read over every run measured, when the caller gives them."""
    from servetune.validate import compare_saved, least_disturbed_per_case

    slow = TRUTH.model_copy(
        update={"coefficients": {k: 1.5 * v for k, v in TRUTH.coefficients.items()}}
    )
    sweep = {c.name: c for c in calibration_cases()}
    runs = [
        sim_run(sweep[name], prof)
        for prof in (TRUTH, slow)
        for name in ("cal-c1-p64", "cal-c4-p64", "cal-c2-p768")
    ]
    fitted = least_disturbed_per_case(runs)
    assert len(fitted) == 3
    alone, _, _ = compare_saved(fitted, "llama-3.2-1b", CFG)
    assert alone.fit is not None and alone.fit.repeat_spread is None
    prof, _, _ = compare_saved(fitted, "llama-3.2-1b", CFG, measured=runs)
    assert prof.fit is not None and prof.fit.repeat_spread == pytest.approx(repeat_spread(runs))
    assert 0.1 < prof.fit.repeat_spread < np.log(1.5) / np.sqrt(2) + 0.01


def test_a_replay_on_the_wrong_knobs_is_not_blamed_on_the_host(tmp_path: Path) -> None:
    """`calibrate` on result files of an engine that batches 4 sequences, two repeats of
    each workload, told (--set) that it ran one at a time: the repeats agree exactly, so
    the verdict asks for the server's knobs, names the runs the profile misses most, and
    the profile keeps the spread it was judged with."""
    sweep = {c.name: c for c in calibration_cases()}
    files = []
    for rep in (0, 1):
        for name in ("cal-c1-p64", "cal-c4-p64", "cal-c2-p768"):
            path = tmp_path / f"{name}-r{rep}.json"
            write_result(sim_run(sweep[name]), path)
            files.append(str(path))
    out = tmp_path / "prof.json"
    run = subprocess.run(
        [sys.executable, "-c", "from servetune.cli.app import main; main()", "calibrate",
         *files, "--model", "llama-3.2-1b", "--gpu", "cpu-host", "--set", "max_num_seqs=1",
         "--set", "max_model_len=2048", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "repeats differ by 0.0%" in run.stdout, run.stdout
    fit = load_profile(out).fit
    assert fit is not None and fit.repeat_spread == 0.0 and fit.rel_rmse > 0.3
    assert fit.confidence == "low" and "quieter host" not in " ".join(fit.fixes)
    fix = next(f for f in fit.fixes if "--set" in f)
    assert "cal-c4-p64" in fix, fix  # the run whose batching the replay cannot reproduce
    assert "NOT FIT FOR USE" in run.stderr and fix in run.stderr


def test_coverage_gaps_cap_at_medium_and_say_which_runs_to_add() -> None:
    closed_only = Coverage(6, 2, 0, 0, 0, 0, fastest_ttft_s=0.05)
    v = judge(
        replace(GOOD, dropped=["decode_seqs", "kv_read_tokens", "attn_pairs", "x"]), closed_only
    )
    assert v.confidence == "medium"
    assert any("batch sizes of 4 or more" in f for f in v.fixes)
    assert any("prefix-cache runs" in f for f in v.fixes)
    assert any("gamma arrivals" in f for f in v.fixes)
    assert any("span 4x" in f for f in v.fixes)
    assert any("4 of 6 step terms dropped" in p for p in v.problems)
    # one failed fit rule makes the same runs low
    assert judge(replace(GOOD, error=0.5), closed_only).confidence == "low"


def test_a_gap_the_predicted_workload_does_not_exercise_is_none() -> None:
    """The tuner's profile ranks one study's workload: with its needs given, a sweep of
    closed loops without prefixes or mixed lengths lacks only what that workload has."""
    closed_only = Coverage(6, 4, 0, 0, 0, 0, fastest_ttft_s=0.05)
    plain = Coverage(1, 4, 0, 0, 0, 0, fastest_ttft_s=None)
    assert judge(GOOD, closed_only, plain).confidence == "high"
    assert judge(GOOD, closed_only).confidence == "medium"  # a profile for any workload
    prefixed = judge(GOOD, closed_only, replace(plain, prefix_runs=1))
    assert prefixed.confidence == "medium" and prefixed.problems == ["no prefix-cache runs"]
    small = judge(GOOD, replace(closed_only, max_batch=2), plain)
    assert small.problems == ["batches of at most 2 requests"]


def test_coverage_is_read_off_the_runs() -> None:
    fixed = fixed_tokens
    plain = sim_run(closed_workload("c2", 2, 6, fixed(100), fixed(8)))
    cov = coverage_of([plain])
    assert (cov.max_batch, cov.prefix_runs, cov.bursty_runs, cov.mixed_length_runs) == (2, 0, 0, 0)
    assert 0 < cov.fastest_ttft_s < 1
    sweep = {c.name: c for c in calibration_cases()}
    runs = [sim_run(sweep[n]) for n in ("cal-c4-p64", "cal-mix-gamma-prefix", "cal-c4-prefix")]
    cov = coverage_of(runs)
    assert cov.max_batch == 4 and cov.prefix_runs == 2
    assert (cov.open_loop_runs, cov.bursty_runs, cov.mixed_length_runs) == (1, 1, 1)
    prefixed = closed_workload("p", 2, 4, fixed(300), fixed(8), prefix=PrefixGroups(tokens=200))
    assert coverage_of([sim_run(prefixed)]).prefix_runs == 1


def test_the_default_sweep_covers_what_the_rules_ask_for() -> None:
    """Simulated runs of the default sweep leave no coverage gap: a good fit is high."""
    cov = coverage_of([sim_run(c) for c in calibration_cases()])
    assert judge(GOOD, cov).confidence == "high", judge(GOOD, cov)


def noise_run(seed: int) -> RunResult:
    """A simulated run whose chunks are then moved to random gaps: a valid result with no
    step structure to fit."""
    rng = np.random.default_rng(seed)
    base = sim_run(closed_workload("noise", 2, 12, fixed_tokens(100), fixed_tokens(20), seed=seed))
    recs = []
    for r in base.records:
        gaps = rng.exponential(0.05e9, size=len(r.chunk_ns))
        chunks = (r.send_ns + np.cumsum(gaps)).astype(int).tolist()
        recs.append(r.model_copy(update={"chunk_ns": chunks, "end_ns": chunks[-1]}))
    return base.model_copy(update={"records": recs, "id": f"noise{seed}"})


def test_fit_profile_marks_a_fit_of_noise_low() -> None:
    prof = fit_profile([noise_run(0), noise_run(1)], engine="vllm", model="m", hardware="h")
    assert prof.fit is not None and prof.fit.confidence == "low"
    assert prof.fit.problems and prof.fit.fixes
    assert not prof.fit_for_use and "LOW confidence" in (prof.warning() or "")


def test_calibrate_writes_a_low_profile_marked_and_says_so(tmp_path: Path) -> None:
    """The CLI: exit 0, the file written with confidence low and its problems, and a loud
    NOT FIT FOR USE block with the fixes on stderr; `simulate --profile` warns on it."""
    files = []
    for seed in (0, 1):
        path = tmp_path / f"noise{seed}.json"
        write_result(noise_run(seed), path)
        files.append(str(path))
    out = tmp_path / "prof.json"
    code = "from servetune.cli.app import main; main()"
    run = subprocess.run(
        [sys.executable, "-c", code, "calibrate", *files, "--model", "llama-3.2-1b",
         "--gpu", "cpu-host", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "NOT FIT FOR USE" in run.stderr and "fix: " in run.stderr
    fit = json.loads(out.read_text())["fit"]
    assert fit["confidence"] == "low" and fit["problems"] and fit["fixes"]
    assert not load_profile(out).fit_for_use
    sim = subprocess.run(
        [sys.executable, "-c", code, "simulate", "--model", "llama-3.2-1b", "--gpu",
         "cpu-host", "--profile", str(out), "--replay", files[0], "--no-store", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert "LOW confidence" in sim.stderr


def test_the_tuner_cache_never_offers_a_low_profile_again(tmp_path, monkeypatch) -> None:
    """A sweep whose fit is low ranks its own study (said loudly) but its cache entry is
    stale: the next study calibrates again instead of reusing it."""
    from servetune.measure import BackendSpec
    from servetune.tune import calibration as cal

    key = cal.CalibrationKey("vllm", "v1", "/m/model", 1, 1, "cpu|2")
    common = dict(engine="vllm", model="llama-3.2-1b", hardware="cpu-host", slo={})
    wl = closed_workload("main", 1, 4, fixed_tokens(64), fixed_tokens(8))
    real, sim = (
        BackendSpec(kind=kind, workload=wl.model_dump(mode="json"), **common)
        for kind in ("real", "sim")
    )

    low = TRUTH.model_copy(
        update={
            "fit": FitQuality(samples=50, r2=0.01, rel_rmse=0.5, confidence="low",
                              problems=["bad"], fixes=["add runs"]),
        }
    )  # fmt: skip
    calls: list[str] = []

    def sweep(real, cfg, cases, *, say, keep, stop=None):
        calls.append("sweep")
        return [], "v1"

    monkeypatch.setattr(cal, "key_for", lambda real, cfg: key)
    monkeypatch.setattr(cal, "run_sweep", sweep)
    monkeypatch.setattr(cal, "fit", lambda runs, real, cfg, version, measured, needs: low)
    cache, said = cal.CalibrationCache(tmp_path), []
    base = EngineConfig(engine="vllm")
    one = cal.calibrate_first(real, sim, base, cache=cache, force=False, say=said.append)
    assert not one.reused and any("LOW confidence" in s for s in said)
    assert cache.load(key).stale == "its fit has low confidence"
    two = cal.calibrate_first(real, sim, base, cache=cache, force=False, say=said.append)
    assert not two.reused and "low confidence" in two.why and calls == ["sweep", "sweep"]
