"""SGLang's scheduler model (`sim.sglang_policy`, `sim.sglang_sched`): hand-checkable
scenarios with a step model of 10 ms per step + 1 ms per prompt token, the KV pool `plan`
and `simulate` share, and the published SGLang runs through `validate --published`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_run import run_cli
from servetune.engines.config import EngineConfig
from servetune.engines.registry import adapter
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.plan.planner import evaluate
from servetune.plan.sglang_pool import default_fraction, max_running, memory_tier
from servetune.sim.engine import setup
from servetune.sim.request import Phase, SimRequest
from servetune.sim.scheduler import SchedConfig, Scheduler
from servetune.sim.sglang_policy import RadixConfig, ratio_after_retract
from servetune.sim.steptime import calibrated_model
from servetune.validate import published as pub

C0, PER_TOKEN = 0.010, 0.001  # 10 ms per step + 1 ms per prompt token
MODEL = calibrated_model({"const": C0, "prefill_tokens": PER_TOKEN}, 0.0)


def radix_cfg(**kw) -> SchedConfig:
    """SGLang at page size 1 over a pool of `kv_blocks` tokens."""
    radix = RadixConfig(
        chunked_prefill_size=kw.pop("chunk", 8192),
        max_prefill_tokens=16384,
        schedule_policy=kw.pop("policy", "fcfs"),
        ignore_eos_exact=kw.pop("exact", False),
    )
    base = dict(
        mode="radix",
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        max_model_len=8192,
        block_size=1,
        kv_blocks=100_000,
        radix=radix,
    )
    base.update(kw)
    return SchedConfig(**base)


def vllm_cfg(**kw) -> SchedConfig:
    base = dict(
        mode="paged",
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        max_model_len=8192,
        block_size=16,
        kv_blocks=10_000,
    )
    base.update(kw)
    return SchedConfig(**base)


def req(i, prompt, out, t=0.0, group=-1, shared=0) -> SimRequest:
    return SimRequest(i, i, prompt, out, t, 0, group, shared, scheduled_s=t)


def run(c: SchedConfig, reqs: list[SimRequest], **kw) -> Scheduler:
    s = Scheduler(c, MODEL, check=True, **kw)
    s.run(reqs)
    return s


def token_times(s: Scheduler, r: SimRequest) -> list[float]:
    times, ranges = np.asarray(s.step_end_s), r.token_step_ranges
    parts = [times[ranges[k] : ranges[k + 1]] for k in range(0, len(ranges), 2)]
    return np.concatenate(parts).tolist()


def first_token_order(s: Scheduler, reqs: list[SimRequest]) -> list[int]:
    return sorted((r.index for r in reqs), key=lambda i: token_times(s, reqs[i])[0])


def test_radix_reuses_a_shared_prefix_to_the_token():
    # the second request comes once the first is done: 100 of its 150 prompt tokens are
    # cached; SGLang reuses all 100 (page 1), vLLM the 6 full 16-token blocks = 96
    def pair() -> list[SimRequest]:
        return [req(0, 150, 3, 0.0, group=7, shared=100), req(1, 150, 3, 1.0, 7, 100)]

    sg, vl = pair(), pair()
    s = run(radix_cfg(), sg)
    run(vllm_cfg(), vl)
    assert sg[1].prefix_hit_tokens == 100 and vl[1].prefix_hit_tokens == 96
    # its prefill computes the other 50 tokens: 10 + 50 ms after it arrives
    assert token_times(s, sg[1])[0] == pytest.approx(1.0 + 0.060)
    assert s.stats.prefill_tokens == 150 + 50


def test_a_prefill_step_runs_alone_and_the_decoders_wait():
    # r0: prefill 100 tokens (110 ms), then 10 ms decode steps. r1 arrives during the step
    # that ends at 150 ms and is prefilled alone next (10 + 50 ms): r0 has no token at
    # 210 ms under SGLang; vLLM's mixed step gives both one then
    def two() -> list[SimRequest]:
        return [req(0, 100, 10), req(1, 50, 3, 0.145)]

    sg, vl = two(), two()
    s, v = run(radix_cfg(), sg), run(vllm_cfg(), vl)
    assert token_times(s, sg[0])[:7] == pytest.approx([0.11, 0.12, 0.13, 0.14, 0.15, 0.22, 0.23])
    assert token_times(s, sg[1])[0] == pytest.approx(0.21)
    assert token_times(v, vl[0])[5] == pytest.approx(0.21)  # vLLM: r0 rides the prefill step
    assert len(token_times(s, sg[0])) == 10


def test_lpm_serves_the_longest_cached_prefix_first():
    # max 1 running: r0 (group A) fills the cache while B1, A1, B2, C1 queue behind it.
    # lpm re-sorts before every batch: A1 first (200 tokens cached), then B1 (C1 and B2,
    # deferred, match nothing); once B1 ran, B2 finds 200 cached and goes before C1.
    # fcfs: arrival order
    def queue() -> list[SimRequest]:
        return [
            req(0, 300, 2, 0.0, group=1, shared=200),
            req(1, 300, 2, 0.01, group=2, shared=200),  # B1
            req(2, 300, 2, 0.01, group=1, shared=200),  # A1
            req(3, 300, 2, 0.01, group=2, shared=200),  # B2
            req(4, 300, 2, 0.01),  # C1
        ]

    lpm, fcfs = queue(), queue()
    s_lpm = run(radix_cfg(policy="lpm", max_num_seqs=1), lpm)
    s_fcfs = run(radix_cfg(max_num_seqs=1), fcfs)
    assert first_token_order(s_fcfs, fcfs) == [0, 1, 2, 3, 4]
    assert first_token_order(s_lpm, lpm) == [0, 2, 1, 3, 4]
    assert lpm[2].prefix_hit_tokens == 200 and lpm[3].prefix_hit_tokens == 200


def test_lpm_defers_a_request_whose_prefix_another_is_about_to_compute():
    # empty cache, 2 may run: B1 and B2 share a 200-token prefix. lpm admits B1 with C1
    # and holds B2 back a round, so B2 then reuses B1's prefix; fcfs admits B1 and B2
    # together and B2 computes the prefix again
    def queue() -> list[SimRequest]:
        return [
            req(0, 300, 20, 0.0, group=2, shared=200),  # B1
            req(1, 300, 20, 0.0, group=2, shared=200),  # B2
            req(2, 300, 20, 0.0),  # C1
        ]

    lpm, fcfs = queue(), queue()
    s_lpm = run(radix_cfg(policy="lpm", max_num_seqs=2), lpm)
    s_fcfs = run(radix_cfg(max_num_seqs=2), fcfs)
    first = [token_times(s_lpm, r)[0] for r in lpm]
    assert first[0] == first[2] < first[1]
    assert lpm[1].prefix_hit_tokens == 200 and fcfs[1].prefix_hit_tokens == 0
    assert token_times(s_fcfs, fcfs[0])[0] == token_times(s_fcfs, fcfs[1])[0]


def test_an_optimistic_new_token_ratio_ends_in_retractions():
    # 6 requests of 100 + 400 tokens on a 1,200-token pool: reserving 0.7 (decaying) of
    # what the running ones may still write admits more than the pool can finish, so
    # decoding runs dry and SGLang retracts; reserving it all (ratio 1, the radix cache
    # off with ignore_eos) never does. Every request still ends with its 400 tokens.
    def six() -> list[SimRequest]:
        return [req(i, 100, 400) for i in range(6)]

    optimistic, exact = six(), six()
    s = run(radix_cfg(kv_blocks=1200), optimistic)
    e = run(radix_cfg(kv_blocks=1200, exact=True, prefix_caching=False), exact)
    assert s.stats.preemptions > 0
    assert s.stats.preemptions == sum(r.preemptions for r in optimistic)
    assert e.stats.preemptions == 0
    for r in optimistic + exact:
        assert r.phase is Phase.DONE and len(token_times(s if r in optimistic else e, r)) == 400
    # a retracted request computes its prompt and its tokens again (what the tree lost)
    assert s.stats.prefill_tokens > 6 * 100 == e.stats.prefill_tokens


def test_conservativeness_scales_the_reservation():
    # the same six requests: at --schedule-conservativeness 0.3 the ratio starts at 0.21,
    # so the third starts as soon as the first two decode (10 + 100 ms after them); at 1.0
    # (ratio 0.7) it waits until the decoders' remaining tokens and the ratio have shrunk
    def third_start(conservativeness: float) -> float:
        six = [req(i, 100, 400) for i in range(6)]
        radix = RadixConfig(8192, 16384, conservativeness=conservativeness)
        s = run(radix_cfg(kv_blocks=1200, radix=radix), six)
        return token_times(s, six[2])[0]

    assert third_start(0.3) == pytest.approx(0.21 + 0.01 + 0.1)
    assert third_start(1.0) > 4.0
    su = setup(
        get_model("llama-3.1-8b"),
        get_hardware("h100-sxm"),
        EngineConfig(engine="sglang", extra_args=("--schedule-conservativeness", "0.3")),
    )
    assert su.sched.radix.init_ratio == pytest.approx(0.21)
    with pytest.raises(InputError, match="mixed-chunk"):
        setup(
            get_model("llama-3.1-8b"),
            get_hardware("h100-sxm"),
            EngineConfig(engine="sglang", extra_args=("--enable-mixed-chunk",)),
        )


def test_ratio_after_a_retraction():
    # (generated + 20 x requests) / (max_new_tokens + 1), at most 1
    assert ratio_after_retract([100, 50], [400, 400]) == pytest.approx(190 / 801)
    assert ratio_after_retract([390], [400]) == 1.0


def test_max_running_requests_caps_the_batch():
    reqs = [req(i, 100, 20) for i in range(10)]
    s = run(radix_cfg(max_num_seqs=3), reqs, trace=True)
    running = [row[4] for row in s.stats.trace]
    assert max(running) == 3
    # the 4th starts only when one of the first three is done
    first_done = min(token_times(s, reqs[i])[-1] for i in range(3))
    assert token_times(s, reqs[3])[0] > first_done


def test_chunked_prefill_splits_a_long_prompt():
    r = req(0, 2500, 2)
    s = run(radix_cfg(chunk=1000), [r], trace=True)
    chunks = [row[8] for row in s.stats.trace if row[8]]
    assert chunks == [1000, 1000, 500]
    # three prefill steps: (10 + 1000) + (10 + 1000) + (10 + 500) ms
    assert token_times(s, r)[0] == pytest.approx(2.530)


def test_plan_and_simulate_share_sglangs_pool():
    model, hw = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    cfg = EngineConfig(engine="sglang")
    ev, su = evaluate(model, hw, cfg), setup(model, hw, cfg)
    assert su.sched.mode == "radix" and su.sched.block_size == 1
    assert su.sched.kv_blocks == ev.kv_blocks == ev.kv_capacity_tokens
    # H100 80 GB: 8192-token chunks, 256 CUDA graphs: reserved 512 + 12288 + 512 + 128 MiB
    assert memory_tier(80, 1) == (8192, 256)
    assert default_fraction(80 * 1024, 8192, 256, 1, 1) == round(1 - 13440 / 81920, 3)
    assert su.sched.max_num_seqs == max_running(ev.kv_capacity_tokens, ev.max_model_len)
    b = ev.budget  # weights + KV pool = f x (memory free at start)
    assert b.weights_bytes + b.kv_pool_bytes == pytest.approx(b.usable_bytes)
    given = evaluate(model, hw, cfg.with_(gpu_memory_utilization=0.7))
    assert given.kv_capacity_tokens < ev.kv_capacity_tokens


def test_gpt_oss_gets_sglangs_two_pools_and_gemma_one() -> None:
    """SGLang pools a hybrid sliding-window model (GPT-OSS: 18 full-attention and 18
    window layers of one size) as a full pool and a window pool of 0.8 x its tokens, out of
    the bytes its profile priced at every layer full: the full pool gets 36 / (18 + 0.8 x 18)
    = 1.111x the all-full count, and the planner's and simulator's capacity is that pool.
    Gemma 3 has windows too but is not one of SGLang's hybrid architectures."""
    from servetune.plan import kv as kvmath
    from servetune.plan.sglang_pool import hybrid_swa_scale

    assert hybrid_swa_scale(18, 18) == pytest.approx(36 / 32.4)
    hw, cfg = get_hardware("h100-sxm"), EngineConfig(engine="sglang")
    model = get_model("gpt-oss-120b")
    ev, su = evaluate(model, hw, cfg), setup(model, hw, cfg)
    b = ev.budget
    all_full = int(b.kv_pool_bytes // kvmath.kv_bytes_per_token(model, b.kv_dtype_bytes, 1, 1))
    assert ev.kv_capacity_tokens == int(all_full * 36 / 32.4)
    assert b.kv_window_pool_tokens == int(ev.kv_capacity_tokens * 0.8)
    assert su.sched.kv_blocks == ev.kv_capacity_tokens  # simulate keeps the full pool
    assert su.sched.max_num_seqs == max_running(ev.kv_capacity_tokens, ev.max_model_len)
    # --max-total-tokens caps the all-full count before the split, as SGLang applies it
    capped = evaluate(model, hw, cfg.with_(kv_cache_tokens=60_000))
    assert capped.kv_capacity_tokens == int(60_000 * 36 / 32.4)
    # SGLang's own flags, as extra_args: another ratio, or the hybrid pool turned off
    half = evaluate(model, hw, cfg.with_(extra_args=("--swa-full-tokens-ratio", "0.5")))
    assert half.kv_capacity_tokens == int(all_full * 36 / 27)
    assert half.budget.kv_window_pool_tokens == int(half.kv_capacity_tokens * 0.5)
    off = evaluate(model, hw, cfg.with_(extra_args=("--disable-hybrid-swa-memory",)))
    assert off.kv_capacity_tokens == all_full and off.budget.kv_window_pool_tokens is None
    from servetune.sim.engine import capacity_note

    assert f"window layers' own ({b.kv_window_pool_tokens:,} tokens)" in capacity_note(su)
    gemma = evaluate(get_model("gemma-3-27b"), hw, cfg).budget
    assert gemma.kv_window_pool_tokens is None
    assert gemma.kv_pool_tokens == int(
        gemma.kv_pool_bytes // kvmath.kv_bytes_per_token(get_model("gemma-3-27b"), 2, 1, 1)
    )


def test_lpm_is_sglangs_policy_only():
    assert (
        "--schedule-policy"
        in adapter("sglang").build(EngineConfig(engine="sglang", scheduling_policy="lpm"), "m").argv
    )
    with pytest.raises(InputError, match="lpm"):
        adapter("vllm").build(EngineConfig(scheduling_policy="lpm"), "m")


def test_published_sglang_runs_run_through_validate():
    runs = [r for r in pub.load_runs() if r.engine == "sglang"]
    assert len(runs) >= 8
    assert all(r.group.startswith("sglang: ") for r in runs)
    results = pub.evaluate(runs, ("gpu",))
    errs = results["gpu"]
    assert not [e.run.id for e in errs if e.refused]
    assert all(e.sim_ttft_ms and e.sim_tpot_ms for e in errs)
    report = pub.format_report(results)
    assert "sglang rows" in report and "sglang: llama-3.1-70b x a100-80g-sxm" in report


@st.composite
def radix_scenario(draw):
    """A random SGLang config (page size, pool, chunking, policy, caching) and workload."""
    page = draw(st.sampled_from([1, 4, 16]))
    exact = draw(st.booleans())
    c = radix_cfg(
        chunk=draw(st.sampled_from([0, 64, 300])),
        policy=draw(st.sampled_from(["fcfs", "lpm", "priority"])),
        exact=exact,
        prefix_caching=not exact,
        max_num_seqs=draw(st.integers(1, 8)),
        max_model_len=256,
        block_size=page,
        kv_blocks=draw(st.integers(300, 900)) // page,
    )
    reqs, t = [], 0.0
    for i in range(draw(st.integers(1, 25))):
        t += draw(st.floats(0, 0.05))
        group, prompt = draw(st.integers(-1, 2)), draw(st.integers(1, 200))
        shared = min(prompt, 48) if group >= 0 else 0
        out = draw(st.integers(1, 80))
        reqs.append(SimRequest(i, i, prompt, out, t, draw(st.integers(0, 3)), group, shared))
    return c, reqs, draw(st.one_of(st.none(), st.integers(1, 4)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(radix_scenario())
def test_radix_invariants(sc):
    # KV pages conserved and references matching (checked every step), every request
    # done with all its tokens, one per step, in order, or rejected with a reason
    c, reqs, closed = sc
    s = Scheduler(c, MODEL, closed_users=closed, check=True)
    s.run(reqs)
    assert len(s.done) == len(reqs)
    times = np.asarray(s.step_end_s)
    assert np.all(np.diff(times) > 0)
    for r in reqs:
        if r.phase is Phase.REJECTED:
            assert r.reject_reason
            continue
        assert r.phase is Phase.DONE
        ranges = r.token_step_ranges
        steps = [k for a, b in zip(ranges[::2], ranges[1::2], strict=True) for k in range(a, b)]
        assert len(steps) == r.output_tokens == r.generated
        assert steps == sorted(set(steps)) and times[steps[0]] >= r.arrival_s
    assert s.policy.kv.available == c.kv_blocks and not s.policy.kv.refs


def test_cli_plans_and_simulates_sglang(capsys, tmp_path):
    code, out, _ = run_cli(
        capsys, "plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine", "sglang", "-s", "none",
        "--json",
    )  # fmt: skip
    assert code == 0
    planned = json.loads(out)["kv_capacity_tokens"]
    assert json.loads(out)["block_size"] == 1
    su = setup(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), EngineConfig(engine="sglang"))
    assert planned == su.sched.kv_blocks  # the same pool, page 1
    db = str(tmp_path / "runs.db")
    code, out, _ = run_cli(
        capsys, "simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine", "sglang",
        "-w", "examples/workloads/shared-prefix.yaml", "--set", "scheduling_policy=lpm",
        "--db", db,
    )  # fmt: skip
    assert code == 0
    assert f"KV pool {planned:,} tokens (RadixAttention" in out and "schedule policy lpm" in out
    code, _, err = run_cli(
        capsys, "simulate", "-m", "llama-3.1-8b", "-g", "cpu-host", "--engine", "sglang",
        "--db", db,
    )  # fmt: skip
    assert code == 2 and "SGLang" in err
    # a hybrid sliding-window model: both of SGLang's pools, in the JSON and the table
    oss = ("plan", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--engine", "sglang", "-s", "none")
    code, out, _ = run_cli(capsys, *oss, "--json")
    pools = json.loads(out)
    assert code == 0 and pools["kv_window_pool_tokens"] == int(pools["kv_capacity_tokens"] * 0.8)
    code, out, _ = run_cli(capsys, *oss)
    assert f"{pools['kv_window_pool_tokens']:,}" in out and "sliding-window layers' pool" in out
    # simulate --extra reaches SGLang's model (the docs' --set extra_args never could)
    sim = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--no-store",
           "-w", "examples/workloads/shared-prefix.yaml")  # fmt: skip
    extra = "--schedule-conservativeness 0.5"
    code, out, _ = run_cli(capsys, *sim, "--engine", "sglang", "--extra", extra)
    assert code == 0 and "new_token_ratio 0.35 ->" in out
    code, _, err = run_cli(capsys, *sim, "--engine", "sglang", "--extra", "--enable-mixed-chunk")
    assert code == 2 and "--enable-mixed-chunk is not modelled" in err
    code, _, err = run_cli(capsys, *sim, "--extra", extra)  # vLLM's model reads none
    assert code == 2 and "--extra: the vllm simulator reads no extra flags" in err
    # a flag SGLang does not have, or a value it would refuse, is refused against its
    # checked-in CLI: the plan printed it in a launch command, the simulator ignored it
    refused = [
        ("--bogus 1", "--bogus: no such flag in sglang"),
        ("--schedule-conservativeness x", "--schedule-conservativeness: wants float"),
    ]
    for args, why in refused:
        for command in (sim, oss):
            code, _, err = run_cli(capsys, *command, "--engine", "sglang", "--extra", args)
            assert code == 2 and f"error: --extra: {why}" in err, err


@pytest.mark.timeout(300)
def test_tune_backend_sim_tunes_sglang(capsys, tmp_path):
    (tmp_path / "space.yaml").write_text(
        "engine: sglang\nbaseline: {}\nknobs:\n  max_num_seqs: [4, 64]\n"
    )
    (tmp_path / "w.yaml").write_text(
        "name: w\ncount: 60\ninput_tokens: {dist: fixed, value: 800}\n"
        "output_tokens: {dist: fixed, value: 150}\narrival: {kind: poisson, rate: 1}\n"
    )
    (tmp_path / "slo.yaml").write_text("ttft_ms: {p95: 1000}\ntpot_ms: {p95: 50}\n")
    code, out, err = run_cli(
        capsys, "tune", "--backend", "sim", "--engine", "sglang", "-m", "llama-3.1-8b",
        "-g", "h100-sxm", "--space", str(tmp_path / "space.yaml"), "-w", str(tmp_path / "w.yaml"),
        "--slo", str(tmp_path / "slo.yaml"), "--max-probes", "3", "--db", str(tmp_path / "t.db"),
        "-o", str(tmp_path / "r.html"), "--json",
    )  # fmt: skip
    assert code == 0, err
    winner = json.loads(out)["winner"]
    assert winner["status"] == "ok" and "sglang.launch_server" in winner["launch_command"]


def test_plan_reads_sglangs_pool_flags_and_refuses_a_knobs_flag(capsys):
    """`plan --extra` reaches the planner as `simulate --extra` does (one pool for both),
    and only SGLang's command carries the flags. A knob's own flag (`--tp-size`) passed
    as an extra one was sized and simulated at the knob's value (TP1) while the engine
    would run the flag's: now refused, naming the knob."""
    oss = ("plan", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--engine", "sglang", "-s", "none")
    model, hw = get_model("gpt-oss-120b"), get_hardware("h100-sxm")
    half = EngineConfig(engine="sglang", extra_args=("--swa-full-tokens-ratio", "0.5"))
    code, out, _ = run_cli(capsys, *oss, "--extra", "--swa-full-tokens-ratio 0.5", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["kv_capacity_tokens"] == evaluate(model, hw, half).kv_capacity_tokens
    assert plan["kv_capacity_tokens"] == setup(model, hw, half).sched.kv_blocks
    assert plan["kv_window_pool_tokens"] == int(plan["kv_capacity_tokens"] * 0.5)
    assert plan["launch"]["sglang"].endswith("--swa-full-tokens-ratio 0.5")
    assert all("swa" not in cmd for name, cmd in plan["launch"].items() if name != "sglang")
    code, _, err = run_cli(capsys, *oss[:-4], "--extra", "--swa-full-tokens-ratio 0.5")
    assert code == 2 and "--extra: the vllm plan reads no extra flags" in err
    code, _, err = run_cli(capsys, *oss, "--extra", "--tp-size 2")
    assert code == 2 and "--tp-size is the tensor_parallel_size knob's flag (use --tp)" in err
    code, _, err = run_cli(capsys, *oss, "--extra", "--max-total-tokens=5000")
    assert code == 2 and "kv_cache_tokens knob's flag (plan without it)" in err
    sim = ("simulate", "-m", "gpt-oss-120b", "--engine", "sglang", "--no-store",
           "-w", "examples/workloads/chat.yaml", "--count", "4")  # fmt: skip
    code, _, err = run_cli(capsys, *sim, "--extra", "--context-length 4096")
    assert code == 2 and "--extra: --context-length is the max_model_len knob's flag" in err
    assert "(use --set max_model_len=N)" in err  # the flag typed, as plan names it


def test_knob_in_extra_names_a_knobs_flag_at_any_spelling():
    from servetune.engines.extra import knob_in_extra

    sg = EngineConfig(engine="sglang")
    page = ("--page-size=32",)
    assert knob_in_extra(sg.with_(extra_args=page)) == ("--page-size=32", "block_size")
    assert knob_in_extra(sg.with_(extra_args=("--swa-full-tokens-ratio", "0.5"))) is None
    # a knob already set: its flag is on the command and still the knob's
    tp2 = sg.with_(tensor_parallel_size=2, extra_args=("--tp_size", "4"))
    assert knob_in_extra(tp2) == ("--tp_size", "tensor_parallel_size")
    vllm = EngineConfig(extra_args=("--load-format", "dummy", "--max-num-seqs", "4"))
    assert knob_in_extra(vllm) == ("--max-num-seqs", "max_num_seqs")
    assert knob_in_extra(EngineConfig(extra_args=("--load-format", "dummy"))) is None
    # the simulator's own setup refuses it, so a tune space's fixed extra_args is too
    cfg = EngineConfig(engine="sglang", extra_args=("--tp-size", "2"))
    with pytest.raises(InputError, match="tensor_parallel_size knob's flag"):
        setup(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), cfg)
