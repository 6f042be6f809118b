"""Canonical metric mapping on Prometheus text in each engine's format (no engine needed).

The vLLM and llama.cpp samples are trimmed from real scrapes (vLLM 0.32.0 CPU,
llama.cpp b11434); SGLang and TGI use the names from their metric sources.
"""

from __future__ import annotations

import math

import pytest

from servetune.engines.metrics import Histogram, canonical, engine_of, parse

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 96.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 96.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.2
"""

LLAMACPP_TEXT = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 17
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 4
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.21
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 24
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0.9
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 26
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.25
"""

SGLANG_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m",tp_rank="0"} 0.4
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 100000.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 77.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 300.0
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 2.0
"""

TGI_TEXT = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 65536
# TYPE tgi_request_success counter
tgi_request_success 12
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="0.01"} 10
tgi_request_queue_duration_bucket{le="0.1"} 12
tgi_request_queue_duration_bucket{le="+Inf"} 12
tgi_request_queue_duration_sum 0.2
tgi_request_queue_duration_count 12
"""


def test_vllm_names() -> None:
    m = canonical("vllm", VLLM_TEXT)
    assert m.values == {
        "requests_running": 2.0,
        "requests_waiting": 1.0,
        "kv_cache_usage": 0.25,
        "prefix_cache_queries_total": 96.0,
        "prefix_cache_hits_total": 32.0,
        "preemptions_total": 0.0,
        "prompt_tokens_total": 96.0,
        "generation_tokens_total": 40.0,
        "requests_finished_total": 4.0,  # summed over finished_reason labels
    }
    ttft = m.histograms["ttft_seconds"]
    assert ttft.count == 4 and ttft.sum == pytest.approx(1.2)
    assert ttft.buckets[-1] == (math.inf, 4.0)
    assert m.raw["vllm:generation_tokens_total"] == 40.0


def test_llamacpp_names() -> None:
    m = canonical("llamacpp", LLAMACPP_TEXT)
    assert m.values["requests_running"] == 1
    assert m.values["requests_waiting"] == 0
    assert m.values["prompt_tokens_total"] == 17
    assert m.values["generation_tokens_total"] == 24
    assert m.values["prefix_cache_hits_total"] == 4
    assert m.values["busy_slots_per_decode"] == 1.25
    assert "kv_cache_usage" not in m.values  # llama.cpp b11434 does not export it
    assert m.histograms == {}


def test_sglang_names() -> None:
    m = canonical("sglang", SGLANG_TEXT)
    assert m.values["requests_running"] == 3 and m.values["requests_waiting"] == 5
    assert m.values["kv_cache_usage"] == 0.5
    assert m.values["kv_cache_capacity_tokens"] == 100000
    assert m.values["prefix_cache_hit_rate"] == 0.4
    assert m.values["generation_tokens_total"] == 77
    assert m.values["preemptions_total"] == 2


def test_tgi_names_counter_without_total_suffix() -> None:
    m = canonical("tgi", TGI_TEXT)
    assert m.values["requests_waiting"] == 4 and m.values["requests_running"] == 8
    assert m.values["kv_cache_capacity_tokens"] == 65536
    assert m.values["requests_finished_total"] == 12
    assert m.histograms["queue_time_seconds"].count == 12


def test_ratio_gauges_average_over_label_sets() -> None:
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.6\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_running{engine="1"} 3\n'
    )
    m = canonical("vllm", text)
    assert m.values["kv_cache_usage"] == pytest.approx(0.4)
    assert m.values["requests_running"] == 5


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    h = Histogram(((0.1, 1.0), (0.5, 3.0), (1.0, 4.0), (math.inf, 4.0)), 4.0, 1.2)
    assert h.mean() == pytest.approx(0.3)
    assert h.quantile(0.5) == pytest.approx(0.3)  # rank 2: halfway through (0.1, 0.5]
    assert h.quantile(1.0) == pytest.approx(1.0)
    assert Histogram((), 0.0, 0.0).quantile(0.5) is None


def test_parse_keeps_labels() -> None:
    samples = parse(VLLM_TEXT)
    rows = samples["vllm:request_success_total"]
    assert {r[0]["finished_reason"] for r in rows} == {"stop", "length"}


def test_vllm_block_size_and_pool_come_from_its_cache_config_info_labels() -> None:
    """vLLM exports its KV block size and pool only as labels of an info gauge (value 1):
    summing values, as for every other gauge, would read 1 for both."""
    info = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",'
        'num_cpu_blocks="None",num_gpu_blocks="256"} 1.0\n'
    )
    m = canonical("vllm", VLLM_TEXT + info)
    assert m.values["kv_block_tokens"] == 128.0
    assert m.values["kv_cache_blocks"] == 256.0
    assert m.values["kv_cache_capacity_tokens"] == 128.0 * 256.0
    unset = info.replace('num_gpu_blocks="256"', 'num_gpu_blocks="None"')
    m = canonical("vllm", VLLM_TEXT + unset)  # before the pool is sized: no pool figure
    assert m.values["kv_block_tokens"] == 128.0 and "kv_cache_capacity_tokens" not in m.values


def test_nan_and_inf_samples_are_no_figure_and_never_reach_diagnose_json() -> None:
    """A NaN gauge is valid exposition; kept, it averaged a ratio to NaN and reached
    `diagnose --url --json` as `NaN` (not JSON). It is left out, as if not exported."""
    import json

    from servetune.diagnose import diagnose
    from servetune.diagnose.evidence import from_window
    from servetune.diagnose.run import Diagnosis
    from servetune.results.schema import ServerSeries

    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.6\n'
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running +Inf\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting 3\n"
    )
    m = canonical("vllm", text)
    assert m.values["kv_cache_usage"] == pytest.approx(0.6)  # the one finite rank
    assert "requests_running" not in m.values and m.values["requests_waiting"] == 3
    # the live window diagnose builds from such samples is all finite figures
    series = ServerSeries(t_ns=[0, 10**9, 2 * 10**9], values=[dict(m.values)] * 3)
    ev = from_window("http://x", series, None, "vllm")
    json.dumps(Diagnosis(ev, diagnose(ev)).to_json(), allow_nan=False, default=str)


def test_a_metrics_page_names_its_engine() -> None:
    """`bench --url` / `diagnose --url` without --engine read the engine from its names."""
    texts = {"vllm": VLLM_TEXT, "llamacpp": LLAMACPP_TEXT, "sglang": SGLANG_TEXT,
             "tgi": TGI_TEXT}  # fmt: skip
    for engine, text in texts.items():
        assert engine_of(text) == engine
    assert (
        engine_of("# TYPE mock:num_requests_running gauge\nmock:num_requests_running 1\n") is None
    )
    assert engine_of("<html><body>404</body></html>") is None
    assert engine_of("") is None
