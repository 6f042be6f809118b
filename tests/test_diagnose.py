"""Diagnosis rules on synthetic evidence, for the symptoms that cannot be produced on this
CPU-only host (GPU clocks, XID/ECC errors, low GPU utilisation, OOM) and for the ordering;
the CLI on a RunResult file and on a live server; cancelled requests never freed, on the
mock made to leak. The real reproductions are in
tests/test_diagnose_engines.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from tests.cli_run import run_cli

from servetune.bench.runner import BenchOptions
from servetune.bench.server_metrics import http_fetcher
from servetune.diagnose import Evidence, diagnose, diagnose_result, render
from servetune.diagnose.predict import fits_in_kv, kv_blocks_factor
from servetune.measure import Point, ServerSession
from servetune.results.files import write_result
from servetune.results.schema import Dist, Metrics, RunResult, ServerSeries
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer


def keys(ev: Evidence) -> list[str]:
    return [f.key for f in diagnose(ev)]


def test_kv_dtype_factor_comes_from_the_planner_bytes() -> None:
    assert kv_blocks_factor("auto", "fp8") == 2.0
    assert kv_blocks_factor("auto", "fp8", "fp32") == 4.0
    assert kv_blocks_factor("fp8", "fp8") == 1.0


def test_fits_in_kv_uses_p99_lengths_against_the_reported_pool() -> None:
    ev = Evidence("x", settings={"kv_cache_tokens": 10_000})
    ev.input_tokens, ev.output_tokens = {"p99": 900.0}, {"p99": 100.0}
    assert fits_in_kv(ev) == 10


def test_gpu_downclocking_from_recorded_clocks() -> None:
    """Synthetic: no GPU here. NVML's SM clock fell to 1100 of 1980 MHz at 87 C."""
    ev = Evidence("x")
    ev.tel = {"gpu_sm_clock_mhz_busy_min": 1100.0, "gpu_sm_clock_max_mhz_max": 1980.0,
              "gpu_temp_c_max": 87.0, "gpu_util_mean": 0.9}  # fmt: skip
    found = diagnose(ev)
    assert found[0].key == "gpu_downclocked"
    assert "1100 of 1980 MHz" in found[0].trigger
    ev.tel["gpu_sm_clock_mhz_busy_min"] = 1900.0
    assert "gpu_downclocked" not in keys(ev)


def test_xid_errors_come_before_any_tuning() -> None:
    """Synthetic: XID events counted by NVML during the run, with a KV-full engine."""
    ev = Evidence("x", preemptions=12.0, kv_usage_max=0.99)
    ev.tel = {"gpu_xid_added": 2.0}
    assert keys(ev)[:2] == ["gpu_errors", "kv_pressure"]


def test_oom_prints_seed_003s_order() -> None:
    ev = Evidence("x", failure={"kind": "oom", "reason": "CUDA out of memory"})
    ev.config = {"gpu_memory_utilization": 0.95, "max_num_seqs": 128}
    f = diagnose(ev)[0]
    assert f.key == "oom"
    knobs = [a.knob for a in f.actions]
    assert knobs[:4] == [
        "gpu_memory_utilization",
        "max_num_batched_tokens",
        "max_num_seqs",
        "max_model_len",
    ]
    assert f.actions[0].next == 0.9 and f.actions[2].next == 64


def test_the_kv_cache_dtype_the_engine_reported_wins_over_the_config() -> None:
    """vLLM gives a ModelOpt FP8 checkpoint an FP8 pool under kv_cache_dtype=auto and logs
    it: "fp8 KV cache, x2 blocks" would gain nothing there, so the pool comes next."""
    ev = Evidence("x", preemptions=12.0, kv_usage_max=0.99, config={"max_num_seqs": 64})
    first = next(f for f in diagnose(ev) if f.key == "kv_pressure").actions[0]
    assert (first.knob, first.now, first.next) == ("kv_cache_dtype", "auto", "fp8")
    assert "x2.0 blocks" in first.why
    ev.settings = {"kv_cache_dtype": "auto", "dtype": "float32"}  # vLLM-CPU's fp32 test model
    first = next(f for f in diagnose(ev) if f.key == "kv_pressure").actions[0]
    assert "x4.0 blocks" in first.why
    ev.settings = {"kv_cache_dtype": "fp8", "quantization": "modelopt"}
    f = next(f for f in diagnose(ev) if f.key == "kv_pressure")
    assert "kv_cache_dtype" not in [a.knob for a in f.actions]
    assert f.actions[0].knob == "gpu_memory_utilization"


def test_the_oom_order_skips_an_fp8_kv_cache_the_engine_already_runs() -> None:
    ev = Evidence("x", failure={"kind": "oom", "reason": "CUDA out of memory"})

    def fifth() -> tuple[str, object, object]:
        a = next(f for f in diagnose(ev) if f.key == "oom").actions[4]
        return a.knob, a.now, a.next

    assert fifth() == ("kv_cache_dtype", "auto", "fp8")
    ev.settings = {"kv_cache_dtype": "fp8"}  # 16-bit weights: quantise them next
    assert fifth() == ("quantization", "none", "fp8")
    ev.settings["quantization"] = "modelopt"  # both already 8-bit: the step has nothing left
    assert fifth()[0] == "enforce_eager"


def test_a_simulated_modelopt_checkpoint_is_not_told_to_take_an_fp8_kv_cache() -> None:
    """The simulator resolves `auto` as vLLM does and records it with the run: a ModelOpt
    FP8 Llama-3.1-8B on an H100 at 30% memory preempts, and the pool grows instead."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.measure import SimSession
    from servetune.model.catalog import catalog_entry
    from servetune.model.hf_config import spec_from_hf_dict

    cfg = {k: v for k, v in catalog_entry("llama-3.1-8b").items() if not k.startswith("_")}
    quant = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    model = spec_from_hf_dict({**cfg, "quantization_config": quant}, "nvidia-fp8")
    spec = parse_workload(
        {"count": 300, "arrival": {"kind": "closed", "concurrency": 128},
         "input_tokens": {"dist": "fixed", "value": 2000},
         "output_tokens": {"dist": "fixed", "value": 500}}
    )  # fmt: skip
    hw = get_hardware("h100-sxm")
    session = SimSession(model, hw, EngineConfig(max_num_seqs=128, gpu_memory_utilization=0.3))
    res = session.measure(Point("kv", spec))
    assert res.target.settings == {"kv_cache_dtype": "fp8"}
    assert res.target.sim.preemptions > 0
    f = next(f for f in diagnose_result(res).findings if f.key == "kv_pressure")
    assert "kv_cache_dtype" not in [a.knob for a in f.actions]
    assert f.actions[0].knob == "gpu_memory_utilization"


def test_a_pool_fixed_in_tokens_is_recorded_as_simulated_and_grown_by_its_number() -> None:
    """`kv_cache_tokens` (vLLM's --num-gpu-blocks-override) fixes the pool: the run records
    the pool it simulated (62 blocks x 16 = 992 tokens, not the planner's 447,120), and the
    advice raises that number first: FP8 KV or more memory alone would not grow a pool fixed
    in blocks (FP8 is offered second, for the same memory once the number is raised)."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.measure import SimSession
    from servetune.model import get_model

    spec = parse_workload(
        {"count": 40, "arrival": {"kind": "closed", "concurrency": 8},
         "input_tokens": {"dist": "fixed", "value": 200},
         "output_tokens": {"dist": "fixed", "value": 100}}
    )  # fmt: skip
    cfg = EngineConfig(kv_cache_tokens=1000)
    res = SimSession(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), cfg).measure(
        Point("kv", spec)
    )
    assert res.target.kv_blocks == 62 and res.target.kv_capacity_tokens == 62 * 16
    assert res.target.sim.preemptions > 0
    f = next(f for f in diagnose_result(res).findings if f.key == "kv_pressure")
    assert [(a.knob, a.now, a.next) for a in f.actions][0] == ("kv_cache_tokens", 1000, 2000)
    assert "gpu_memory_utilization" not in {a.knob for a in f.actions}
    fp8 = next(a for a in f.actions if a.knob == "kv_cache_dtype")
    assert "once kv_cache_tokens is raised" in fp8.why and fp8.predicted is None


def test_low_gpu_utilisation_first_asks_for_load_when_the_batch_is_not_full() -> None:
    """Synthetic: 30% GPU utilisation with 3 of 64 sequences running."""
    ev = Evidence("x", running_mean=3.0, config={"max_num_seqs": 64})
    ev.tel = {"gpu_util_mean": 0.3, "gpu_memory_used_max": 60 * 2**30}
    f = diagnose(ev)[0]
    assert f.key == "gpu_underused" and f.actions[0].knob == "offered load"
    ev.running_mean = 64.0
    assert diagnose(ev)[0].actions[0].knob == "max_num_seqs"


def test_host_then_client_come_before_engine_findings() -> None:
    ev = Evidence("x", preemptions=5.0, kv_usage_max=1.0, client_cpu_util=0.97)
    ev.tel = {"engine_runq_wait_share_mean": 0.7, "engine_runq_wait_cores_mean": 1.2,
              "host_cpu_busy_mean": 0.99, "host_cpu_cores_max": 2.0,
              "other_cpu_cores_mean": 1.5}  # fmt: skip
    assert keys(ev) == ["host_overloaded", "client_bottleneck", "kv_pressure"]
    # the engine's own threads outnumbering the cores is not a host problem
    ev.tel["other_cpu_cores_mean"] = 0.4
    assert "host_overloaded" not in keys(ev)
    # CI's hog run: the starved engine still held its pinned core (1.04), six hogs only 0.91
    # of the 2: others hold 46% of the busy CPU
    ev.tel.update({"engine_runq_wait_share_mean": 0.538, "engine_runq_wait_cores_mean": 1.208,
                   "host_cpu_busy_mean": 1.0, "other_cpu_cores_mean": 0.912})  # fmt: skip
    assert keys(ev)[0] == "host_overloaded"
    ev.tel["other_cpu_cores_mean"] = 1.5
    # an idle engine with a high wait share of almost no demand is not starved
    ev.tel["engine_runq_wait_cores_mean"] = 0.01
    assert "host_overloaded" not in keys(ev)


def test_client_bottleneck_needs_the_schedule_missed_not_just_a_busy_loop() -> None:
    """Open loop at 100 req/s offered: the client sent 60 with a 400 ms send lag."""
    ev = Evidence("x", offered_req_s=100.0, sent_req_s=60.0, send_lag_p99_ms=400.0)
    ev.achieved_req_s, ev.ttft = 58.0, {"p50": 80.0}
    f = diagnose(ev)[0]
    assert f.key == "client_bottleneck" and "sent 60.00 of 100.00 req/s" in f.trigger
    # on schedule, with a 12 ms lag against a 2 s TTFT: not the client
    ev.sent_req_s, ev.send_lag_p99_ms, ev.ttft = 99.5, 12.0, {"p50": 2000.0}
    assert "client_bottleneck" not in keys(ev)


def test_a_lag_from_the_users_own_cap_names_the_cap_not_the_workers() -> None:
    """--rate 20 --max-concurrency 2: the sends wait for the cap (client queue P99 5.2 s of
    a 5.2 s lag), the client's CPU is idle: more workers would change nothing."""
    ev = Evidence("x", offered_req_s=20.0, sent_req_s=5.0, send_lag_p99_ms=5228.0)
    ev.achieved_req_s, ev.ttft, ev.client_cpu_util = 5.0, {"p50": 60.0}, 0.03
    ev.client_queue_p99_ms, ev.client_cap = 5200.0, 2
    f = diagnose(ev)[0]
    assert f.key == "client_cap" and f.actions[0].knob == "bench --max-concurrency"
    assert "client queue P99 5200 ms" in f.trigger
    # a client out of CPU behind the same cap is still the sender's problem
    ev.client_cpu_util = 0.97
    assert diagnose(ev)[0].key == "client_bottleneck"


def test_failed_requests_name_their_largest_cause_first() -> None:
    """3 server errors and 2 idle timeouts of 60 sent (8.3%, over seed 003 §1's 0.1%): the
    run that diagnose called healthy. Out-of-memory failures stay oom's."""
    ev = Evidence("x", completed=55, errors={"http_5xx": 3, "idle_timeout": 2})
    f = next(f for f in diagnose(ev) if f.key == "failed_requests")
    assert (
        f.title == "5 of 60 requests failed; most failed on the server (5xx, an error "
        "event, a cut stream)"
    )
    assert f.trigger == "8.3% failed (3 http_5xx, 2 idle_timeout)"
    assert [a.knob for a in f.actions] == ["engine log", "offered load"]
    assert "failed_requests" not in keys(Evidence("x", completed=1999, errors={"http_5xx": 1}))
    oom_only = Evidence("x", completed=56, errors={"http_5xx": 4}, oom_errors=4)
    assert "failed_requests" not in keys(oom_only)


def test_long_short_mix_splits_between_the_classes() -> None:
    ev = Evidence("x")
    ev.e2e = {"mean": 1080.0, "p50": 186.0, "p99": 5070.0}
    ev.input_tokens = {"p50": 16.0, "p90": 1200.0, "p99": 1200.0}
    ev.output_tokens = {"p50": 8.0, "p99": 96.0}
    f = diagnose(ev)[0]
    assert f.key == "tail_long_short_mix" and "27.3x" in f.trigger
    assert f.actions[0].next == "two: inputs > 139 tokens apart"  # sqrt(16 * 1200)
    ev.input_tokens = {"p50": 500.0, "p90": 600.0, "p99": 700.0}  # one class: no mix
    ev.output_tokens = {"p50": 90.0, "p99": 100.0}
    assert keys(ev) == []


def test_queueing_below_the_batch_cap_is_not_a_batch_limit() -> None:
    """Requests wait while running stays under max_num_seqs: the KV pool held them (the
    KV-starved vLLM run), so raising max_num_seqs would change nothing."""
    ev = Evidence("x", config={"max_num_seqs": 8}, queue_ms=6000.0, waiting_max=6.0)
    ev.ttft = {"mean": 6500.0, "p50": 6660.0}
    ev.running_max = 4.0
    assert "batch_queueing" not in keys(ev)  # the pool's usage unknown: it may have held them
    ev.kv_usage_max = 0.99
    assert "batch_queueing" not in keys(ev)  # seen full: it did
    ev.kv_usage_max, ev.running_max = None, 8.0
    assert keys(ev) == ["batch_queueing"]


def test_a_sampled_running_gauge_one_under_the_cap_with_an_empty_pool_still_queues() -> None:
    """The running gauge is sampled: 12 users on max_num_seqs 4 read running 3 when no
    scrape landed while the batch was full (vLLM-CPU in CI). With the KV pool seen nearly
    empty nothing else can have held them: the batch cap did."""
    ev = Evidence("x", config={"max_num_seqs": 4}, concurrency=12, queue_ms=420.0)
    ev.ttft = {"mean": 537.0, "p50": 633.0}
    ev.waiting_max, ev.running_max, ev.kv_usage_max = 8.0, 3.0, 0.05
    assert keys(ev) == ["batch_queueing"]


def test_queueing_from_the_histogram_holds_when_the_gauges_saw_only_idle_scrapes() -> None:
    """On a loaded host /metrics may answer only before and after a short run: waiting and
    running then read 0, while the queue-time histogram's delta still says 80% of TTFT was
    waiting. The exact histogram decides; idle gauge samples veto nothing."""
    ev = Evidence("x", config={"max_num_seqs": 4}, concurrency=12, queue_ms=400.0)
    ev.ttft = {"mean": 500.0, "p50": 514.0}
    ev.waiting_max, ev.running_max = 0.0, 0.0
    assert keys(ev) == ["batch_queueing"]
    ev.queue_ms = None  # no histogram: the sampled gauges are all there is, and saw nothing
    assert "batch_queueing" not in keys(ev)


def test_the_decode_batch_leaves_out_the_idle_scrapes_at_the_ends() -> None:
    """A 3 s run scraped once a second: 0 before and after, 2 while it decoded."""
    from servetune.diagnose.evidence import engine_figures

    ev = Evidence("x")
    engine_figures(ev, ServerSeries(values=[{"requests_running": v} for v in (0, 2, 2, 2, 0)]))
    assert ev.running_mean == pytest.approx(1.2) and ev.running_busy_mean == 2.0


def test_the_pool_an_engine_exports_is_the_pool_a_bench_run_had() -> None:
    """A bench run against a server nobody launched here has no start-up log: the pool
    its /metrics reports (SGLang's max_total_num_tokens, vLLM's cache_config_info) is the
    one `fits_in_kv` measures against; the log's figure, where there is one, stays."""
    from servetune.diagnose.evidence import engine_figures

    series = ServerSeries(values=[{"kv_cache_capacity_tokens": 32768.0}] * 2)
    ev = Evidence("x")
    engine_figures(ev, series)
    assert ev.kv_pool_tokens == 32768
    logged = Evidence("x", settings={"kv_cache_tokens": 30000})
    engine_figures(logged, series)
    assert logged.kv_pool_tokens == 30000


def test_nothing_fires_on_a_healthy_run() -> None:
    ev = Evidence("x", running_mean=2.0, waiting_max=0.0, kv_usage_max=0.4, preemptions=0.0)
    ev.ttft = {"mean": 50.0, "p50": 48.0, "p99": 70.0}
    ev.e2e = {"mean": 500.0, "p50": 490.0, "p99": 650.0}
    ev.input_tokens = {"p50": 100.0, "p90": 150.0, "p99": 200.0}
    ev.output_tokens = {"p50": 100.0, "p90": 120.0, "p99": 140.0}
    assert keys(ev) == []


def queued_result() -> RunResult:
    """A recorded run in the shape of a real queueing one: 12 users on max_num_seqs 4."""
    m = Metrics(
        completed=36,
        ttft_ms=Dist(count=36, mean=900.0, p50=1000.0, p99=1300.0),
        tpot_ms=Dist(count=36, mean=40.0, p50=40.0, p99=45.0),
        e2e_ms=Dist(count=36, mean=1500.0, p50=1600.0, p99=2000.0),
    )
    series = ServerSeries(
        t_ns=[0, 1, 2],
        values=[{"requests_running": 4.0, "requests_waiting": 8.0}] * 3,
        deltas={"queue_time_seconds_sum": 21.6, "queue_time_seconds_count": 36.0},
    )
    return RunResult.model_validate(
        {
            "id": "rec-1",
            "created_utc": "2026-12-01T00:00:00",
            "metrics": m.model_dump(),
            "load": {"kind": "closed", "concurrency": 12},
            "server": series.model_dump(),
            "target": {"engine": "vllm", "config": {"max_num_seqs": 4}},
        }  # fmt: skip
    )


def test_cli_on_a_result_file_text_and_json(tmp_path, capsys) -> None:
    path = tmp_path / "run.json"
    write_result(queued_result(), path)
    code, out, _ = run_cli(capsys, "diagnose", str(path))
    assert code == 0
    assert "1. [engine] TTFT high, TPOT normal" in out
    assert "max_num_seqs: 4 -> 8" in out and "queueing is 67% of TTFT" in out
    data = json.loads(run_cli(capsys, "diagnose", str(path), "--json")[1])
    assert set(data) == {"source", "live", "findings", "evidence"}
    f = data["findings"][0]
    assert set(f) == {"key", "kind", "title", "seed", "trigger", "score", "actions"}
    assert set(f["actions"][0]) == {"knob", "now", "next", "why", "predicted"}
    assert f["actions"][0]["predicted"].startswith("TTFT P50 1.00 s -> about 333 ms")


def test_cli_refuses_bad_input_in_one_line(capsys) -> None:
    code, out, err = run_cli(capsys, "diagnose")
    assert code == 2 and "RUN" in out + err
    code, out, err = run_cli(capsys, "diagnose", "--url", "http://127.0.0.1:9", "--window", "0")
    assert code == 2 and "--window" in out + err
    code, out, err = run_cli(capsys, "diagnose", "--url", "http://127.0.0.1:9", "--window", "1")
    assert code == 2 and "cannot read http://127.0.0.1:9/metrics" in out + err
    code, out, err = run_cli(capsys, "bench", "--url", "http://127.0.0.1:9", "--no-store",
                             "--telemetry-url", "gpu-node:9400")  # fmt: skip
    assert code == 2 and "--telemetry-url" in out + err and "Traceback" not in out + err


@pytest.mark.timeout(60)
def test_cli_watches_a_live_server_without_load(capsys) -> None:
    from servetune.engines.process import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "servetune.cli.app", "mock-server", "--port", str(port)]
    mock = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert mock.stdout is not None and "listening" in mock.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        code, out, _ = run_cli(capsys, "diagnose", "--url", url, "--window", "2", "--json")
        data = json.loads(out)
    finally:
        mock.kill()
        mock.wait()
    assert data["live"] is True and data["source"] == url
    tel = data["evidence"]["telemetry"]
    assert tel["host_cpu_busy_max"] >= 0 and "engine_rss_bytes_max" in tel


@pytest.mark.timeout(120)
def test_cancelled_requests_not_freed_on_a_leaking_mock() -> None:
    """The mock in its own process (`servetune mock-server --leak-cancelled`), so the client
    is measured alone and the telemetry sees the server as the engine."""
    from servetune.engines.process import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "servetune.cli.app", "mock-server", "--port", str(port),
           "--itl-ms", "20", "--leak-cancelled"]  # fmt: skip
    mock = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert mock.stdout is not None and "listening" in mock.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        opts = BenchOptions(
            url=url,
            workers=1,
            cancel_fraction=0.5,
            cancel_after_chunks=2,
            metrics_fetch=http_fetcher(url),
            scrape_interval_s=0.2,
        )
        spec = parse_workload(
        {"arrival": {"kind": "closed", "concurrency": 4}, "count": 20,
         "input_tokens": {"dist": "fixed", "value": 8},
         "output_tokens": {"dist": "fixed", "value": 30}}
    )  # fmt: skip
        res = ServerSession(opts, WordTokenizer()).measure(Point("leak", spec))
    finally:
        mock.kill()
        mock.wait()
    assert res.telemetry is not None and res.telemetry.series("engine_rss_bytes")
    d = diagnose_result(res)
    print("\n" + "\n".join(render(d)))
    # the engine's first finding; the host's own load may rank above it on a busy host
    # (the rest of the suite runs beside the engine tests: `host_overloaded` came first once)
    engine = next(x for x in d.findings if x.key != "host_overloaded")
    assert engine.key == "cancel_leak", [x.key for x in d.findings]
    assert engine.actions[0].knob == "engine abort-on-disconnect"
    assert res.cancellation and res.cancellation["running_after_run"] > 0


def test_a_simulated_run_gets_the_simulators_what_if_for_its_top_action() -> None:
    """An 8B model on an H100 with half its memory for the engine: 128 users of 2000+500
    tokens overflow the KV pool. The fp8 what-if is simulated on the same requests."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.measure import SimSession
    from servetune.model import get_model

    cfg = EngineConfig(max_num_seqs=128, gpu_memory_utilization=0.5)
    spec = parse_workload(
        {"count": 300, "arrival": {"kind": "closed", "concurrency": 128},
         "input_tokens": {"dist": "fixed", "value": 2000},
         "output_tokens": {"dist": "fixed", "value": 500}}
    )  # fmt: skip
    session = SimSession(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), cfg)
    res = session.measure(Point("kv", spec))
    assert res.target.sim.preemptions > 0
    d = diagnose_result(res)
    f = d.findings[0]
    assert f.key == "kv_pressure" and f.actions[0].next == "fp8"
    sim = f.actions[0].predicted or ""
    m = re.search(r"simulated: P99 TTFT ([\d.]+) s -> ([\d.]+) s", sim)
    assert m and float(m[2]) < float(m[1]), sim
    assert re.search(r"preemptions \d+ -> 0", sim), sim
