"""llama.cpp's slots in the simulator: how `parallel_slots`, `batch_size` (-b), the ubatch
(-ub) and `kv_cache_tokens` (-c) change the steps and their times. Hand-computed with a
calibrated step model of 10 ms per forward pass + 1 ms per prompt token, so every time
adds up by hand."""

from __future__ import annotations

import numpy as np
import pytest

from servetune.engines.config import EngineConfig
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.sim.engine import setup, simulate
from servetune.sim.policies import ubatch_sizes
from servetune.sim.profile import Profile
from servetune.sim.request import SimRequest
from servetune.sim.scheduler import SchedConfig, Scheduler
from servetune.sim.steptime import calibrated_model
from servetune.workload.spec import parse_workload

C0, PER_TOKEN = 0.010, 0.001


def slots(n: int = 1, batch: int = 512, ubatch: int = 512, one_stream: bool = False):
    return SchedConfig(
        mode="slots",
        max_num_seqs=n,
        max_num_batched_tokens=max(batch, n),
        max_model_len=4096,
        slot_ctx=4096,
        kv_unified=one_stream,
        n_ubatch=min(ubatch, batch),
    )


def req(i: int, prompt: int, out: int) -> SimRequest:
    return SimRequest(i, i, prompt, out, 0.0, 0, -1, 0, scheduled_s=0.0)


def run(cfg: SchedConfig, reqs: list[SimRequest]) -> Scheduler:
    model = calibrated_model({"const": C0, "prefill_tokens": PER_TOKEN}, 0.0)
    s = Scheduler(cfg, model, check=True)
    s.run(reqs)
    return s


def token_times(s: Scheduler, r: SimRequest) -> list[float]:
    times, rg = np.asarray(s.step_end_s), r.token_step_ranges
    return np.concatenate([times[rg[k] : rg[k + 1]] for k in range(0, len(rg), 2)]).tolist()


def test_ubatch_splits_follow_llama_cpp() -> None:
    # one KV stream (--kv-unified, or one slot): consecutive n_ubatch-token pieces
    assert ubatch_sizes([(0, 1), (1, 1), (3, 600)], 512, True) == (512, 90)
    # a stream per slot: runs of consecutive slot ids, equal tokens from each
    assert ubatch_sizes([(0, 1), (2, 1)], 512, False) == (1, 1)
    assert ubatch_sizes([(0, 1), (1, 1), (2, 1), (3, 96)], 512, False) == (4, 95)
    assert ubatch_sizes([(0, 300), (1, 300)], 512, False) == (512, 88)
    assert ubatch_sizes([(5, 130)], 64, False) == (64, 64, 2)


def test_batch_size_cuts_a_prompt_into_steps() -> None:
    # -b 64: the 100-token prompt takes two steps (64 + 36 tokens), -b 512 one
    small, big = req(0, 100, 3), req(0, 100, 3)
    s64, s512 = run(slots(batch=64), [small]), run(slots(batch=512), [big])
    assert token_times(s64, small) == pytest.approx([0.120, 0.130, 0.140])  # 74 + 46 ms
    assert token_times(s512, big) == pytest.approx([0.110, 0.120, 0.130])
    assert (s64.stats.steps, s512.stats.steps) == (4, 3)


def test_ubatch_splits_a_step_into_passes() -> None:
    # -b 512 -ub 64: one step, but two forward passes (64 + 36 tokens): 10 ms more
    r = req(0, 100, 3)
    s = run(slots(batch=512, ubatch=64), [r])
    assert token_times(s, r) == pytest.approx([0.120, 0.130, 0.140])
    assert s.stats.steps == 3


def test_parallel_slots_batch_requests_and_split_streams_cost_passes() -> None:
    # three requests at once; r1 stops after 2 tokens, leaving slots 0 and 2 decoding
    def three() -> list[SimRequest]:
        return [req(0, 10, 5), req(1, 10, 2), req(2, 10, 5)]

    one = three()
    s1 = run(slots(n=1), one)  # queued one after another: 5 + 2 + 5 steps
    assert s1.stats.steps == 12
    split, shared = three(), three()
    s3 = run(slots(n=3), split)
    # step 0: the three prompts in one pass (30 tokens, 40 ms); step 1 all decode (10 ms);
    # then slots 0 and 2 are two runs of a stream each: two passes, 20 ms a step
    assert token_times(s3, split[0]) == pytest.approx([0.040, 0.050, 0.070, 0.090, 0.110])
    assert s3.stats.steps == 5
    s3u = run(slots(n=3, one_stream=True), shared)  # --kv-unified: one pass a step
    assert token_times(s3u, shared[0]) == pytest.approx([0.040, 0.050, 0.060, 0.070, 0.080])


def test_engine_knobs_reach_the_slots_scheduler() -> None:
    gemma, cpu = get_model("gemma-3-270m"), get_hardware("cpu-host")
    auto = setup(gemma, cpu, EngineConfig(engine="llamacpp")).sched
    # -np auto: 4 slots sharing the KV (llama-server turns --kv-unified on), -b 2048 -ub 512
    assert (auto.max_num_seqs, auto.kv_unified, auto.max_num_batched_tokens) == (4, True, 2048)
    assert auto.n_ubatch == 512
    cfg = EngineConfig(engine="llamacpp", parallel_slots=8, batch_size=64, kv_cache_tokens=2048)
    sc = setup(gemma, cpu, cfg).sched
    # -c 2048 split over 8 slots; -ub capped at -b
    assert (sc.max_num_seqs, sc.kv_unified, sc.slot_ctx) == (8, False, 256)
    assert (sc.max_num_batched_tokens, sc.n_ubatch) == (64, 64)


def test_the_main_jobs_slot_and_batch_configs_all_simulate_differently() -> None:
    # the main job's workload at its top load, 8 users, on a profile of 10 ms a pass, 1 ms
    # a prompt token and 2 ms a decoded sequence: every (parallel_slots, batch_size) pair
    # of its space gives its own throughput (at 4 users, 4 and 8 slots rightly tie: the
    # four busy slots stay one run of ids)
    spec = parse_workload(
        {
            "name": "main",
            "api": "completions",
            "count": 32,
            "input_tokens": {"dist": "uniform", "low": 32, "high": 96},
            "output_tokens": {"dist": "fixed", "value": 16},
            "arrival": {"kind": "closed", "concurrency": 8},
        }
    )
    prof = Profile(
        engine="llamacpp",
        model="gemma-3-270m",
        hardware="cpu-host",
        coefficients={"const": C0, "prefill_tokens": PER_TOKEN, "decode_seqs": 0.002},
    )
    gemma, cpu = get_model("gemma-3-270m"), get_hardware("cpu-host")
    req_s = {}
    for n in (1, 2, 4, 8):
        for b in (64, 512):
            cfg = EngineConfig(engine="llamacpp", parallel_slots=n, batch_size=b)
            res, _ = simulate(gemma, cpu, cfg, spec, profile=prof)
            req_s[n, b] = round(res.metrics.req_s, 6)
    assert len(set(req_s.values())) == len(req_s), req_s
