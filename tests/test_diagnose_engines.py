"""Every symptom `servetune diagnose` names, reproduced on purpose on real engines here
(vLLM-CPU, llama.cpp), each asserted to be diagnosed first with its top action. The shared
engines come from conftest.py, the KV-starved vLLM too (vllm_small_kv_server: a pool of
1,280 tokens, shared with tests/test_sessions_engines.py).
The leaking server (cancelled requests never freed) is the fault-injecting mock:
tests/test_diagnose.py.

On a busy shared host the host finding (engine starved of CPU) may rightly come before
the engine finding: the engine-symptom tests then check the first *engine* finding (host
and client findings are ranked first by design).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servetune.diagnose import Diagnosis, diagnose_result, render
from servetune.diagnose.rules import STEAL
from servetune.engines.testmodel import VLLM_TEST_CONFIG
from servetune.measure import EngineSession, Point
from servetune.results.files import write_result
from servetune.slo import parse_slo
from servetune.workload.spec import parse_workload

pytestmark = [pytest.mark.engine]


# Set to a folder to keep each run as a RunResult file (docs/diagnose.md's examples are
# `servetune diagnose` on those files).
EXAMPLES = os.environ.get("SERVETUNE_DIAGNOSE_EXAMPLES")


def measure(srv, data: dict, label: str = "p", slo: dict | None = None) -> Diagnosis:
    spec = parse_workload({"api": "completions", **data})
    res = EngineSession(srv, parse_slo(slo) if slo else None, 120.0).measure(Point(label, spec))
    if EXAMPLES:
        write_result(res, Path(EXAMPLES) / f"{label}.json")
    assert res.metrics.completed > 0, res.metrics.errors_by_class
    # sampled with the run, the engine's own process tree included
    assert res.telemetry is not None and res.telemetry.series("engine_cpu_cores")
    d = diagnose_result(res)
    print("\n" + "\n".join(render(d)))  # what `servetune diagnose` prints (docs/diagnose.md)
    print({k: round(v, 3) for k, v in d.evidence.tel.items() if k.endswith("_mean")})
    return d


def first_engine(d: Diagnosis):
    """The first engine finding (only host and client findings can precede it)."""
    for f in d.findings:
        if f.kind == "engine":
            return f
    ev = d.evidence
    seen = {k: getattr(ev, k, None) for k in ("queue_ms", "waiting_max", "running_max",
                                              "running_busy_mean", "batch_cap", "concurrency",
                                              "tpot")}  # fmt: skip
    raise AssertionError(f"no engine finding: {[f.key for f in d.findings]}; {seen}, "
                         f"TTFT {ev.ttft}")  # fmt: skip


def closed(users: int, count: int, inp: int, out: int) -> dict:
    return {
        "arrival": {"kind": "closed", "concurrency": users},
        "count": count,
        "input_tokens": {"dist": "fixed", "value": inp},
        "output_tokens": {"dist": "fixed", "value": out},
    }


@pytest.mark.timeout(600)
def test_vllm_max_num_seqs_too_small_queues(vllm_server) -> None:
    """12 users on max_num_seqs 4 queue: TTFT is mostly waiting, TPOT normal (two rounds
    of the 12 users: 8 of them wait at every moment)."""
    assert VLLM_TEST_CONFIG.max_num_seqs == 4
    d = measure(vllm_server, closed(12, 24, 32, 16), "queue")
    f = first_engine(d)
    assert f.key == "batch_queueing", [x.key for x in d.findings]
    assert (f.actions[0].knob, f.actions[0].now, f.actions[0].next) == ("max_num_seqs", 4, 8)


@pytest.mark.timeout(300)  # 53 s on a 2-core AVX2-only host (241 s when it served bf16 there)
def test_vllm_long_short_mix_bad_p99(vllm_server) -> None:
    """Long and short requests at the batch cap (no queue): P99 far above a fine mean."""
    mix = {
        "arrival": {"kind": "closed", "concurrency": VLLM_TEST_CONFIG.max_num_seqs},
        "count": 48,
        "seed": 3,
        "mix": [
            {"name": "short", "weight": 0.85, "input_tokens": {"dist": "fixed", "value": 16},
             "output_tokens": {"dist": "fixed", "value": 8}},
            {"name": "long", "weight": 0.15, "input_tokens": {"dist": "fixed", "value": 1200},
             "output_tokens": {"dist": "fixed", "value": 96}},
        ],
    }  # fmt: skip
    d = measure(vllm_server, mix, "mix")
    f = first_engine(d)
    assert f.key == "tail_long_short_mix", [x.key for x in d.findings]
    assert f.actions[0].knob == "pools"


@pytest.mark.timeout(300)
def test_vllm_starved_by_a_cpu_hog(vllm_server) -> None:
    """3 busy processes per core next to the engine: the host, not the engine, is named."""
    # Each hog in a session of its own: with the kernel's autogroup scheduling a session
    # shares CPU as one group, so hogs in the test's session would only slow the test.
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(3 * len(os.sched_getaffinity(0)))
    ]
    try:
        time.sleep(2.0)  # the hogs running before the first telemetry sample
        # 16 requests: ~10 telemetry samples (1 s apart) with a hog on every core
        d = measure(vllm_server, closed(2, 16, 32, 16), "hog")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    tel = {k: round(v, 3) for k, v in d.evidence.tel.items() if k.endswith("_mean")}
    assert d.findings and d.findings[0].key == "host_overloaded", ([x.key for x in d.findings],
                                                                   tel)  # fmt: skip
    knobs = [a.knob for a in d.findings[0].actions]
    # the hogs come first; on a VM whose hypervisor stole >= 5% of the time in the run (CI
    # saw 8.7%) the move to a dedicated host leads, and the hogs come next
    steal = d.evidence.tel.get("host_cpu_steal_mean") or 0.0
    expected = ["host"] if steal >= STEAL else []
    assert knobs[: len(expected) + 1] == [*expected, "other processes on the host"], (knobs, tel)


@pytest.mark.timeout(600)
def test_vllm_kv_pool_too_small_preempts(vllm_small_kv_server) -> None:
    # 8 KiB of KV per token (8 layers x 4 KV heads x 64 x 2 x bf16; 16 KiB where the test
    # model is served in float32, on AVX2-only hosts); the shared small pool holds 1,280
    # tokens (conftest.VLLM_SMALL_KV_CONFIG), while 8 users x (200 + 150) tokens want 2,800.
    srv = vllm_small_kv_server
    assert (srv.cfg.kv_cache_tokens or 0) < 8 * (200 + 150) and (srv.cfg.max_num_seqs or 0) >= 8
    d = measure(srv, closed(8, 16, 200, 150), "kv")
    f = first_engine(d)
    assert f.key == "kv_pressure", [x.key for x in d.findings]
    # the pool is fixed in blocks (kv_cache_tokens): its number first, then FP8 KV
    assert (f.actions[0].knob, f.actions[0].now) == ("kv_cache_tokens", srv.cfg.kv_cache_tokens)
    fp8 = next(a for a in f.actions if a.knob == "kv_cache_dtype")
    assert fp8.next == "fp8"
    # the engine's own log names the pool's dtype and the model's (its config line)
    reported = d.evidence.settings
    assert (reported["kv_cache_dtype"], reported["dtype"]) == ("auto", VLLM_TEST_CONFIG.dtype)
    # fp8 KV holds 2x the tokens of bf16, 4x those of float32
    factor = {"bfloat16": 2.0, "float32": 4.0}[VLLM_TEST_CONFIG.dtype]
    assert f"x{factor:.1f} blocks" in fp8.why, fp8.why


@pytest.mark.timeout(900)
def test_llamacpp_prefill_heavy_vs_decode_heavy_and_slots(llamacpp_server) -> None:
    # 2 slots of 1024 context each (max_model_len 2048 / 2).
    d = measure(llamacpp_server, closed(2, 4, 500, 4), "prefill")
    assert first_engine(d).key == "prefill_heavy", [x.key for x in d.findings]
    # "TPOT high" against the run's own target: against seed 003 §1's example (P95 40 ms)
    # this engine's 43-45 ms passes by a hair, and a host 10% faster would read under it.
    # (A CI run, 2026-12-07, found no finding here for a reason it did not print; the
    # failure now shows the decode batch and the TPOT the rule reads.)
    d = measure(llamacpp_server, closed(2, 4, 8, 64), "decode", {"tpot_ms": {"p95": 10}})
    f = first_engine(d)
    assert f.key == "decode_heavy", [x.key for x in d.findings]
    assert f.actions[0].knob == "parallel_slots"
    d = measure(llamacpp_server, closed(6, 8, 32, 16), "slots")
    f = first_engine(d)
    assert f.key == "batch_queueing", [x.key for x in d.findings]
    assert (f.actions[0].knob, f.actions[0].now) == ("parallel_slots", 2)
