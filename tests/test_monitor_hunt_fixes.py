"""`monitor export` fixes from a bug hunt, one test each: two Deployments' rules loaded
into one Prometheus, vLLM's queue wait inside its first bucket, the rate window at a 1m
scrape, an idle Deployment's scale-in, long names (Grafana uid, KEDA labels), ONNX's KV
pages, an unwritable --out, a malformed IPv6 --prometheus-url, a near-zero --queue-target.
The `promtool test rules` checks run where promtool is installed."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.cli_run import run_cli

from servetune.engines import onnx_rt
from servetune.errors import InputError
from servetune.monitor import Deployment, export, from_description, schemas
from servetune.monitor.autoscale import adapter_config, hpa, keda_scaled_object
from servetune.monitor.dashboard import dashboard
from servetune.monitor.promql import KV_PAGES, signals
from servetune.monitor.writer import documents

JOB = 'job="servetune-engine"'
needs_promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="no promtool")


def promtool_test(tmp: Path, docs: dict[str, dict], case: dict, every: str = "15s") -> None:
    """`promtool test rules` on synthetic scrapes every `every`, the rules files `docs`
    (file name -> rules document) loaded together."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (tmp / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    test = {
        "rule_files": list(docs),
        "evaluation_interval": "15s",
        "tests": [{"interval": every, **case}],
    }
    (tmp / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"], cwd=tmp, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def fires(d: Deployment, alert: str) -> dict:
    """The alert as promtool reports it firing: its labels and the Deployment's."""
    rules = {r["alert"]: r for r in documents(d)["rules"]["groups"][1]["rules"]}
    return {
        "exp_labels": {**d.labels, **rules[alert]["labels"]},
        "exp_annotations": rules[alert]["annotations"],
    }


def fires_at(d: Deployment, alert: str, at: str) -> dict:
    """An alert_rule_test: `alert` firing at `at`, as `fires` gives it."""
    return {"eval_time": at, "alertname": alert, "exp_alerts": [fires(d, alert)]}


def scrapes(series: dict[str, str]) -> list[dict[str, str]]:
    """promtool's input_series from {series: values notation}."""
    return [{"series": k, "values": v} for k, v in series.items()]


def value(expr: str, v: float, at: str) -> dict:
    """A promql_expr_test: `expr` (one series) within float rounding of `v` at `at`."""
    return {
        "expr": f"sum(abs(({expr}) - {v}) < bool 1e-9)",
        "eval_time": at,
        "exp_samples": [{"labels": "{}", "value": 1}],
    }


# -- 1: two Deployments' rules in one Prometheus --------------------------------------


def two() -> tuple[Deployment, Deployment]:
    a = from_description("vllm", queue_target=2, kv_threshold=0.8, name="model-a", job="job-a")
    b = from_description("vllm", queue_target=2, kv_threshold=0.8, name="model-b", job="job-b")
    return a, b


def test_each_deployments_series_carry_its_labels_and_every_reader_selects_them() -> None:
    """Both exports recorded `servetune:requests_waiting:value` with no label: loaded
    together, one series per name, one Deployment's queue read as the other's."""
    for d in two():
        sel = f'servetune_deployment="{d.name}",servetune_namespace="default"'
        groups = documents(d)["rules"]["groups"]
        assert all(r["labels"] == d.labels for r in groups[0]["rules"])
        for alert in groups[1]["rules"]:  # every recorded series read is this one's
            assert alert["expr"].count("servetune:") == alert["expr"].count(sel), alert
        for m in hpa(d)["spec"]["metrics"]:
            assert m["external"]["metric"]["selector"] == {"matchLabels": d.labels}
        for r in adapter_config(d)["externalRules"]:
            assert r["seriesQuery"].endswith(f"{{{sel}}}")
            assert "<<.LabelMatchers>>" in r["metricsQuery"]  # the HPA's selector


@needs_promtool
def test_two_deployments_loaded_together_keep_their_own_series(tmp_path: Path) -> None:
    a, b = two()
    series = {
        'vllm:num_requests_waiting{job="job-a",instance="a"}': "100x40",
        'up{job="job-a",instance="a"}': "1x40",
        'vllm:num_requests_waiting{job="job-b",instance="b"}': "0x40",
        'up{job="job-b",instance="b"}': "1x40",
    }
    waiting = "servetune:requests_waiting:value{{servetune_deployment={!r}}}"
    case = {
        "input_series": scrapes(series),
        "promql_expr_test": [
            value(waiting.format("model-a").replace("'", '"'), 100, "5m"),
            value(waiting.format("model-b").replace("'", '"'), 0, "5m"),
        ],
        "alert_rule_test": [  # model-a's queue, not model-b's, is over its target
            fires_at(a, "ServetuneScaleOutPending", "5m")
        ],
    }
    docs = {"a.yaml": documents(a)["rules"], "b.yaml": documents(b)["rules"]}
    promtool_test(tmp_path, docs, case)


# -- 2: vLLM's queue wait inside its first bucket (0.3 s) -----------------------------


@needs_promtool
def test_vllm_queue_wait_reads_zero_inside_its_first_bucket(tmp_path: Path) -> None:
    """vLLM's queue-time buckets start at 0.3 s: a P95 of queues all under it read
    0.95 x 0.3 = 0.285 s, and the HPA's Value target of 0.3 s held N replicas
    (ceil(N x 0.285 / 0.3) = N) however idle the queue."""
    d = from_description("vllm", queue_target=2, kv_threshold=0.8)
    trigger = {t["name"]: t for t in keda_scaled_object(d)["spec"]["triggers"]}
    query = trigger["queue_wait_p95"]["metadata"]["query"]
    recorded = "servetune:queue_wait_seconds:p95"
    le = f"vllm:request_queue_time_seconds_bucket{{{JOB},le="
    under = {f'{le}"0.3"}}': "0+15x80", f'{le}"0.5"}}': "0+15x80", f'{le}"+Inf"}}': "0+15x80"}
    rules = {"r.yaml": documents(d)["rules"]}
    case = {"input_series": scrapes(under)}
    case["promql_expr_test"] = [value(recorded, 0, "10m"), value(query, 0, "10m")]
    promtool_test(tmp_path / "under", rules, case)
    # 2 of 20 a scrape over 0.3 s: the P95 is past the first bucket and reads as the plain
    # quantile, 0.3 + (19 - 18) / (20 - 18) x 0.2 = 0.4 s
    over = {f'{le}"0.3"}}': "0+18x80", f'{le}"0.5"}}': "0+20x80", f'{le}"+Inf"}}': "0+20x80"}
    case = {"input_series": scrapes(over)}
    case["promql_expr_test"] = [value(recorded, 0.4, "10m"), value(query, 0.4, "10m")]
    promtool_test(tmp_path / "over", rules, case)
    assert math.ceil(3 * 0 / d.queue_wait_p95_s) == 0  # the HPA may now scale in


def test_only_vllms_queue_wait_has_a_first_bucket_floor() -> None:
    assert "> 0.3) or vector(0)" in signals("vllm", "j", "1m")["queue_wait_seconds:p95"]
    for engine in ("sglang", "tgi"):  # their buckets start at 0 and 0.15 ms
        assert "> 0) or vector(0)" in signals(engine, "j", "1m")["queue_wait_seconds:p95"]


# -- 3: the rate window at Prometheus's default 1m scrape -----------------------------


@needs_promtool
def test_the_default_rate_window_holds_at_a_one_minute_scrape(tmp_path: Path) -> None:
    """A [1m] window at Prometheus's default 1m scrape held one sample at most: the queue
    wait read 0 between scrapes and ServetuneScaleOutQueueWait never held for its 2m."""
    d = from_description("vllm", queue_target=8, kv_threshold=0.8)
    assert (d.scrape_interval, d.rate_window) == ("1m", "4m")
    le = f"vllm:request_queue_time_seconds_bucket{{{JOB},le="
    # every request waits 0.3-5 s, 60 a minute
    series = {
        f'{le}"0.3"}}': "0x20",
        f'{le}"5"}}': "0+60x20",
        f'{le}"+Inf"}}': "0+60x20",
        f"up{{{JOB}}}": "1x20",
    }
    case = {
        "input_series": scrapes(series),
        "alert_rule_test": [fires_at(d, "ServetuneScaleOutQueueWait", "10m15s")],
    }
    promtool_test(tmp_path, {"r.yaml": documents(d)["rules"]}, case, every="1m")


def test_rate_window_follows_the_scrape_interval_and_says_so(capsys, tmp_path: Path) -> None:
    hand = ["monitor", "export", "--engine", "vllm", "--queue-target", "2", "--kv-threshold",
            "0.8"]  # fmt: skip
    code, out, err = run_cli(capsys, *hand, "-o", str(tmp_path / "a"))
    assert code == 0, err
    assert "rate window 4m: at least 4x a 1m scrape interval" in out
    assert "[4m]" in (tmp_path / "a" / "prometheus-rules.yaml").read_text()
    code, out, err = run_cli(capsys, *hand, "--scrape-interval", "15s", "-o", str(tmp_path / "b"))
    assert code == 0 and "rate window 1m" in out, err
    assert "[1m]" in (tmp_path / "b" / "prometheus-rules.yaml").read_text()
    code, _, err = run_cli(capsys, *hand, "--rate-window", "1m", "-o", str(tmp_path / "c"))
    assert code == 2 and err.startswith("error: --rate-window: 1m is under 4x"), err
    assert "--rate-window 4m" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, *hand, "--scrape-interval", "0s", "-o", str(tmp_path / "d"))
    assert code == 2 and err.startswith("error: --scrape-interval:"), err


# -- 4: scale-in on a Deployment idle all day -----------------------------------------


@needs_promtool
def test_scale_in_fires_on_a_deployment_idle_all_day(tmp_path: Path) -> None:
    """Without a measured capacity, "low" was running under half the day's peak: idle all
    day, both are 0 and 0 < 0.5 x 0 is false, so an idle Deployment never scaled in."""
    d = from_description("vllm", queue_target=8, kv_threshold=0.8)
    assert d.running_target is None
    series = {
        f'vllm:num_requests_waiting{{{JOB},instance="a"}}': "0x200",
        f'vllm:num_requests_running{{{JOB},instance="a"}}': "0x200",
        f'vllm:kv_cache_usage_perc{{{JOB},instance="a"}}': "0x200",
        f'up{{{JOB},instance="a"}}': "1x200",
    }
    case = {
        "input_series": scrapes(series),
        "alert_rule_test": [fires_at(d, "ServetuneScaleIn", "40m")],
    }
    promtool_test(tmp_path, {"r.yaml": documents(d)["rules"]}, case)


# -- 5, 10: long names -----------------------------------------------------------------

# two 63-character Deployment names (the longest Kubernetes takes), alike but the end
LONG = ("llama-3-1-8b-instruct-prod-eu-west-canary-" + "x" * 21,
        "llama-3-1-8b-instruct-prod-eu-west-stable-" + "x" * 21)  # fmt: skip


def test_long_names_keep_distinct_dashboard_uids() -> None:
    """The uid was `servetune-<name>` cut at 40: two names alike for 30 characters got
    one uid, and importing the second dashboard replaced the first."""
    uids = [dashboard(from_description("llamacpp", queue_target=2, name=n))["uid"] for n in LONG]
    assert uids[0] != uids[1] and all(len(u) <= 40 and not u.endswith("-") for u in uids)
    assert dashboard(from_description("llamacpp", queue_target=2))["uid"] == "servetune-llm"
    # a cut that lands on a '-' does not end the uid with two of them
    dash = "a" * 29 + "-" + "b" * 20
    uid = dashboard(from_description("llamacpp", queue_target=2, name=dash))["uid"]
    assert len(uid) <= 40 and "--" not in uid


@pytest.mark.parametrize("name", LONG)
def test_a_long_name_gives_keda_names_it_can_write_as_labels(name: str) -> None:
    """`<name>-servetune` went past 63 characters for names of 54-63: KEDA copies the
    ScaledObject's name into the HPA's label values, which Kubernetes caps at 63."""
    d = from_description("llamacpp", queue_target=2, name=name)
    keda, h = keda_scaled_object(d), hpa(d)
    assert len(keda["metadata"]["name"]) <= 63 and keda["metadata"]["name"] == h["metadata"]["name"]
    assert schemas.problems(keda, schemas.KEDA_SCALED_OBJECT) == []
    other = from_description("llamacpp", queue_target=2, name=LONG[LONG.index(name) - 1])
    assert keda_scaled_object(other)["metadata"]["name"] != keda["metadata"]["name"]
    assert keda_scaled_object(from_description("llamacpp", queue_target=2))["metadata"][
        "name"
    ] == "llm-servetune"  # fmt: skip


# -- 7: ONNX's KV pages ----------------------------------------------------------------


def test_onnx_scales_on_its_kv_pages() -> None:
    """The ONNX server exports its KV pool as pages in use and the pool's pages, which
    onnx_rt.derived combines for the live view; the rules said it had no KV gauge."""
    assert set(KV_PAGES["onnx"]) <= set(onnx_rt.DERIVED_FROM)
    d = from_description("onnx", queue_target=2, kv_threshold=0.8)
    kv = signals("onnx", "servetune-engine", "1m")["kv_cache_usage"]
    assert kv == (
        f"clamp_max(max(onnx_genai_kv_pages_in_use{{{JOB}}} / "
        f"onnx_genai_kv_pages_capacity{{{JOB}}}), 1)"
    )
    alerts = {r["alert"] for r in documents(d)["rules"]["groups"][1]["rules"]}
    assert "ServetuneScaleOutKVCache" in alerts
    assert "kv_cache_usage" in {t["name"] for t in keda_scaled_object(d)["spec"]["triggers"]}
    with pytest.raises(InputError, match="--kv-threshold"):  # now a limit it needs
        from_description("onnx", queue_target=2)


@needs_promtool
def test_onnx_kv_usage_is_pages_over_capacity_capped_at_one(tmp_path: Path) -> None:
    d = from_description("onnx", queue_target=2, kv_threshold=0.8)
    kv = "servetune:kv_cache_usage:value"
    for pages, want in ((1024, 0.25), (5000, 1)):  # a demoted page may pass capacity
        series = {
            f"onnx_genai_kv_pages_in_use{{{JOB}}}": f"{pages}x40",
            f"onnx_genai_kv_pages_capacity{{{JOB}}}": "4096x40",
        }
        case = {
            "input_series": scrapes(series),
            "promql_expr_test": [value(kv, want, "5m")],
        }
        promtool_test(tmp_path / str(pages), {"r.yaml": documents(d)["rules"]}, case)


# -- 8, 9, 11: bad input is one line naming the flag -----------------------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_out_folder_that_cannot_be_made_is_one_line(capsys) -> None:
    """/proc exists, but no folder can be made in it: mkdir's OSError was a traceback."""
    code, _, err = run_cli(capsys, "monitor", "export", "--engine", "vllm", "--queue-target",
                           "2", "--kv-threshold", "0.8", "-o", "/proc/servetune-out")  # fmt: skip
    assert code == 2 and err.startswith("error: --out: cannot create folder"), err
    assert err.count("\n") == 1


def test_export_names_out_when_the_folder_cannot_be_made(tmp_path: Path, monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    d = from_description("vllm", queue_target=2, kv_threshold=0.8)
    with pytest.raises(InputError, match=r"--out: cannot create folder .* \(Permission denied\)"):
        export(d, tmp_path / "mon")


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1:9090/"])
def test_a_malformed_ipv6_prometheus_url_names_the_flag(capsys, tmp_path: Path, url: str):
    code, _, err = run_cli(capsys, "monitor", "export", "--engine", "vllm", "--queue-target",
                           "2", "--kv-threshold", "0.8", "--prometheus-url", url,
                           "-o", str(tmp_path / "mon"))  # fmt: skip
    assert code == 2 and err.startswith("error: --prometheus-url:"), err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("target", [1e-300, 0.0009])
def test_a_queue_target_under_what_the_hpa_reads_is_refused(target: float) -> None:
    """The HPA reads an AverageValue target in thousandths: 1e-300 was written as "0"."""
    with pytest.raises(InputError, match="--queue-target: .* must be at least 0.001"):
        from_description("vllm", queue_target=target, kv_threshold=0.8)
    d = from_description("vllm", queue_target=0.001, kv_threshold=0.8)
    assert {"type": "AverageValue", "averageValue": "0.001"} in [
        m["external"]["target"] for m in hpa(d)["spec"]["metrics"]
    ]
