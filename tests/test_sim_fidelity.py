"""Simulator vs the real vLLM CPU engine (issue 5 "Fidelity"), fast subset of
benchmarks/sim_fidelity.py: calibrate on the live sweep, check held-out workloads.
Engine tests use the shared `vllm_server` (VLLM_TEST_CONFIG: max_num_seqs 4), ~2 min.
Plus the exactness the fast paths promise (lazy sim records, weighted ITL summary).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from servetune.engines.config import EngineConfig
from servetune.engines.testmodel import VLLM_TEST_CONFIG
from servetune.metrics.compute import compute_metrics
from servetune.metrics.stats import summarize, summarize_weighted
from servetune.sim import fidelity as fd
from servetune.workload.spec import parse_workload


@dataclass
class Subset:
    rows: dict[str, fd.Row]  # held-out workload -> real (median of repeats) vs simulated
    floor: list[fd.Row]  # the real engine against itself (repeat 0 vs repeat 1)


@pytest.fixture(scope="module")
def fidelity(vllm_server, llama_test_model) -> Subset:
    from servetune.model import get_model

    model_dir = str(llama_test_model)
    # two interleaved blocks, each the calibration sweep then the held-out workloads: two
    # repeats give the noise floor that says whether this host can judge the targets now
    runs = fd.run_blocks(vllm_server.url, vllm_server.served_model, repeats=2, cal_repeats=2)
    _, _, rows = fd.compare_saved(
        runs,
        model_dir,
        VLLM_TEST_CONFIG,
        model_name=get_model(model_dir).name,
        engine_version=str(vllm_server.settings.get("version") or "unknown"),
    )
    floor = fd.noise_floor(runs)
    print(fd.format_table(rows, "held-out (test subset)"))
    print(fd.format_table(floor, fd.NOISE_FLOOR_TITLE))
    return Subset({r.name: r for r in rows}, floor)


@pytest.mark.engine
def test_qualitative_effects_appear_in_both(fidelity) -> None:
    by = fidelity.rows
    c4, c8 = by["closed-c4-p300"], by["closed-c8-p200"]
    pre, nopre = by["prefix-c2"], by["noprefix-c2"]
    for side in ("real", "sim"):
        # Past max_num_seqs (4) requests queue: the TTFT cliff. c8 sends 200-token prompts
        # and c4 300-token ones, so compare TTFT per prompt token (without a queue c8's
        # would be lower, not 1.5x higher).
        per_token_c8 = getattr(c8, side)["ttft_p50"] / 200
        per_token_c4 = getattr(c4, side)["ttft_p50"] / 300
        assert per_token_c8 > 1.5 * per_token_c4, side
        # a prefix-cache hit removes most of the prefill
        assert getattr(pre, side)["ttft_p50"] < 0.8 * getattr(nopre, side)["ttft_p50"], side


@pytest.mark.engine
def test_heldout_errors_within_issue_targets(fidelity) -> None:
    """Issue 5's targets (median over held-out workloads: throughput and P50 TPOT <= 10%,
    P50 TTFT <= 15%, P95s <= 25%), asserted whenever this host can measure them. When the
    real engine's own two repeats differ by more than a target (`fidelity.noise_floor`),
    a miss on that figure is no evidence about the model and the test skips, naming the
    floor; otherwise a figure fails beyond its target plus half the floor (the two-repeat
    median's own uncertainty). Measured with the full harness: 3.2 / 4.3 / 3.4 / 2.5 /
    2.5% on a quiet hour (floor 3.0 / 8.2 / 2.6 / 1.9 / 1.9%); on noisy hours the floor
    reached 14-29%."""
    rows = list(fidelity.rows.values())
    judged, figs = fd.verdict(rows, fidelity.floor)
    med, floor = fd.medians_over(rows), fd.medians_over(fidelity.floor)
    if judged == "too noisy":
        pytest.skip(f"host too noisy to judge {figs}: sim {med}, real vs real {floor}")

    # Two repeats: their mean is itself off the engine's true figure by about half their
    # difference (the floor), so a miss is charged beyond target + floor / 2 only.
    def beyond_margin(k: str) -> bool:
        m = med[k]
        return m is None or m > fd.TARGETS[k] + (floor[k] or 0.0) / 2

    beyond = [k for k in figs if beyond_margin(k)]
    assert not beyond, (judged, beyond, med, floor)


def test_verdict_judges_only_what_the_floor_allows() -> None:
    """Hand-made rows: a miss on a figure whose floor is within its target is a miss; a
    miss where the real engine differed from itself by more is "too noisy"; no floor
    (one repeat) judges every figure."""

    def row(**err: float) -> fd.Row:
        full = {k: 1.0 for k in fd.TARGETS}
        return fd.Row("w", {}, {}, {**full, **err})

    ok, tpot_off = [row()], [row(tpot_p50=12.0)]
    assert fd.verdict(ok, []) == ("met", [])
    assert fd.verdict([row(output_tok_s=0.0)], []) == ("met", [])  # exact is met
    assert fd.verdict(tpot_off, []) == ("missed", ["tpot_p50"])
    assert fd.verdict(tpot_off, [row(tpot_p50=9.0)]) == ("missed", ["tpot_p50"])
    assert fd.verdict(tpot_off, [row(tpot_p50=15.0)]) == ("too noisy", ["tpot_p50"])
    both = [row(tpot_p50=12.0, output_tok_s=11.0)]
    assert fd.verdict(both, [row(tpot_p50=15.0)]) == ("missed", ["output_tok_s"])


@pytest.mark.engine
def test_llamacpp_burst_of_long_prompts_gets_first_tokens_together(llamacpp_server) -> None:
    """Two 1,500-token prompts at once on llama-server (2 slots, n_batch 2048, Gemma 3: SWA).
    Processed first come, first served, the first prompt would finish in step one (1,500 +
    548 tokens) at ~2/3 of the second's TTFT; llama-server stops every prompt 516 and 4
    tokens before its end (context checkpoints), so both finish in the third step. The
    simulator's slots scheduler must show the same (`scheduler.prompt_breaks`)."""
    from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG
    from servetune.metrics.compute import request_latencies_ms

    w = fd.closed_workload(2, 2, fd.fixed_tokens(1500), fd.fixed_tokens(4))
    case = fd.Case("burst-2x1500", w)
    srv = llamacpp_server
    real = fd.bench_real(srv.url, srv.served_model, case, "llamacpp", scrape=False)
    sim = fd.simulate_like(real, "gemma-3-270m", LLAMACPP_TEST_CONFIG, None)
    for res in (real, sim):
        ttft = sorted(request_latencies_ms(r)[0] for r in res.records)
        assert len(ttft) == 2 and ttft[0] > 0.9 * ttft[1], (res.target, ttft)


def test_noise_floor_compares_even_and_odd_repeats_of_held_out_workloads() -> None:
    """Three repeats of one workload (the middle one on an engine twice as slow per step),
    a calibration run and a single-run workload: one row, odd repeats (the slow one)
    against the median of the even ones (identical), errors as for a simulation."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.sim.profile import Profile

    m, hw = get_model("llama-3.2-1b"), get_hardware("cpu-host")
    cfg = EngineConfig(max_num_seqs=4, max_model_len=2048)

    def run(name: str, const: float, t0: float):
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
        res, _ = simulate(m, hw, cfg, w, profile=prof)
        return res.model_copy(update={"started_unix_s": t0})

    reps = [run("w", c, t) for c, t in ((0.03, 1.0), (0.06, 2.0), (0.03, 3.0))]
    rows = fd.noise_floor([*reps, run("cal-x", 0.05, 0.5), run("once", 0.02, 4.0)])
    assert [r.name for r in rows] == ["w"] and rows[0].extra == {"repeats": 3}
    slow, fast = fd.figures(reps[1].metrics), fd.figures(reps[0].metrics)
    assert rows[0].err == fd.abs_pct_errors(fast, slow)
    assert rows[0].err["output_tok_s"] > 20  # a 2x slower step shows


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
