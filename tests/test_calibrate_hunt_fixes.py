"""Calibration and profile defects a bug hunt found, each pinned: bad profile values, a
sweep's load points read as repeats, a fit of two models, a low profile ranking a study
unsaid, replays of runs their engine did not serve whole, the tuner's profile check on a
fresh simulated engine per run, runs of nothing but errors fitted. Synthetic runs (the
simulator under a known profile, made to look measured), fast."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from calibrate_truth import CFG, TRUTH, scaled
from calibrate_truth import sim_run as truth_run
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.results.files import write_result
from servetune.results.schema import RunResult
from servetune.sim.calibrate import (
    fit_coefficients,
    repeat_spread,
    replay_inputs,
    replay_note,
)
from servetune.sim.profile import FitQuality, Profile, load_profile
from servetune.sim.steptime import FEATURES
from servetune.status import RequestStatus
from servetune.validate import closed_workload, fixed_tokens

M, HW = get_model("llama-3.2-1b"), get_hardware("cpu-host")
FIX = "recalibrate (servetune calibrate)"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    code = "from servetune.cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )


def sim_run(
    w, profile: Profile = TRUTH, *, shapes: set[int] | None = None, t0: float = 0.0
) -> RunResult:
    """`calibrate_truth.sim_run`, started at `t0` (the order calibrate reads runs in)."""
    res = truth_run(w, profile, shapes=shapes)
    return res.model_copy(update={"started_unix_s": t0})


def as_bench(run: RunResult, model: str = "m") -> RunResult:
    """`run` as a bench run of a server that serves `model` (no simulator counters)."""
    d = run.model_dump(mode="json")
    d["target"].pop("sim", None)
    d["target"]["model"], d["backend"] = model, "real"
    return RunResult.model_validate(d)


def stopped(run: RunResult, sent: int, failed: int, cancelled: int) -> RunResult:
    """`run` as if it had sent only its first `sent` requests (a circuit breaker), of
    which the first `failed` failed (HTTP 500, nothing streamed) and the next `cancelled`
    were cancelled."""
    recs = sorted(run.records, key=lambda r: r.index)[:sent]
    out = []
    for i, r in enumerate(recs):
        if i < failed:
            r = r.model_copy(
                update={"status": RequestStatus.ERROR, "http_status": 500, "chunk_ns": [],
                        "chunk_tokens": [], "error": "http_5xx"}
            )  # fmt: skip
        elif i < failed + cancelled:
            r = r.model_copy(update={"status": RequestStatus.CANCELLED})
        out.append(r)
    return run.model_copy(
        update={"records": out, "status": "circuit_breaker", "stop_reason": "circuit breaker"}
    )


# --- 1, 8: a profile file with a bad or missing value ----------------------------------


def _profile_dict() -> dict:
    fit = FitQuality(samples=100, r2=0.9, rel_rmse=0.1, confidence="high")
    return TRUTH.model_copy(update={"fit": fit}).model_dump(mode="json")


def _with(path: tuple[str, ...], value: object) -> dict:
    d = _profile_dict()
    at = d
    for k in path[:-1]:
        at = at[k]
    if value is _DROP:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return d


_DROP = object()
BAD = [
    (("coefficients", "const"), math.nan, "coefficients.const: must be a finite number"),
    (("coefficients", "const"), -0.5, "coefficients.const: must be a finite number"),
    (("coefficients", "const"), 1e9, "coefficients.const: must be a finite number"),
    (("coefficients", "decode_seqs"), math.inf, "coefficients.decode_seqs: must be"),
    (("api_overhead_s",), -1, "api_overhead_s: must be a finite number"),
    (("ingress_per_token_s",), -1e-6, "ingress_per_token_s: must be"),
    (("new_shape_s",), math.nan, "new_shape_s: must be"),
    (("coefficients",), {}, "coefficients.const is missing"),
    (("coefficients", "const"), _DROP, "coefficients.const is missing"),
    (("coefficients", "bogus_term"), 0.001, "unknown term 'bogus_term'"),
    (("version",), 2, "version: this servetune reads profile version 1"),
    (("fit", "confidence"), "bogus", "fit.confidence"),
    (("fit", "r2"), _DROP, "fit.r2: is missing"),
]


def test_a_profile_file_with_a_bad_or_missing_value_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    """A NaN step hung `simulate`, a negative one gave negative TTFTs, 1e9 gave 0 tok/s,
    a missing const or a misspelt term priced at 0 unseen, a newer version or an unknown
    confidence read as if fine, and a missing field said only "Field required". Each is
    now one line naming the field, the fix to recalibrate; a good profile, and one from
    before the newer step terms, still load."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_profile_dict()))
    assert load_profile(good).coefficients == TRUTH.coefficients
    old = _profile_dict()
    old["coefficients"] = {"const": 0.01, "prefill_tokens": 4e-4}  # no prefill_sq, ...
    good.write_text(json.dumps(old))
    assert load_profile(good).coefficients["const"] == 0.01
    for path, value, says in BAD:
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(_with(path, value)))  # NaN / Infinity as Python writes them
        with pytest.raises(InputError) as err:
            load_profile(p)
        e = err.value
        assert e.field == "--profile" and e.fix == FIX, (path, e)
        assert says in e.problem and str(p) in e.problem, (path, e.problem)
        assert "\n" not in e.one_line()


def test_simulate_with_a_nan_profile_is_one_line_not_a_hang(tmp_path: Path) -> None:
    p = tmp_path / "nan.json"
    p.write_text(json.dumps(_with(("coefficients", "const"), math.nan)))
    w = tmp_path / "w.yaml"
    w.write_text(
        "count: 8\narrival: {kind: closed, concurrency: 2}\n"
        "input_tokens: {dist: fixed, value: 64}\noutput_tokens: {dist: fixed, value: 8}\n"
    )
    run = cli(
        "simulate", "-m", "llama-3.2-1b", "-g", "cpu-host", "-w", str(w), "--profile",
        str(p), "--no-store", timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().count("\n") == 0 and "coefficients.const" in run.stderr


def test_least_squares_never_hands_back_a_negative_step_constant() -> None:
    """Steps whose time grows with the batch from below zero (-5 ms + 10 ms a sequence):
    plain least squares fitted a negative constant, a profile of negative small steps,
    which a profile now refuses. The constant is dropped like any negative term."""
    rng = np.random.default_rng(0)
    n = 400
    x = np.zeros((n, len(FEATURES)))
    x[:, 0] = 1.0
    x[:, FEATURES.index("decode_seqs")] = rng.integers(1, 5, n)
    y = 0.01 * x[:, FEATURES.index("decode_seqs")] - 0.005 + rng.normal(0, 1e-4, n)
    coef, _, _, _, dropped = fit_coefficients(x, y)
    assert coef[0] == 0.0 and "const" in dropped and (coef >= 0).all(), coef


# --- 2: a sweep's load points are not repeats ------------------------------------------


def test_a_sweeps_load_points_are_not_repeats() -> None:
    """Two load points of one workload (1 and 4 users, same name, as `bench
    --concurrency 1,4` writes them) differ by their load, not the host: no repeats. A
    second run of one point at the same load is one, and only it is compared."""
    slow = scaled(TRUTH, 1.5)
    c1 = closed_workload("w", 1, 6, fixed_tokens(200), fixed_tokens(8))
    c4 = closed_workload("w", 4, 6, fixed_tokens(200), fixed_tokens(8))
    one, four, one_slow = sim_run(c1), sim_run(c4), sim_run(c1, slow)
    assert one.workload_name == four.workload_name
    assert repeat_spread([one, four]) is None
    assert repeat_spread([one, four, one_slow]) == pytest.approx(np.log(1.5) / np.sqrt(2), rel=0.05)


# --- 3, 7, 5: what calibrate fits on -----------------------------------------------------

W12 = closed_workload("cal-c2", 2, 12, fixed_tokens(200), fixed_tokens(8))


def test_calibrate_refuses_runs_of_two_served_models(tmp_path: Path) -> None:
    """Runs of `m` and of `llama-3.1-70b` were fitted into one profile without a word;
    from files and from the store alike, they are refused in one line naming both."""
    from servetune.store import RunMeta, Store

    db = str(tmp_path / "st.db")
    files = []
    with Store.open(db) as store:
        for model in ("m", "llama-3.1-70b"):
            run = as_bench(sim_run(W12), model)
            files.append(str(tmp_path / f"{model}.json"))
            write_result(run, files[-1])
            store.save_result(run, RunMeta(backend="real"), study="two")
    base = ("calibrate", "-m", "llama-3.2-1b", "-g", "cpu-host", "--db", db)
    for source in (files, ["--from-store", "two"]):
        out = tmp_path / "p.json"
        run = cli(*base, *source, "-o", str(out))
        assert run.returncode == 2, run.stderr
        line = run.stderr.strip()
        assert "\n" not in line and not out.exists(), line
        assert "2 models: llama-3.1-70b (1 run), m (1 run)" in line, line
        assert "fit one model at a time" in line, line


def test_calibrate_leaves_out_runs_of_nothing_but_errors_and_says_what_it_replays(
    tmp_path: Path,
) -> None:
    """A run in which every request failed was counted as a calibration run (listed in
    fit.runs, its requests replayed): it is left out, one line naming the file and why,
    and with nothing left the fit is refused. A run that stopped early with failures is
    replayed with one note of what its engine did not serve."""
    good, all_err = as_bench(sim_run(W12)), stopped(as_bench(sim_run(W12)), 12, 12, 0)
    broke = stopped(as_bench(sim_run(W12)), 8, 3, 1)
    paths = {}
    for name, run in (("good", good), ("err", all_err), ("broke", broke)):
        paths[name] = str(tmp_path / f"{name}.json")
        write_result(run, paths[name])
    base = ("calibrate", "-m", "llama-3.2-1b", "-g", "cpu-host", "--set", "max_num_seqs=4")
    out = tmp_path / "p.json"
    run = cli(*base, paths["good"], paths["err"], paths["broke"], "-o", str(out), "--json")
    assert run.returncode == 0, run.stderr
    assert f"calibrate: {paths['err']} left out: 0 of 12 requests ok" in run.stderr
    assert f"{paths['broke']} sent 8 of its 12 requests" in run.stderr, run.stderr
    assert f"{paths['good']} sent" not in run.stderr and f"{paths['err']} sent" not in run.stderr
    assert json.loads(run.stdout)["fit"]["runs"] == [good.id, broke.id]
    run = cli(*base, paths["err"], "-o", str(tmp_path / "q.json"))
    assert run.returncode == 2 and "no run served a streamed request" in run.stderr
    assert run.stderr.strip().count("\n") == 1  # the left-out line and the refusal


# --- 5: a replay of a run its engine did not serve whole ----------------------------------


def test_a_replay_sends_only_what_the_run_sent_and_says_what_it_did_not_serve(
    tmp_path: Path,
) -> None:
    """A circuit breaker stopped the run at 8 of its 12 requests, 3 of them failed and 1
    was cancelled: `simulate --replay` (and the calibration's replays) simulated all 12,
    with no word. It sends the 8, and one note names the counts."""
    from servetune.measure import Hooks, SimulateSettings, run_simulate

    run = stopped(as_bench(sim_run(W12)), 8, 3, 1)
    _, reqs = replay_inputs(run)
    assert sorted(q.index for q in reqs) == sorted(r.index for r in run.records)
    note = replay_note(run, "b.json")
    assert note is not None and "b.json sent 8 of its 12 requests (circuit breaker)" in note
    assert "3 failed, 1 cancelled in the real run" in note, note
    assert replay_note(as_bench(sim_run(W12))) is None  # served whole: nothing to say
    path = tmp_path / "b.json"
    write_result(run, path)
    said: list[str] = []
    res = run_simulate(
        SimulateSettings(config=CFG, model="llama-3.2-1b", gpu="cpu-host", replay=path),
        Hooks(say=said.append),
    )
    assert len(res[0].records) == 8
    assert [s for s in said if "sent 8 of its 12" in s] == [replay_note(run, str(path))]


# --- 6: the tuner's check replays as the fit does ------------------------------------------


def test_the_profile_check_replays_on_one_engine_in_the_order_served() -> None:
    """vLLM-CPU pays once for each new step size (`new_shape_s`). Three runs of the same
    prompt lengths served in turn by one engine under a known profile (the first pays for
    every size, the others for none), replayed by the cached-profile check with that very
    profile: it must read them back exactly, in whatever order it is given them. Replayed
    each on a fresh engine, every run paid for every size again: it read the TTFT far off
    and refused a good profile."""
    from servetune.tune.profilecheck import replay_errors
    from servetune.workload.spec import Uniform

    truth = TRUTH.model_copy(update={"new_shape_s": 0.05, "new_shape_per_token_s": 1e-4})
    shapes: set[int] = set()
    lengths = Uniform(low=100, high=600)  # the same draws in every run: one seed
    cases = [closed_workload(f"cal-{i}", 1, 5, lengths, fixed_tokens(8)) for i in range(3)]
    runs = [sim_run(w, truth, shapes=shapes, t0=100.0 + i) for i, w in enumerate(cases)]
    errors = replay_errors(list(reversed(runs)), truth, M, HW, CFG)
    assert errors and max(errors.values()) < 1e-6, errors


# --- 4: a low profile ranks a study only said ----------------------------------------------


def test_a_given_low_profile_is_said_and_noted_with_its_confidence(tmp_path: Path) -> None:
    """`tune --profile P` with a low profile ranked with no word in the text or the
    --json notes; and a low profile that names no problem read "LOW confidence (): ...
    fix: ". The note now carries every given profile's confidence and a low one's
    warning, said at once too."""
    from servetune.tune.calibration import for_hybrid

    low = TRUTH.model_copy(
        update={"fit": FitQuality(samples=10, r2=0.1, rel_rmse=0.5, confidence="low")}
    )
    warn = low.warning()
    assert warn is not None and "()" not in warn and warn.endswith(f"fix: {FIX}"), warn
    for conf, mode in (("low", "sim"), ("high", "sim"), ("low", "hybrid")):
        p = tmp_path / f"{conf}.json"
        fit = FitQuality(samples=10, r2=0.1, rel_rmse=0.5, confidence=conf)
        p.write_text(TRUTH.model_copy(update={"fit": fit}).model_dump_json())
        settings = SimpleNamespace(
            mode=mode, sim=SimpleNamespace(profile=str(p)), real=SimpleNamespace()
        )
        said: list[str] = []
        cal, note = for_hybrid(settings, None, said.append)  # type: ignore[arg-type]
        assert cal is None and note is not None, (conf, mode)
        assert f"the given profile {p}" in note and f"confidence {conf}" in note, note
        if conf == "low":
            assert said == [f"simulator: {warn}"] and note.endswith(warn), (said, note)
        else:
            assert said == [] and "LOW" not in note


def test_the_tuners_fit_leaves_out_a_sweep_run_of_nothing_but_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hybrid flow's calibration (`tune.calibration.calibrate_first`) fitted a sweep
    run whose requests all failed as a calibration run; it is left out and said, and a
    sweep with no run served is an InputError (the study then ranks on the roofline tier,
    said in its notes)."""
    from servetune.measure.backends import BackendSpec
    from servetune.tune import calibration as cal

    good = as_bench(sim_run(W12))
    failed = stopped(as_bench(sim_run(W12)), 12, 12, 0)
    swept: list[list[RunResult]] = [[good, failed], [failed]]
    monkeypatch.setattr(cal, "key_for", lambda real, cfg: cal.CalibrationKey(
        "vllm", "v1", "/m/model", 1, 1, "cpu|2"))  # fmt: skip
    monkeypatch.setattr(cal, "run_sweep", lambda *a, **k: (swept.pop(0), "v1"))
    common = dict(engine="vllm", model="llama-3.2-1b", hardware="cpu-host", slo={})
    wl = W12.model_dump(mode="json")
    real, sim = (BackendSpec(kind=k, workload=wl, **common) for k in ("real", "sim"))
    cache, said = cal.CalibrationCache(tmp_path), []

    def first() -> cal.Calibration:
        return cal.calibrate_first(real, sim, CFG, cache=cache, force=True, say=said.append)

    prof = load_profile(first().entry.profile)
    assert prof.fit is not None and prof.fit.runs == [good.id]
    assert "calibration: cal-c2 left out: 0 of 12 requests ok" in said, said
    with pytest.raises(InputError, match="calibration: no run served a streamed request"):
        first()


def test_an_unknown_gpu_is_not_sent_to_a_flag_calibrate_lacks(tmp_path: Path) -> None:
    """calibrate has no --hardware-file (its profile names hardware the simulator looks
    up by name), so its unknown-accelerator fix names the catalog, not that flag."""
    for gpu, fix in (("h100sxm", "did you mean h100-sxm"), ("nosuch", "known: a10, ")):
        out = subprocess.run(
            [sys.executable, "-m", "servetune.cli.app", "calibrate", "-m", "llama-3.1-8b",
             "-g", gpu, "-o", str(tmp_path / "p.json"), "--url", "http://127.0.0.1:9"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 2 and fix in out.stderr, out.stderr
        assert "--hardware-file" not in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(InputError, match="Or describe it in a --hardware-file"):
        get_hardware("nosuch")  # plan, simulate, tune have the flag
