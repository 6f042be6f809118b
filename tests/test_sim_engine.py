"""simulate() end to end: planner-sized pool, RunResult, metrics, profiles, CLI errors."""

from __future__ import annotations

import json

import pytest

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.plan.planner import evaluate
from servetune.sim.calibrate import fit_profile
from servetune.sim.engine import setup, simulate
from servetune.sim.profile import Profile, load_profile, save_profile
from servetune.status import RequestStatus
from servetune.workload.spec import parse_workload

M, HW = get_model("llama-3.1-8b"), get_hardware("h100-sxm")


def spec(**kw):
    base = {
        "input_tokens": {"dist": "uniform", "low": 100, "high": 600},
        "output_tokens": {"dist": "uniform", "low": 20, "high": 200},
        "count": 300,
        "arrival": {"kind": "poisson", "rate": 20},
    }
    base.update(kw)
    return parse_workload(base)


def test_pool_comes_from_the_planner():
    cfg = EngineConfig(max_model_len=8192)
    su = setup(M, HW, cfg)
    assert su.sched.kv_blocks == evaluate(M, HW, cfg).kv_blocks - 1
    assert su.step_model.tier == "gpu"  # vLLM on a GPU: per-kernel figures (sim.gpu_step)


def test_simulate_produces_a_runresult_with_bench_metrics():
    res, _ = simulate(M, HW, EngineConfig(max_model_len=8192, max_num_seqs=64), spec())
    assert res.backend == "sim" and res.target.tier == "gpu"
    assert len(res.records) == 300 and res.metrics.completed == 300
    r = res.records[0]
    assert len(r.chunk_ns) == r.output_tokens and r.chunk_ns == sorted(r.chunk_ns)
    assert res.metrics.ttft_ms.p50 > 0 and res.metrics.tpot_ms.p50 > 0
    json.loads(res.model_dump_json())  # serialisable like a bench result


def test_ttft_cliff_past_capacity():
    cfg = EngineConfig(max_model_len=8192, max_num_seqs=16)
    low, _ = simulate(M, HW, cfg, spec(arrival={"kind": "poisson", "rate": 2}))
    high, _ = simulate(M, HW, cfg, spec(arrival={"kind": "poisson", "rate": 200}))
    assert high.metrics.ttft_ms.p50 > 10 * low.metrics.ttft_ms.p50


def test_kv_pressure_preempts():
    cfg = EngineConfig(max_model_len=2048, kv_cache_space_gib=0.5, max_num_seqs=256)
    res, sched = simulate(M, HW, cfg, spec(arrival={"kind": "poisson", "rate": 500}))
    assert sched.stats.preemptions > 0 and res.metrics.completed == 300


def test_memory_headroom_check_is_the_peak_share_of_the_pool():
    from servetune.slo import parse_slo

    cfg = EngineConfig(max_model_len=2048, kv_cache_space_gib=0.5, max_num_seqs=256)
    busy = spec(arrival={"kind": "poisson", "rate": 500})
    for limit, ok in ((0.5, False), (1.0, True)):
        slo = parse_slo({"kv_cache_usage_max": limit})
        res, sched = simulate(M, HW, cfg, busy, slo=slo)
        (check,) = res.metrics.slo_checks
        assert check.value == sched.stats.max_blocks_used / res.target.kv_blocks
        assert check.ok is ok and res.metrics.slo_pass is ok
    # llama.cpp slots preallocate KV: reported as not measured, never a failure
    cpu, g = get_hardware("cpu-host"), get_model("gemma-3-270m")
    lcfg = EngineConfig(engine="llamacpp", parallel_slots=4, kv_cache_tokens=8192)
    res, _ = simulate(g, cpu, lcfg, spec(), slo=parse_slo({"kv_cache_usage_max": 0.1}))
    (check,) = res.metrics.slo_checks
    assert check.value is None and check.ok and "not measured" in check.note


def test_prefix_cache_lowers_ttft():
    w = spec(prefix={"groups": 2, "tokens": 512}, input_tokens={"dist": "fixed", "value": 600})
    on, _ = simulate(M, HW, EngineConfig(max_model_len=8192), w)
    off, _ = simulate(M, HW, EngineConfig(max_model_len=8192, enable_prefix_caching=False), w)
    assert on.target.sim.prefix_hit_tokens > 0
    assert on.metrics.ttft_ms.p50 < off.metrics.ttft_ms.p50


def test_rejections_are_per_request_errors():
    res, _ = simulate(M, HW, EngineConfig(max_model_len=300), spec())
    bad = [r for r in res.records if r.status == RequestStatus.ERROR]
    assert bad and all("max_model_len" in r.error_detail for r in bad)
    assert res.metrics.failed == len(bad)


def test_closed_loop_duration_runs():
    w = spec(arrival={"kind": "closed", "concurrency": 8}, count=None, duration_s=5.0)
    res, _ = simulate(M, HW, EngineConfig(max_model_len=8192), w)
    assert res.metrics.max_in_flight <= 8 and res.metrics.completed > 30


def test_llamacpp_slots():
    cpu, g = get_hardware("cpu-host"), get_model("gemma-3-270m")
    cfg = EngineConfig(engine="llamacpp", parallel_slots=4, kv_cache_tokens=8192)
    res, sched = simulate(g, cpu, cfg, spec())
    assert sched.cfg.slot_ctx == 2048 and res.metrics.completed == 300


def test_llamacpp_slot_context_matches_the_launch_command():
    """max_model_len is per request: the adapter launches -c max_model_len x -np, and the
    simulated slots get exactly that context each (unified KV: -c is the shared pool)."""
    from servetune.engines import launch_command

    cpu, g = get_hardware("cpu-host"), get_model("gemma-3-270m")
    for unified in (False, True):
        cfg = EngineConfig(
            engine="llamacpp", max_model_len=2048, parallel_slots=2, kv_unified=unified
        )
        argv = launch_command("llamacpp", cfg, "m.gguf", device="cpu").argv
        c, np_ = int(argv[argv.index("-c") + 1]), int(argv[argv.index("-np") + 1])
        sc = setup(g, cpu, cfg).sched
        assert sc.slot_ctx == (c if unified else c // np_) and sc.max_model_len == 2048


def test_cpu_threads_take_their_share_of_the_host():
    cpu, g = get_hardware("cpu-host"), get_model("gemma-3-270m")  # 16 cores
    tpot = {}
    for threads in (4, 16, 32):
        cfg = EngineConfig(engine="llamacpp", parallel_slots=4, threads=threads)
        res, _ = simulate(g, cpu, cfg, spec())
        tpot[threads] = res.metrics.tpot_ms.p50
    assert tpot[4] > 3 * tpot[16]  # a quarter of the cores: ~4x slower steps
    assert tpot[32] == tpot[16]  # more threads than cores buys nothing


def test_config_without_kv_is_one_line_error():
    with pytest.raises(InputError, match="would not start"):
        setup(M, get_hardware("cpu-host"), EngineConfig(kv_cache_space_gib=0.001))


def test_fit_recovers_known_coefficients(tmp_path):
    true = {"const": 0.008, "prefill_tokens": 5e-5, "decode_seqs": 3e-4, "kv_read_tokens": 2e-7}
    prof = Profile(engine="vllm", model=M.name, hardware=HW.name, coefficients=true)
    cfg = EngineConfig(max_model_len=8192, max_num_seqs=32)
    runs = [
        simulate(M, HW, cfg, spec(arrival={"kind": "poisson", "rate": r}), profile=prof)[0]
        for r in (3, 10, 30)
    ]
    fit = fit_profile(runs, engine="vllm", model=M.name, hardware=HW.name)
    assert fit.fit.r2 > 0.9
    assert fit.coefficients["const"] == pytest.approx(0.008, rel=0.15)
    assert fit.coefficients["decode_seqs"] == pytest.approx(3e-4, rel=0.3)
    path = tmp_path / "p.json"
    save_profile(fit, path)
    assert load_profile(path).coefficients == fit.coefficients
    # the fitted profile predicts the run it was fitted on
    again, _ = simulate(M, HW, cfg, spec(arrival={"kind": "poisson", "rate": 10}), profile=fit)
    assert again.target.tier == "calibrated"
    assert again.metrics.tpot_ms.p50 == pytest.approx(runs[1].metrics.tpot_ms.p50, rel=0.1)


def test_profile_for_another_model_is_refused():
    prof = Profile(engine="vllm", model="qwen3-8b", hardware=HW.name, coefficients={})
    with pytest.raises(InputError, match="profile is for vllm/qwen3-8b"):
        setup(M, HW, EngineConfig(), prof)


def test_dataset_workload_counts_prompts_with_a_tokenizer_or_words(tmp_path):
    """Dataset prompts are real text: counted by the given tokenizer, else one token per
    word (CountingTokenizer used to parse only its own "#n" texts and crashed here)."""
    from servetune.sim.engine import CountingTokenizer
    from servetune.workload.tokenizer import WordTokenizer

    rows = [
        {"prompt": "the quick brown fox jumps", "output_tokens": 8},
        {"prompt": "#5 reasons to simulate an engine first", "output_tokens": 4},
        {"messages": [{"role": "user", "content": "hello there world"}], "output_tokens": 3},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = parse_workload(
        {
            "api": "completions",
            "count": 3,
            "arrival": {"kind": "closed", "concurrency": 1},
            "dataset": {"path": str(path), "shuffle": False},
        }
    )
    cfg = EngineConfig(max_model_len=8192)
    res, _ = simulate(M, HW, cfg, w, keep_requests=True)
    assert res.metrics.completed == 3
    assert sorted(q.prompt_tokens for q in res.requests) == [3, 5, 7]

    class Double(WordTokenizer):  # a "real" tokenizer: two tokens per word
        name = "double"

        def encode(self, text):
            return super().encode(text) * 2

    res2, _ = simulate(M, HW, cfg, w, keep_requests=True, tokenizer=Double())
    assert sorted(q.prompt_tokens for q in res2.requests) == [6, 10, 14]
    assert len(CountingTokenizer().encode(CountingTokenizer().decode([0] * 7))) == 7


def test_decode_stretch_end_times_are_the_running_sum_of_single_steps():
    """`decode_ends_s` (plain floats up to 16 steps, numpy beyond) must price a
    jump exactly as stepping one decode at a time would, on both tiers."""
    import random

    from servetune.sim.steptime import calibrated_model

    roofline = setup(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), EngineConfig()).step_model
    coef = {"const": 0.01, "prefill_tokens": 1e-3, "decode_seqs": 2e-4, "kv_read_tokens": 3e-6}
    rng = random.Random(3)
    for model in (roofline, calibrated_model({**coef, "attn_pairs": 1e-8}, 0.0)):
        for _ in range(100):
            b, ctx0, n = rng.randint(1, 64), rng.uniform(0, 1e5), rng.randint(1, 40)
            t, want = 0.5, []
            for j in range(n):
                t += model.decode_time_s(b, ctx0 + b * j)
                want.append(t)
            assert model.decode_ends_s(0.5, b, ctx0, n) == pytest.approx(want, rel=1e-12)


def test_a_calibrated_closed_loop_keeps_its_clusters_round_after_round():
    """Real vLLM-CPU keeps a fixed-length closed loop in lock-step for all 10 rounds
    (benchmarks/closed_loop_rounds.py: c4 64/64 was [3, 1] in 8 of 9 rounds). The
    calibrated tier starts every user at t=0 (no phases) and its engine keeps the users
    that once shared a prefill step together: every round after the first has the same
    TTFTs, a lone first prompt and the other three one step later. Coefficients and front
    end: the profile fitted on this host's default sweep (2026-12-02)."""
    coef = {
        "const": 0.0214,
        "prefill_tokens": 6.88e-4,
        "kv_read_tokens": 1.33e-6,
        "attn_pairs": 5.8e-10,
        "prefill_sq": 1.23e-6,
    }
    prof = Profile(
        engine="vllm",
        model=M.name,
        hardware=HW.name,
        coefficients=coef,
        api_overhead_s=0.0175,
        ingress_s=0.0032,
        ingress_per_token_s=4.8e-5,
    )
    loop = parse_workload(
        {
            "input_tokens": {"dist": "fixed", "value": 64},
            "output_tokens": {"dist": "fixed", "value": 64},
            "count": 40,
            "arrival": {"kind": "closed", "concurrency": 4},
        }
    )
    res, _ = simulate(M, HW, EngineConfig(max_num_seqs=4), loop, profile=prof)
    recs = sorted(res.records, key=lambda r: r.send_ns)
    ttft = [(r.chunk_ns[0] - r.send_ns) / 1e6 for r in recs]
    rounds = [sorted(round(t, 3) for t in ttft[k : k + 4]) for k in range(4, 40, 4)]
    assert all(r == rounds[0] for r in rounds)  # the same every round: lock-step
    lone, *rest = rounds[0]
    assert len(set(rest)) == 1 and rest[0] > 1.5 * lone  # three prefilled together, later


@pytest.mark.parametrize("cap", [1, 4])
def test_an_open_loops_cap_is_never_exceeded(cap: int):
    """20 req/s against replies that take longer than 1/20 s: the cap binds all run long.
    The scheduler books an end ahead of sends it has not taken yet; a send before that end
    still finds the place taken (at a cap of 1, 2 were in flight)."""
    w = spec(arrival={"kind": "poisson", "rate": 20, "concurrency": cap}, count=60)
    res, _ = simulate(M, HW, EngineConfig(max_model_len=8192), w)
    assert res.metrics.completed == 60 and res.metrics.max_in_flight == cap


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "gemma-2-9b"])
def test_a_sliding_window_pool_holds_only_the_bytes_its_sequences_take(name):
    """Sequences under the window hold every layer's KV: the simulator keeps at most the
    sequences plan counts for that context (`window_pool`); it had counted blocks at
    max_model_len's average cost and held ~584 of mistral-7b-v0.1's 1,280-token sequences
    in a pool whose bytes hold 361."""
    model = get_model(name)
    cfg = EngineConfig(max_num_seqs=1024)
    wl = {"input_tokens": 1024, "output_tokens": 256, "count": 700}
    res, _ = simulate(model, HW, cfg, spec(**wl, arrival={"kind": "closed", "concurrency": 700}))
    ev = evaluate(model, HW, cfg)
    seqs = evaluate(model, HW, cfg, avg_context=1280).max_concurrency
    held = res.target.sim.max_kv_blocks_used // (1280 // cfg.block_size)
    assert res.target.kv_blocks < ev.kv_blocks - 1  # recounted: fewer blocks
    assert held <= seqs and res.target.sim.preemptions > 0
    assert res.target.kv_capacity_tokens == res.target.kv_blocks * cfg.block_size


def test_a_full_attention_pool_is_the_planners_whatever_the_lengths():
    cfg = EngineConfig(max_model_len=8192)
    res, _ = simulate(M, HW, cfg, spec(input_tokens=64, output_tokens=8, count=20))
    assert res.target.kv_blocks == evaluate(M, HW, cfg).kv_blocks - 1
