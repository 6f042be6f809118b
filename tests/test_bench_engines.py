"""`bench` against the real engines (session fixtures in conftest.py start them once)."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from servetune.bench.progress import ttft_split_table
from servetune.bench.runner import BenchOptions, run_point
from servetune.bench.server_metrics import engine_adapter, http_fetcher, ttft_breakdown
from servetune.engines.metrics import EngineMetrics, Histogram
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import ServerTokenizer

# Bound per test, engine start included: ~10x the slowest here on a busy 2-core host
# (vLLM's start, 51 s).
pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


def bench(srv, engine: str, data: dict, **opts):
    spec = parse_workload({"api": "completions", **data})
    tok = ServerTokenizer(srv.url, srv.served_model)
    o = BenchOptions(
        url=srv.url,
        model=srv.served_model,
        workers=1,
        tokenizer=tok,
        metrics_fetch=http_fetcher(srv.url, engine_adapter(engine)),
        **{"scrape_interval_s": 0.2, **opts},
    )
    return run_point(spec, materialize(spec, tok), o)


def rendered(table) -> str:
    """What bench prints for the TTFT split table (None: it prints none)."""
    assert table is not None, "bench would print no TTFT split"
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return out.getvalue()


def running_max(res) -> float:
    return max(v.get("requests_running", 0.0) for v in res.server.values)


def ttft_s(r) -> float:
    return (r.chunk_ns[0] - r.send_ns) / 1e9


def busy_slots_per_decode(res) -> float:
    """llama.cpp's mean busy slots per llama_decode() over the run alone, from its
    cumulative average and decode count at the first and last scrape."""
    first, last = res.server.values[0], res.server.values[-1]

    def busy(v: dict[str, float]) -> float:
        return v["busy_slots_per_decode"] * v["decode_calls_total"]

    decodes = last["decode_calls_total"] - first["decode_calls_total"]
    return (busy(last) - busy(first)) / decodes


def test_llamacpp_counts_ttft_concurrency_and_cancel(llamacpp_server) -> None:
    words = {"input_tokens": {"dist": "uniform", "low": 20, "high": 120},
             "output_tokens": {"dist": "fixed", "value": 12}}  # fmt: skip
    # 2 users on 2 slots: counts and TTFT; the server did run 2 at once (the check below
    # can tell 1 from 2)
    res = bench(llamacpp_server, "llamacpp", {"arrival": {"kind": "closed", "concurrency": 2},
                                             "count": 6, **words})  # fmt: skip
    assert res.metrics.completed == 6, res.metrics.errors_by_class
    for r in res.records:
        assert r.usage_completion_tokens == 12 == sum(r.chunk_tokens)
        assert r.usage_prompt_tokens is not None and r.prompt_tokens is not None
        assert 0 <= r.usage_prompt_tokens - r.prompt_tokens <= 1  # + BOS
        assert r.server_timings is not None and r.server_timings["prompt_ms"] > 0
        assert ttft_s(r) * 1e3 >= r.server_timings["prompt_ms"]  # TTFT covers the prefill
    assert res.metrics.max_in_flight <= 2 and running_max(res) <= 2
    assert busy_slots_per_decode(res) > 1.05
    split = ttft_breakdown(res.records, res.server.deltas)
    assert split["prefill_ms"] is not None and 0 < split["prefill_ms"] <= split["ttft_ms"]
    assert f"{split['prefill_ms']:.1f}" in rendered(ttft_split_table([res]))
    # 1 user on the same 2-slot server: it never ran 2 at once. Every decode call has at
    # least one busy slot, so a mean of 1 (to the gauge's 6 printed digits) proves it.
    res = bench(llamacpp_server, "llamacpp", {"arrival": {"kind": "closed", "concurrency": 1},
                                             "count": 3, **words})  # fmt: skip
    assert res.metrics.completed == 3 and res.metrics.max_in_flight == 1
    assert running_max(res) <= 1
    assert busy_slots_per_decode(res) == pytest.approx(1.0, abs=0.01)
    # cancelled streams: the slots come free (running gauge back to 0). bench reads the gauge
    # one scrape interval after the run: 2 s, as a busy host's llama-server can take longer
    # than 0.2 s to notice a closed stream (seen: still 1 running after 0.2 s)
    cancel = bench(
        llamacpp_server,
        "llamacpp",
        {"arrival": {"kind": "closed", "concurrency": 2}, "count": 2,
         "input_tokens": {"dist": "fixed", "value": 16},
         "output_tokens": {"dist": "fixed", "value": 400}},
        cancel_fraction=1.0,
        cancel_after_chunks=2,
        scrape_interval_s=2.0,
    )  # fmt: skip
    assert cancel.metrics.cancelled == 2
    assert cancel.cancellation is not None and cancel.cancellation["freed"] is True


def hist_delta(before: EngineMetrics, after: EngineMetrics, name: str) -> Histogram:
    """What the run added to one of the engine's histograms."""
    b, a = before.histograms.get(name), after.histograms[name]
    old = dict(b.buckets) if b else {}
    return Histogram(
        tuple((le, n - old.get(le, 0.0)) for le, n in a.buckets),
        a.count - (b.count if b else 0.0),
        a.sum - (b.sum if b else 0.0),
    )


def test_vllm_prefix_hits_running_limit_and_ttft_vs_prefill(vllm_server) -> None:
    before = vllm_server.metrics()
    res = bench(
        vllm_server,
        "vllm",
        {"arrival": {"kind": "closed", "concurrency": 3}, "count": 9,
         "input_tokens": {"dist": "fixed", "value": 160},
         "output_tokens": {"dist": "fixed", "value": 8},
         "prefix": {"groups": 1, "tokens": 128}},
    )  # fmt: skip
    assert res.metrics.completed == 9, res.metrics.errors_by_class
    assert all(r.usage_completion_tokens == 8 for r in res.records)
    assert running_max(res) <= 3  # max_num_seqs is 4: the server could have run more
    assert res.server is not None and res.server.deltas.get("prefix_cache_hits_total", 0) > 0

    deadline = time.monotonic() + 5  # finished requests reach the histograms just after
    while (after := vllm_server.metrics()).histograms[
        "prefill_time_seconds"
    ].count - before.histograms.get("prefill_time_seconds", Histogram((), 0, 0)).count < 9:
        assert time.monotonic() < deadline, "vLLM did not record the 9 prefills"
        time.sleep(0.1)
    prefill = hist_delta(before, after, "prefill_time_seconds")
    queue = hist_delta(before, after, "queue_time_seconds")
    server_ttft = hist_delta(before, after, "ttft_seconds")
    assert prefill.count == queue.count == 9
    client = sorted(ttft_s(r) for r in res.records)
    # Per request, client TTFT >= queue + prefill (and >= vLLM's own TTFT); the
    # histograms give the sums, and at every bucket bound no more client TTFTs than
    # server prefills can lie below it.
    assert sum(client) >= queue.sum + prefill.sum
    assert sum(client) >= server_ttft.sum
    for le, n_server in prefill.buckets:
        assert sum(t <= le for t in client) <= n_server, f"bucket le={le}"
    split = ttft_breakdown(res.records, res.server.deltas)
    assert split["queue_ms"] is not None and split["prefill_ms"] is not None
    assert split["rest_ms"] is not None and split["rest_ms"] >= 0
    table = rendered(ttft_split_table([res]))
    assert f"{split['queue_ms']:.1f}" in table and f"{split['prefill_ms']:.1f}" in table
