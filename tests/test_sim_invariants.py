"""Scheduler invariants over random workloads and configs (hypothesis): KV blocks conserved
and never negative or above capacity (checked every step), every request finishes or is
rejected with a reason, tokens conserved, time monotonic."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servetune.sim.request import Phase, SimRequest
from servetune.sim.scheduler import SchedConfig, Scheduler
from servetune.sim.steptime import calibrated_model

MODEL = calibrated_model(
    {"const": 0.004, "prefill_tokens": 1e-4, "decode_seqs": 2e-4, "kv_read_tokens": 1e-6}, 0.0
)


@st.composite
def scenario(draw):
    bs = draw(st.sampled_from([1, 4, 16]))
    seqs = draw(st.integers(1, 8))
    paged = draw(st.booleans())
    chunked = draw(st.booleans())
    max_len = 256
    batched = draw(st.integers(max(seqs, 1), 600))
    if not chunked:
        batched = max(batched, max_len)
    c = SchedConfig(
        mode="paged" if paged else "slots",
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        max_model_len=max_len,
        block_size=bs,
        kv_blocks=draw(st.integers(1, 120)) if paged else 0,
        chunked_prefill=chunked if paged else True,
        prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])) if paged else "fcfs",
        slot_ctx=draw(st.integers(20, 400)),
        kv_unified=draw(st.booleans()),
        prompt_breaks=() if paged or not draw(st.booleans()) else (4 + draw(st.integers(1, 64)), 4),
    )
    n = draw(st.integers(1, 25))
    reqs = []
    t = 0.0
    for i in range(n):
        t += draw(st.floats(0, 0.05))
        group = draw(st.integers(-1, 2))
        prompt = draw(st.integers(1, 200))
        reqs.append(
            SimRequest(
                i,
                i,
                prompt,
                draw(st.integers(1, 80)),
                t,
                draw(st.integers(0, 3)),
                group,
                min(prompt, 48) if group >= 0 else 0,
                scheduled_s=t,
            )
        )
    closed = draw(st.one_of(st.none(), st.integers(1, 4)))
    return c, reqs, closed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_invariants(sc):
    c, reqs, closed = sc
    s = Scheduler(c, MODEL, closed_users=closed, check=True)
    s.run(reqs)
    assert len(s.done) == len(reqs)
    times = np.asarray(s.step_end_s)
    assert np.all(np.diff(times) > 0), "time must increase step by step"
    for r in reqs:
        assert r.phase in (Phase.DONE, Phase.REJECTED)
        if r.phase is Phase.REJECTED:
            assert r.reject_reason
            continue
        ranges = r.token_step_ranges
        steps = [k for a, b in zip(ranges[::2], ranges[1::2], strict=True) for k in range(a, b)]
        assert len(steps) == r.output_tokens == r.generated, "tokens conserved"
        assert steps == sorted(set(steps)), "one token per step, in order"
        assert times[steps[0]] >= r.arrival_s
    if c.mode == "paged":
        assert s.policy.kv.available == c.kv_blocks and not s.policy.kv.refs
        assert s.stats.max_blocks_used <= c.kv_blocks
