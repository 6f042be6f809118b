"""Hand-computed scheduler scenarios, with a calibrated step model whose
coefficients make every step time easy to add up by hand."""

from __future__ import annotations

import numpy as np
import pytest

from servetune.sim.policies import prompt_breaks
from servetune.sim.request import Phase, SimRequest
from servetune.sim.scheduler import SchedConfig, Scheduler
from servetune.sim.steptime import calibrated_model

C0, PER_TOKEN = 0.010, 0.001  # 10 ms per step + 1 ms per prefill token


def model(api: float = 0.0, per_decode: float = 0.0):
    return calibrated_model(
        {"const": C0, "prefill_tokens": PER_TOKEN, "decode_seqs": per_decode}, api
    )


def cfg(**kw) -> SchedConfig:
    base = dict(
        mode="paged",
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        max_model_len=4096,
        block_size=16,
        kv_blocks=1000,
    )
    base.update(kw)
    return SchedConfig(**base)


def req(i, prompt, out, t=0.0, prio=0, group=-1, shared=0) -> SimRequest:
    return SimRequest(i, i, prompt, out, t, prio, group, shared, scheduled_s=t)


def token_times(sched: Scheduler, r: SimRequest) -> list[float]:
    times = np.asarray(sched.step_end_s)
    ranges = r.token_step_ranges
    return np.concatenate(
        [times[ranges[k] : ranges[k + 1]] for k in range(0, len(ranges), 2)]
    ).tolist()


def run(c: SchedConfig, reqs: list[SimRequest], **kw) -> Scheduler:
    s = Scheduler(c, model(**kw.pop("model_kw", {})), check=True, **kw)
    s.run(reqs)
    return s


def test_one_request_ttft_is_its_prefill_step():
    r = req(0, 100, 5)
    s = run(cfg(), [r])
    t = token_times(s, r)
    # prefill step: 10 ms + 100 x 1 ms; then 4 decode steps of 10 ms each
    assert t == pytest.approx([0.110, 0.120, 0.130, 0.140, 0.150])
    assert r.phase is Phase.DONE and len(t) == 5


def test_a_new_step_size_pays_once_per_engine():
    # 50 ms + 1 ms/token the first time a step of that many tokens runs (CPU engines)
    shape_model = calibrated_model(
        {"const": C0, "prefill_tokens": PER_TOKEN}, 0.0, new_shape_s=0.05,
        new_shape_per_token_s=0.001,
    )  # fmt: skip
    history: set[int] = set()
    first, again = req(0, 100, 3), req(0, 100, 3)
    s = Scheduler(cfg(), shape_model, check=True, shapes=history)
    s.run([first])
    # prefill 110 ms + new shape 100 tokens (50 + 100 ms); decode batch 1 is new too (51 ms)
    assert token_times(s, first) == pytest.approx([0.260, 0.321, 0.331])
    assert history == {100, 1}
    s2 = Scheduler(cfg(), shape_model, check=True, shapes=history)  # same engine, later run
    s2.run([again])
    assert token_times(s2, again) == pytest.approx([0.110, 0.120, 0.130])


def test_api_overhead_shifts_every_chunk():
    r = req(0, 10, 2)
    s = run(cfg(), [r], model_kw={"api": 0.005})
    rec_first = s.step_end_s[r.token_step_ranges[0]] + s.model.api_overhead_s
    assert rec_first == pytest.approx(0.020 + 0.005)


def test_two_requests_share_steps_with_chunked_prefill():
    a, b = req(0, 100, 3), req(1, 50, 2)
    s = run(cfg(max_num_batched_tokens=128), [a, b])
    # step 0: a's 100 + b's first 28 tokens -> 10 + 128 = 138 ms; a's first token.
    # step 1: a decodes + b's last 22 tokens -> 10 + 22 = 32 ms; b's first, a's second.
    # step 2: both decode -> 10 ms; a's third (last), b's second (last).
    assert token_times(s, a) == pytest.approx([0.138, 0.170, 0.180])
    assert token_times(s, b) == pytest.approx([0.170, 0.180])


def test_max_num_seqs_queues_the_second_request():
    a, b = req(0, 10, 2), req(1, 10, 2)
    s = run(cfg(max_num_seqs=1), [a, b])
    # a: prefill 20 ms, decode 10 ms -> done at 30 ms; b then starts: 50, 60 ms
    assert token_times(s, a) == pytest.approx([0.020, 0.030])
    assert token_times(s, b) == pytest.approx([0.050, 0.060])


def test_kv_exhaustion_preempts_the_tail_and_recomputes():
    # 4 blocks of 16 tokens; two requests of 16 + 20 tokens need 3 blocks each.
    a, b = req(0, 16, 20), req(1, 16, 20)
    s = run(cfg(kv_blocks=4, prefix_caching=False), [a, b])
    assert s.stats.preemptions == 1
    assert b.preemptions == 1 and a.preemptions == 0  # the tail (b) was preempted
    assert len(token_times(s, a)) == 20 and len(token_times(s, b)) == 20
    # b holds 16 + 17 = 33 tokens (the 33rd sampled, not yet in KV) when it needs a third
    # block: preempted, it recomputes prompt + generated = 33 tokens later.
    assert s.stats.prefill_tokens == 16 + 16 + 33
    tb = token_times(s, b)
    assert all(x < y for x, y in zip(tb, tb[1:], strict=False))
    assert s.policy.kv.available == 4


@pytest.mark.parametrize("policy, victim", [("fcfs", 1), ("priority", 0)])
def test_preemption_takes_the_tail_or_the_worst_priority(policy, victim):
    """a (priority 1) starts first, b (priority 0) a step later; four blocks cannot hold
    both: fcfs preempts the tail of the running list (b), priority the request it ranks
    last (a)."""
    reqs = [req(0, 16, 20, prio=1), req(1, 16, 20, t=0.001, prio=0)]
    s = run(cfg(kv_blocks=4, prefix_caching=False, policy=policy), reqs)
    assert [r.preemptions for r in reqs] == [1 if r.index == victim else 0 for r in reqs]
    assert s.stats.preemptions == 1


def test_preempted_request_hits_its_own_cached_blocks():
    a, b = req(0, 16, 20), req(1, 16, 20)
    s = run(cfg(kv_blocks=5, prefix_caching=True), [a, b])
    assert s.stats.preemptions >= 1
    assert b.prefix_hit_tokens > 0  # its full blocks survived in the LRU and were reused


def test_prefix_hit_removes_prefill_tokens():
    # Both share a 64-token prefix; b arrives after a's prefill is done.
    a = req(0, 80, 10, t=0.0, group=1, shared=64)
    b = req(1, 80, 10, t=0.2, group=1, shared=64)
    s = run(cfg(), [a, b])
    assert s.stats.prefix_hit_tokens == 64
    assert s.stats.prefill_tokens == 80 + 16
    # a is done at 90 + 9 x 10 = 180 ms, so b runs alone: TTFT = 10 + 16 ms
    assert token_times(s, b)[0] - 0.2 == pytest.approx(0.026)


def test_a_prefix_hit_pays_cached_pairs_and_a_fresh_prompt_does_not():
    """cached_pairs prices the hit's 16 new tokens' reads of its 64 cached ones (16 x 64
    pairs); a's fresh 80-token prompt has no cached context, so the term costs it nothing."""
    m = calibrated_model({"const": C0, "prefill_tokens": PER_TOKEN, "cached_pairs": 1e-5}, 0.0)
    a = req(0, 80, 10, t=0.0, group=1, shared=64)
    b = req(1, 80, 10, t=0.2, group=1, shared=64)
    s = Scheduler(cfg(), m, check=True)
    s.run([a, b])
    assert token_times(s, a)[0] == pytest.approx(C0 + 80 * PER_TOKEN)
    assert token_times(s, b)[0] - 0.2 == pytest.approx(C0 + 16 * PER_TOKEN + 1e-5 * 16 * 64)


def test_no_prefix_hit_without_caching():
    a = req(0, 80, 10, t=0.0, group=1, shared=64)
    b = req(1, 80, 10, t=0.2, group=1, shared=64)
    s = run(cfg(prefix_caching=False), [a, b])
    assert s.stats.prefix_hit_tokens == 0
    assert token_times(s, b)[0] - 0.2 == pytest.approx(0.090)


@pytest.mark.parametrize("policy, order", [("fcfs", [0, 1, 2]), ("priority", [2, 1, 0])])
def test_priority_reorders_waiting(policy, order):
    reqs = [req(0, 10, 2, prio=5), req(1, 10, 2, prio=1), req(2, 10, 2, prio=0)]
    s = run(cfg(max_num_seqs=1, policy=policy), reqs)
    firsts = [token_times(s, r)[0] for r in reqs]
    assert sorted(range(3), key=lambda i: firsts[i]) == order


def test_too_long_request_is_rejected_with_reason():
    ok, bad = req(0, 10, 5), req(1, 4000, 200)
    run(cfg(), [ok, bad])
    assert bad.phase is Phase.REJECTED and "max_model_len" in bad.reject_reason
    assert ok.phase is Phase.DONE


def test_open_loop_arrival_waits_for_the_step_boundary():
    a, b = req(0, 100, 3), req(1, 10, 1, t=0.05)
    s = run(cfg(), [a, b])
    # b arrives during a's prefill step (0-110 ms) and joins the next step:
    # 10 ms + 10 tokens (a decodes in the same step) -> 130 ms
    assert token_times(s, b) == pytest.approx([0.130])


def test_closed_loop_issues_next_on_finish():
    reqs = [req(i, 10, 2) for i in range(3)]
    s = Scheduler(cfg(), model(), closed_users=1, check=True)
    s.run(reqs)
    ends = [token_times(s, r)[-1] for r in reqs]
    starts = [r.arrival_s for r in reqs]
    assert starts[1] == pytest.approx(ends[0]) and starts[2] == pytest.approx(ends[1])


def test_decode_stretch_is_one_jump():
    reqs = [req(i, 10, 500) for i in range(4)]
    s = run(cfg(), reqs)
    assert s.stats.jumps <= 3 and s.stats.steps == 500


def test_an_arrival_does_not_cut_the_decode_stretch_of_a_full_batch():
    """max_num_seqs 1: a (100-token prompt, 6 tokens) decodes from 110 ms; b arrives at
    125 ms and can only queue. a's five decode steps stay one jump; b is prefilled when a
    finishes (160 ms + 10 + 50 ms) and decodes once."""
    a, b = req(0, 100, 6), req(1, 50, 2, t=0.125)
    s = run(cfg(max_num_seqs=1), [a, b])
    assert token_times(s, a) == pytest.approx([0.110, 0.120, 0.130, 0.140, 0.150, 0.160])
    assert token_times(s, b) == pytest.approx([0.220, 0.230])
    assert s.stats.jumps == 2  # a's stretch and b's single decode


def test_slots_mode_reuses_a_slot_prompt_cache():
    c = cfg(mode="slots", max_num_seqs=1, slot_ctx=1000, kv_blocks=0)
    a = req(0, 80, 2, group=3, shared=64)
    b = req(1, 80, 2, group=3, shared=64)
    s = run(c, [a, b])
    assert s.stats.prefix_hit_tokens == 64
    assert token_times(s, b)[0] == pytest.approx(0.090 + 0.010 + 0.026)


def test_llamacpp_checkpoint_breaks_make_a_burst_of_prompts_finish_together():
    """llama-server on an SWA model stops each prompt 4 + n_ubatch (516) and 4 tokens
    before its end within a step. Four 769-token prompts at t=0, 4 slots, n_batch 2048:
    steps of 4 x 253 = 1,012, 4 x 512 = 2,048 and 4 x 4 = 16 prompt tokens, and every first
    token comes with the third step. Without the breaks the first two prompts finish in
    the first step (769 + 769 + 510 tokens)."""
    breaks = prompt_breaks(2048, 512)
    assert breaks == (516, 4)
    c = cfg(mode="slots", max_num_seqs=4, slot_ctx=2048, kv_blocks=0)
    with_breaks = [req(i, 769, 2) for i in range(4)]
    s = run(cfg(mode="slots", max_num_seqs=4, slot_ctx=2048, prompt_breaks=breaks), with_breaks)
    first = 3 * C0 + (1012 + 2048 + 16) * PER_TOKEN
    assert [token_times(s, r)[0] for r in with_breaks] == pytest.approx([first] * 4)
    plain = [req(i, 769, 2) for i in range(4)]
    s = run(c, plain)
    assert token_times(s, plain[0])[0] == pytest.approx(C0 + 2048 * PER_TOKEN)
    assert token_times(s, plain[3])[0] > token_times(s, plain[0])[0]


def test_slots_mode_rejects_over_slot_context():
    c = cfg(mode="slots", max_num_seqs=2, slot_ctx=100, kv_blocks=0)
    a, b = req(0, 80, 10), req(1, 90, 20)
    run(c, [a, b])
    assert a.phase is Phase.DONE and b.phase is Phase.REJECTED and "slot context" in b.reject_reason


def test_serial_ingress_splits_a_burst_and_prefill_sq_is_charged():
    """Ingress 2 ms + 0.01 ms/token, served one request at a time: of two requests sent
    at t=0, a (100 tokens) reaches the idle engine at 3 ms and prefills alone; b is seen
    at 6 ms, during a's step, and prefills in the next step with a's decode. prefill_sq
    charges n (n + 1) / 2 per chunk."""
    m = calibrated_model(
        {"const": C0, "prefill_tokens": PER_TOKEN, "prefill_sq": 1e-6},
        0.0,
        ingress_s=0.002,
        ingress_per_token_s=1e-5,
    )
    a, b = req(0, 100, 2), req(1, 100, 1)
    s = Scheduler(cfg(), m, check=True, closed_users=2)
    s.run([a, b])
    step_a = C0 + 100 * PER_TOKEN + 1e-6 * 100 * 101 / 2  # 0.11505
    assert token_times(s, a)[0] == pytest.approx(0.003 + step_a)
    assert token_times(s, b) == pytest.approx([0.003 + 2 * step_a])
    assert token_times(s, a)[1] == token_times(s, b)[0]  # a's decode rides in b's step
