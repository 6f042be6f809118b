"""Simulator vs the real vLLM CPU engine (`servetune.validate`): what holds on any host.
One block of the harness on the shared `vllm_server` (the calibration sweep, then the
held-out workloads the checks below compare; ~1 min on a quiet AVX-512 host, ~3.3 min on
an AVX2-only one) runs end to end,
calibration reproduces its own runs, and the qualitative effects (the queue past
max_num_seqs, the prefix-cache hit) show in the real engine and in the simulator alike.
Plus the exactness the fast paths promise (lazy sim records, weighted ITL summary).

The numeric targets are not asserted here: the real engine's figures move with the host's
load, and contention that shifts between the calibration and the held-out runs reads as
simulator error (a busy host measured 58% on throughput, 43% on P50 TTFT, where its own
repeats' P50 TTFT agreed within 8.3%). benchmarks/sim_fidelity.py and `servetune validate`
judge them, with repeats and their noise floor: met / missed / too noisy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from servetune import validate
from servetune.engines.config import EngineConfig
from servetune.engines.testmodel import VLLM_TEST_CONFIG
from servetune.metrics.compute import compute_metrics
from servetune.metrics.stats import summarize, summarize_weighted
from servetune.results.schema import RunResult
from servetune.sim.profile import Profile
from servetune.workload.spec import WorkloadSpec, parse_workload

# The held-out workload past max_num_seqs (8 users, 4 slots), and the same requests at 4
# users: with equal prompts the only difference is the queue for a slot.
QUEUED = "closed-c8-p200"
UNQUEUED = "closed-c4-p200"


@dataclass
class Live:
    """One live block of the harness, compared: the rows are real (one run) vs simulated."""

    profile: Profile  # fitted on the block's calibration runs
    calibration: dict[str, validate.Row]  # workload -> real vs its replay
    heldout: dict[str, validate.Row]  # the held-out workloads, plus UNQUEUED
    sweep: list[RunResult]  # the calibration runs, as `calibrate --url` makes them


def live_heldout() -> list[WorkloadSpec]:
    """The held-out workloads the live block runs: those the qualitative check compares,
    plus UNQUEUED. The other held-out cases (a uniform and a fixed closed loop, a Poisson
    lognormal) add ~40 s on an AVX2-only host and no assertion here reads them; the
    calibration sweep's own Poisson and gamma runs cover open-loop replays, and
    benchmarks/sim_fidelity.py runs every held-out case, repeated."""
    held = {w.name: w for w in validate.heldout_cases()}
    unqueued = held[QUEUED].with_load(concurrency=4).model_copy(update={"name": UNQUEUED})
    return [held[QUEUED], unqueued, held["prefix-c2"], held["noprefix-c2"]]


@pytest.fixture(scope="module")
def live(vllm_server, llama_test_model) -> Live:
    from servetune.model import get_model

    srv, model_dir = vllm_server, str(llama_test_model)
    runs = validate.run_blocks(
        srv.url, srv.served_model, repeats=1, cal_repeats=1, heldout=live_heldout()
    )
    profile, cal_rows, rows = validate.compare_saved(
        runs,
        model_dir,
        VLLM_TEST_CONFIG,
        model_name=get_model(model_dir).name,
        engine_version=validate.engine_version(srv),
    )
    print(validate.format_table(cal_rows, "calibration (one block)"))
    print(validate.format_table(rows, "held-out (one block; targets judged by the benchmark)"))
    sweep = [r for r in runs if validate.is_calibration(str(r.workload.get("name")))]
    fit = profile.fit
    print(f"profile confidence {fit.confidence if fit else '-'}: {fit.problems if fit else ''}")
    return Live(profile, {r.name: r for r in cal_rows}, {r.name: r for r in rows}, sweep)


@pytest.mark.engine
# The live block, engine start included: ~2 min on a busy host with AVX-512; 19 min beside
# the suite on a 2-core AVX2-only host while the test model was bf16 there (no oneDNN bf16
# matmul without AVX-512), 3.9 min (236 s) since it is float32 on such hosts
# (testmodel.fast_cpu_dtype), less with only the held-out cases the checks read
# (live_heldout): the bound leaves that host 5x its time.
@pytest.mark.timeout(1200)
def test_harness_runs_end_to_end(live: Live) -> None:
    """Every case was run, fitted or replayed, and compared on every figure, both sides."""
    cal = validate.calibration_cases()
    assert sorted(live.calibration) == sorted(w.name for w in cal)
    assert sorted(live.heldout) == sorted(w.name for w in live_heldout())
    for row in [*live.calibration.values(), *live.heldout.values()]:
        assert all(row.sim[k] is not None and row.sim[k] > 0 for k in validate.FIGURES), row
        # a stream the host held (one core left for engine, API server and client) has no
        # token timing: then the row says so, and only throughput and E2E are compared
        timed = validate.FIGURES if not row.extra.get("held_streams") else ("output_tok_s",)
        assert all(row.real[k] is not None and row.real[k] > 0 for k in timed), row
        assert row.real[validate.E2E] and row.sim[validate.E2E], row
    assert live.profile.tier == "calibrated"
    assert live.profile.fit is not None and live.profile.fit.method == "least squares + replay"


@pytest.mark.engine
@pytest.mark.timeout(1200)  # the live block may start here (above)
def test_the_sweep_covers_prefix_mixed_and_bursty_and_reports_its_confidence(live: Live) -> None:
    """The default sweep's real runs share prefixes (served from the prefix cache), mix
    long and short prompts, arrive in bursts and fill the batch; the profile states its
    confidence, and anything short of "high" comes with the rules it failed and the runs
    that would fix it. Coverage is counted, not timed: no host load turns it (the level
    itself is the host's, so it is printed, not asserted)."""
    from servetune.sim.confidence import BATCH_COVERED, coverage_of

    cov = coverage_of(live.sweep)
    assert cov.max_batch >= BATCH_COVERED and cov.prefix_runs >= 2, cov
    assert cov.bursty_runs >= 1 and cov.mixed_length_runs >= 1, cov
    fit = live.profile.fit
    assert fit is not None and fit.confidence in ("high", "medium", "low")
    assert (fit.confidence == "high") == (not fit.problems) == (not fit.fixes), fit
    # a coverage gap is never among the problems of the default sweep's profile
    assert not any(k in p for p in fit.problems for k in ("prefix", "bursty", "mixes", "batches"))


@pytest.mark.engine
@pytest.mark.timeout(1200)  # the live block may start here (above)
def test_calibration_reproduces_its_own_runs(live: Live, llama_test_model) -> None:
    """Replayed under the profile fitted on them, the calibration runs come back: over
    the figures, the median of each figure's median error over the sweep is within 40%,
    and the fitted profile reproduces them better than itself with every step term doubled
    or halved (a calibration that did nothing, or landed 2x off, does not). Measured 2-10%
    per figure on quiet hours, 7-15% on a busy one; with the rest of the suite running
    beside the engine one figure reached 43% (P50 TPOT, the others 12-26%), which is why
    no single figure is held to a bound: the host moves each run's figures, the fit's
    claim is the whole sweep. Side by side in this process: the 2x and 0.5x profiles
    replay the same runs."""

    def overall(profile: Profile) -> float:
        _, rows, _ = validate.compare_saved(
            live.sweep, str(llama_test_model), VLLM_TEST_CONFIG, profile
        )
        med = validate.medians_over(rows)
        assert all(v is not None for v in med.values()), med
        return float(np.median([v for v in med.values() if v is not None]))

    def scaled(k: float) -> Profile:
        coef = {t: v * k for t, v in live.profile.coefficients.items()}
        return live.profile.model_copy(update={"coefficients": coef})

    fitted = overall(live.profile)
    twice, half = overall(scaled(2.0)), overall(scaled(0.5))
    print(f"median error over figures: fitted {fitted:.1f}%, x2 {twice:.1f}%, x0.5 {half:.1f}%")
    assert fitted <= 40.0
    assert fitted < twice and fitted < half, (fitted, twice, half)


@pytest.mark.engine
@pytest.mark.timeout(1200)  # the live block may start here (above)
def test_qualitative_effects_appear_in_both(live: Live) -> None:
    """Effects whose direction no host load and no fitted profile can turn.
    Past max_num_seqs (4), requests queue for a slot: with the same prompts, 8 users' P50
    TTFT is the 4 users' one plus the wait for a running request's decode. Measured on a
    busy host: 2.2-2.5x real, 2.5-2.6x simulated. Simulated under profiles with prefill,
    decode or per-step costs 10-20x the fitted ones (what a busy host's calibration can
    give): 1.9-8.7x; 1.25x only with 20x the per-request API overhead. (Against 4 users
    with longer prompts, per prompt token, a prefill-heavy profile brings the simulated
    cliff down to 1.3x: hence the same prompts.) A prefix-cache hit removes 576 of the 640
    prompt tokens' prefill: P50 TTFT 0.14-0.27x that without, 0.6x with that overhead."""
    by = live.heldout
    for slow, fast, factor in ((QUEUED, UNQUEUED, 1.5), ("noprefix-c2", "prefix-c2", 1 / 0.8)):
        key = _latency(by[slow], by[fast])
        for side in ("real", "sim"):
            a, b = getattr(by[slow], side), getattr(by[fast], side)
            print(f"{side} {key}: {slow} {a[key]:.0f} ms / {fast} {b[key]:.0f} ms")
            assert a[key] > factor * b[key], (key, side, a, b)


def _latency(*rows: validate.Row) -> str:
    """P50 TTFT, or P50 E2E where the host held a real stream (a busy host's one core left
    for engine, API server and client): the same effects, on a figure every client times.
    Both sides use the same figure. Measured with a one-core hog, queued/unqueued P50
    E2E: 1.84x real, 1.93x simulated."""
    return "ttft_p50" if all(r.real["ttft_p50"] for r in rows) else validate.E2E


def test_verdict_judges_only_what_the_floor_allows() -> None:
    """Hand-made rows: a miss on a figure whose floor is within its target is a miss; a
    miss where the real engine differed from itself by more is "too noisy"; no floor
    (one repeat) judges every figure."""

    def row(**err: float) -> validate.Row:
        full = {k: 1.0 for k in validate.TARGETS}
        return validate.Row("w", {}, {}, {**full, **err})

    ok, tpot_off = [row()], [row(tpot_p50=12.0)]
    assert validate.verdict(ok, []) == ("met", [])
    assert validate.verdict([row(output_tok_s=0.0)], []) == ("met", [])  # exact is met
    assert validate.verdict(tpot_off, []) == ("missed", ["tpot_p50"])
    assert validate.verdict(tpot_off, [row(tpot_p50=9.0)]) == ("missed", ["tpot_p50"])
    assert validate.verdict(tpot_off, [row(tpot_p50=15.0)]) == ("too noisy", ["tpot_p50"])
    both = [row(tpot_p50=12.0, output_tok_s=11.0)]
    assert validate.verdict(both, [row(tpot_p50=15.0)]) == ("missed", ["output_tok_s"])


@pytest.mark.engine
@pytest.mark.timeout(300)  # two prompts, ~20 s on a busy host
def test_llamacpp_prompt_steps_match_the_simulator(llamacpp_server) -> None:
    """llama-server on Gemma 3 (sliding-window attention) stops every prompt 516 and 4
    tokens before its end to save a context checkpoint, so with n_batch 2048 a 1,500-token
    prompt takes three llama_decode calls and a 400-token one two, not one each; the
    simulator's slots scheduler must take the same steps (`policies.prompt_breaks`).
    Counted, not timed: the engine's own decode counter does not move with the host's load.
    So two such prompts sent together share their three steps and get their first tokens
    together: exactly in the simulator; in the real engine only when the second reaches
    the server before the first step starts (9,243 / 9,313 ms on a quiet host; a busy one
    delivered it a step late: 19.5 / 22.6 s), so timing is checked on the simulator."""
    from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG
    from servetune.hardware import get_hardware
    from servetune.metrics.compute import request_latencies_ms
    from servetune.model import get_model
    from servetune.sim.engine import simulate

    fixed, srv = validate.fixed_tokens, llamacpp_server
    for prompt, steps in ((1500, 3), (400, 2)):
        case = validate.closed_workload(f"prompt-{prompt}", 1, 1, fixed(prompt), fixed(1))
        before = srv.metrics().values["decode_calls_total"]
        real = validate.bench_real(srv.url, srv.served_model, case, "llamacpp", scrape=False)
        decodes = srv.metrics().values["decode_calls_total"] - before
        sim = validate.simulate_like(real, "gemma-3-270m", LLAMACPP_TEST_CONFIG, None)
        assert decodes == sim.target.sim.steps == steps, (prompt, decodes, sim.target.sim)

    burst = validate.closed_workload("burst-2x1500", 2, 2, fixed(1500), fixed(4))
    m, hw = get_model("gemma-3-270m"), get_hardware("cpu-host")
    res, _ = simulate(m, hw, LLAMACPP_TEST_CONFIG, burst)
    first, second = sorted(request_latencies_ms(r)[0] for r in res.records)
    assert first == pytest.approx(second), (first, second)


def test_cases_are_named_workload_specs_split_by_the_calibration_prefix() -> None:
    """Ten calibration workloads, then six held out; the name is what saved runs are
    grouped and split by, so names are unique and only the sweep's start with cal-. The
    sweep covers what users run: shared prefixes, a long/short mix, bursty arrivals."""
    cal, held = validate.calibration_cases(), validate.heldout_cases()
    names = [w.name for w in cal + held]
    assert (len(cal), len(held), len(set(names))) == (10, 6, 16)
    assert any(sub.prefix is not None for w in cal for sub in w.mix)
    assert any(len(w.mix) > 1 for w in cal)
    assert any(w.arrival.kind == "gamma" and w.arrival.burstiness < 1 for w in cal)
    assert all(validate.is_calibration(w.name) for w in cal)
    assert not any(validate.is_calibration(w.name) for w in held)
    assert {w.api for w in cal + held} == {"completions"}  # the server counts raw prompts


def _runs_of_a_known_profile():
    """(runs, truth, replay_loss): three small runs simulated under a known profile, and
    the replay fit's loss - the mean squared log error of the runs' figures - of a profile."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.calibrate import log_error_loss, replay_inputs, shape_of
    from servetune.sim.engine import simulate
    from servetune.sim.profile import Profile

    m, hw = get_model("llama-3.2-1b"), get_hardware("cpu-host")
    coef = {"const": 0.03, "prefill_tokens": 3e-4, "decode_seqs": 2e-3, "kv_read_tokens": 2e-6}
    truth = Profile(
        engine="vllm",
        model=m.name,
        hardware=hw.name,
        coefficients={**coef, "attn_pairs": 1e-8, "prefill_sq": 4e-7},
        api_overhead_s=0.003,
        ingress_s=0.008,
    )
    fixed = validate.fixed_tokens
    cases = [
        validate.closed_workload("cal-a", 1, 4, fixed(64), fixed(12)),
        validate.closed_workload("cal-b", 4, 8, fixed(600), fixed(12), seed=1),
        validate.closed_workload("cal-c", 2, 6, fixed(300), fixed(12), seed=2),
    ]
    runs = [
        simulate(m, hw, VLLM_TEST_CONFIG, w, profile=truth, keep_requests=True)[0] for w in cases
    ]

    def replay_loss(prof: Profile) -> float:
        total, n, shapes = 0.0, 0, set()
        for real in runs:
            spec, reqs = replay_inputs(real)
            sim, _ = simulate(m, hw, VLLM_TEST_CONFIG, spec, reqs, profile=prof, shapes=shapes)
            t, k = log_error_loss(shape_of(sim), shape_of(real))
            total, n = total + t, n + k
        return total / n

    return runs, truth, replay_loss


def test_replay_fit_brings_a_wrong_profile_back_to_the_runs_it_replays() -> None:
    """A start with every step term 3x too large and no front-end terms: the replay fit
    (scipy's Nelder-Mead, 30 iterations a start) must cut the replay loss tenfold."""
    from servetune.sim.calibrate import fit_by_replay

    runs, truth, replay_loss = _runs_of_a_known_profile()
    wrong = {k: 3 * v for k, v in truth.coefficients.items()}
    start = truth.model_copy(update={"coefficients": wrong, "api_overhead_s": 0, "ingress_s": 0})
    fit = fit_by_replay(runs, start, "llama-3.2-1b", VLLM_TEST_CONFIG, iters=30)
    assert replay_loss(fit) < replay_loss(start) / 10, (replay_loss(start), fit)


def test_replay_fit_never_ends_worse_than_the_profile_it_starts_from() -> None:
    """A start that already replays its runs exactly (the profile they were simulated
    under): the searches begin from floored terms, far from it, and a few iterations do
    not come back; the refinement must keep the start then, not hand back a worse profile
    (on the mock, TTFT 30 ms and 6 ms a token, the least squares replayed to 5% and the
    search's end to 32%, which `calibrate` called not fit for use)."""
    from servetune.sim.calibrate import fit_by_replay

    runs, truth, replay_loss = _runs_of_a_known_profile()
    fit = fit_by_replay(runs, truth, "llama-3.2-1b", VLLM_TEST_CONFIG, iters=3)
    assert replay_loss(fit) <= replay_loss(truth) < 1e-6
    assert fit.coefficients == truth.coefficients and fit.ingress_s == truth.ingress_s


def _sim_run(name: str, const: float, t0: float):
    """A simulated run of a small closed workload, on an engine whose step costs `const` s,
    stamped as started at `t0`: stands in for a real run where only its figures matter."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.sim.profile import Profile

    m, hw = get_model("llama-3.2-1b"), get_hardware("cpu-host")
    prof = Profile(
        engine="vllm",
        model=m.name,
        hardware=hw.name,
        coefficients={"const": const, "prefill_tokens": 2e-4},
    )
    w = parse_workload(
        {
            "name": name,
            "count": 6,
            "arrival": {"kind": "closed", "concurrency": 2},
            "input_tokens": {"dist": "fixed", "value": 100},
            "output_tokens": {"dist": "fixed", "value": 8},
        }
    )
    res, _ = simulate(m, hw, EngineConfig(max_num_seqs=4, max_model_len=2048), w, profile=prof)
    return res.model_copy(update={"started_unix_s": t0})


def test_noise_floor_compares_even_and_odd_repeats_of_held_out_workloads() -> None:
    """Three repeats of one workload (the middle one on an engine twice as slow per step),
    a calibration run and a single-run workload: one row, odd repeats (the slow one)
    against the median of the even ones (identical), errors as for a simulation."""
    run = _sim_run
    reps = [run("w", c, t) for c, t in ((0.03, 1.0), (0.06, 2.0), (0.03, 3.0))]
    rows = validate.noise_floor([*reps, run("cal-x", 0.05, 0.5), run("once", 0.02, 4.0)])
    assert [r.name for r in rows] == ["w"] and rows[0].extra == {"repeats": 3}
    slow, fast = validate.figures(reps[1].metrics), validate.figures(reps[0].metrics)
    assert rows[0].err == validate.abs_pct_errors(fast, slow)
    assert rows[0].err["output_tok_s"] > 20  # a 2x slower step shows


def test_a_held_stream_is_said_and_only_its_timed_figures_are_left_out() -> None:
    """A repeat whose stream the host held gives no TTFT/TPOT: the row's timing comes from
    the other repeats; with every repeat held, the row says `stream held` in those cells,
    and throughput and P50 E2E are still compared."""
    from servetune.results.schema import Dist

    sim, timed = _sim_run("w", 0.03, 1.0), _sim_run("w", 0.03, 2.0)
    no_timing = timed.metrics.model_copy(update={"ttft_ms": Dist(), "tpot_ms": Dist()})
    held = timed.model_copy(
        update={"metrics": no_timing.model_copy(update={"stream_buffered": True})}
    )
    one = validate.compare_runs("w", [timed, held], [sim, sim])
    assert one.extra["held_streams"] == 1 and one.real["ttft_p50"] == timed.metrics.ttft_ms.p50
    every = validate.compare_runs("w", [held], [sim])
    assert every.real["ttft_p50"] is None and every.err["ttft_p50"] is None
    assert every.err["output_tok_s"] == 0.0 and every.real[validate.E2E] == sim.metrics.e2e_ms.p50
    cells = validate.format_table([every], "t").splitlines()[2]
    assert cells.count("stream held") == 4 and "0.0%" in cells, cells


def test_lazy_sim_records_give_the_metrics_of_their_materialised_records() -> None:
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.results.schema import RunResult
    from servetune.sim.engine import simulate

    spec = parse_workload(
        {
            "count": 300,
            "arrival": {"kind": "poisson", "rate": 40},
            "input_tokens": {"dist": "uniform", "low": 10, "high": 3000},
            "output_tokens": {"dist": "uniform", "low": 1, "high": 300},
        }
    )
    cfg = EngineConfig(max_model_len=2048, max_num_seqs=32, kv_cache_tokens=20000)
    res, sched = simulate(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), cfg, spec)
    assert sched.stats.preemptions > 0 and sched.stats.rejected > 0  # multi-range records
    plain = list(res.records)
    assert compute_metrics(plain) == res.metrics
    again = RunResult.model_validate_json(res.model_dump_json())
    assert again.records == plain


def test_weighted_summary_matches_the_expanded_sample() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        v = rng.choice([0.5, 1.0, 2.5, *rng.random(5) * 10], size=int(rng.integers(1, 20)))
        c = rng.integers(0, 6, size=len(v))
        if c.sum() == 0:
            continue
        a, b = summarize(np.repeat(v, c)), summarize_weighted(v, c)
        for k in ("count", "min", "max", "p50", "p90", "p95", "p99"):
            assert getattr(a, k) == getattr(b, k), k
        assert b.mean == pytest.approx(a.mean, rel=1e-12)
        assert b.std == pytest.approx(a.std, rel=1e-9, abs=1e-12)
