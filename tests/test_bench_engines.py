"""`bench` against the real engines (session fixtures in conftest.py start them once)."""

from __future__ import annotations

import pytest

from servetune.bench.runner import BenchOptions, run_point
from servetune.bench.server_metrics import engine_adapter, http_fetcher
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import ServerTokenizer

pytestmark = pytest.mark.engine


def bench(srv, engine: str, data: dict, **opts):
    spec = parse_workload({"api": "completions", **data})
    tok = ServerTokenizer(srv.url, srv.served_model)
    o = BenchOptions(
        url=srv.url,
        model=srv.served_model,
        workers=1,
        tokenizer=tok,
        metrics_fetch=http_fetcher(srv.url, engine_adapter(engine)),
        scrape_interval_s=0.2,
        **opts,
    )
    return run_point(spec, materialize(spec, tok), o)


def running_max(res) -> float:
    return max(v.get("requests_running", 0.0) for v in res.server.values)


def test_llamacpp_counts_ttft_concurrency_and_cancel(llamacpp_server) -> None:
    closed = {"arrival": {"kind": "closed", "concurrency": 2}}
    res = bench(
        llamacpp_server,
        "llamacpp",
        {**closed, "count": 6, "input_tokens": {"dist": "uniform", "low": 20, "high": 120},
         "output_tokens": {"dist": "fixed", "value": 12}},
    )  # fmt: skip
    assert res.metrics.completed == 6, res.metrics.errors_by_class
    for r in res.records:
        assert r.usage_completion_tokens == 12 == sum(r.chunk_tokens)
        assert r.usage_prompt_tokens is not None and r.prompt_tokens is not None
        assert 0 <= r.usage_prompt_tokens - r.prompt_tokens <= 1  # + BOS
        if r.server_timings and "prompt_ms" in r.server_timings:
            assert (r.chunk_ns[0] - r.send_ns) / 1e6 >= r.server_timings["prompt_ms"]
    assert res.metrics.max_in_flight <= 2 and running_max(res) <= 2
    cancel = bench(
        llamacpp_server,
        "llamacpp",
        {**closed, "count": 2, "input_tokens": {"dist": "fixed", "value": 16},
         "output_tokens": {"dist": "fixed", "value": 400}},
        cancel_fraction=1.0,
        cancel_after_chunks=2,
    )  # fmt: skip
    assert cancel.metrics.cancelled == 2
    assert cancel.cancellation is not None and cancel.cancellation["freed"] is True


def test_vllm_prefix_hits_and_running_limit(vllm_server) -> None:
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
    assert running_max(res) <= 3
    assert res.server is not None and res.server.deltas.get("prefix_cache_hits_total", 0) > 0
    for r in res.records:
        assert (r.chunk_ns[0] - r.send_ns) > 0
