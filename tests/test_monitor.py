"""`monitor export` without an engine: limits from a tuned study's measured capacity, the
engines' real metric names in every query, promtool-valid rules, schema-valid dashboard
and autoscaling manifests, one-line errors. The live Prometheus check is in
test_monitor_prometheus.py."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servetune.cli.app import app
from servetune.engines.flagcheck import load as published_cli
from servetune.engines.registry import adapter
from servetune.errors import InputError
from servetune.measure.result import PointResult
from servetune.monitor import Deployment, export, from_description, from_summary, schemas
from servetune.monitor.autoscale import adapter_config, hpa, keda_scaled_object
from servetune.monitor.dashboard import dashboard, queries
from servetune.monitor.promql import FAILED_REQUESTS
from servetune.monitor.writer import FILES, documents
from servetune.slo import parse_slo
from servetune.store import Store
from servetune.tune.trial import TrialResult, TrialStatus

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "sglang", "tgi", "llamacpp")
SLO = parse_slo({"ttft_ms": {"p95": 800, "p99": 2000}, "tpot_ms": {"p95": 40}})
# every kind of SLO target: each statistic, every latency metric, the run-level targets
FULL_SLO_DATA = {
    "ttft_ms": {"p50": 200, "p90": 500, "p95": 800, "p99": 2000, "mean": 300, "max": 5000},
    "tpot_ms": {"p50": 20, "p95": 40, "p99": 60},
    "itl_ms": {"p95": 50},
    "e2e_ms": {"p95": 9000},
    "error_rate": 0.001,
    "kv_cache_usage_max": 0.9,
    "goodput": {"ttft_ms": 900},
}
FULL_SLO = parse_slo(FULL_SLO_DATA)
JOB = 'job="servetune-engine"'
# the labels a Deployment's recorded series carry (the default --name and --namespace)
SEL = '{servetune_deployment="llm",servetune_namespace="default"}'


def summary(signals: dict, engine: str = "vllm", slo: dict | None = None) -> dict:
    """A tune study summary as `tune` stores it: the winner trial and its best point."""
    best = PointResult("concurrency", 24.0, True, req_s=3.0, signals=signals)
    win = TrialResult(
        key="k1", config={"engine": engine, "max_num_seqs": 16}, label="win",
        backend="real", status=TrialStatus.OK, capacity=24.0, best=best, points=[best],
    )  # fmt: skip
    return {"study": "s", "slo": slo or {"ttft_ms": {"p95": 800}}, "winner": win.to_json()}


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool from Debian's prometheus package (scripts/services.sh installs it)."""
    subprocess.run([str(ROOT / "scripts/services.sh"), "prometheus"], check=True, timeout=600)
    return "promtool"


def test_limits_come_from_the_winners_measured_point_not_defaults() -> None:
    d = from_summary(summary({"requests_waiting_max": 3.2, "kv_cache_usage_max": 0.62}))
    assert (d.engine, d.queue_target, d.kv_threshold) == ("vllm", 4.0, 0.62)
    assert d.slo is not None and d.slo.ttft_ms.p95 == 800
    # a hotter KV peak is capped at the seed's 85%, a tighter SLO headroom wins over both
    assert from_summary(summary({"requests_waiting_max": 0, "kv_cache_usage_max": 0.97})
                        ).kv_threshold == 0.85  # fmt: skip
    tight = summary({"requests_waiting_max": 0, "kv_cache_usage_max": 0.97},
                    slo={"kv_cache_usage_max": 0.7})  # fmt: skip
    d = from_summary(tight)
    assert (d.queue_target, d.kv_threshold) == (1.0, 0.7)
    assert any("SLO kv_cache_usage_max" in n for n in d.notes)


def test_a_simulated_winner_gives_its_queue_and_kv_from_the_scheduler_counters() -> None:
    sim = {"max_in_flight": 22, "max_num_seqs": 16, "kv_blocks": 1000, "max_kv_blocks_used": 500}
    d = from_summary(summary(sim))
    assert (d.queue_target, d.kv_threshold) == (6.0, 0.5)


def test_hand_described_deployment_needs_the_measured_limits() -> None:
    with pytest.raises(InputError, match="--queue-target"):
        from_description("vllm", kv_threshold=0.8)
    with pytest.raises(InputError, match="--kv-threshold"):
        from_description("vllm", queue_target=2)
    # llama.cpp has no KV gauge: the queue alone is enough
    assert from_description("llamacpp", queue_target=2).kv_threshold is None
    with pytest.raises(InputError, match="unknown engine") as e:
        from_description("vlm", queue_target=2, kv_threshold=0.8)
    assert e.value.field == "--engine" and e.value.fix == "did you mean vllm?"  # not trtllm
    with pytest.raises(InputError) as e:  # the choices are the engines it can scale
        from_description("foo", queue_target=2)
    assert e.value.fix == "one of vllm, sglang, tgi, llamacpp, onnx", e.value.fix
    with pytest.raises(InputError, match="--scale-out-for"):
        Deployment(engine="vllm", queue_target=1, kv_threshold=0.8, scale_out_for="2 min")


@pytest.mark.parametrize("engine", ENGINES)
def test_every_query_uses_the_engines_own_metric_names(engine: str, tmp_path: Path,
                                                       promtool: str) -> None:  # fmt: skip
    kv = None if engine == "llamacpp" else 0.8  # llama.cpp exports no KV gauge
    d = from_description(engine, queue_target=3, kv_threshold=kv, slo=FULL_SLO)
    files = export(d, tmp_path)
    subprocess.run([promtool, "check", "rules", str(files["rules"])], check=True)
    mod = adapter(engine)
    fams = mod.HISTOGRAMS.values()
    known = set(mod.METRICS.values()) | {"up"}
    known |= {f + suffix for f in fams for suffix in ("_bucket", "_sum", "_count")}
    known |= {FAILED_REQUESTS[engine][0]} if engine in FAILED_REQUESTS else set()
    rules = yaml.safe_load(files["rules"].read_text())["groups"]
    exprs = [r["expr"] for r in rules[0]["rules"]]
    exprs += queries(json.loads(files["dashboard"].read_text()))
    for expr in exprs:
        used = set(re.findall(r"([a-z0-9_:]+)\{job=", expr))
        assert used and used <= known, (expr, used - known)
    # the scale-out rules exist where the engine can feed them (seed 003 §11)
    alerts = {r["alert"]: r for r in rules[1]["rules"]}
    assert "ServetuneScaleOutPending" in alerts
    assert alerts["ServetuneScaleOutPending"]["expr"].split(">")[1].strip().startswith("3 *")
    assert ("ServetuneScaleOutQueueWait" in alerts) == ("queue_time_seconds" in mod.HISTOGRAMS)
    assert ("ServetuneScaleOutKVCache" in alerts) == (engine != "llamacpp")
    assert not any("gpu" in r["expr"].lower() for r in rules[1]["rules"])


def test_alerts_carry_the_seed_thresholds_and_the_slo() -> None:
    d = from_description("vllm", queue_target=2, kv_threshold=0.8, slo=SLO)
    alerts = {r["alert"]: r for r in documents(d)["rules"]["groups"][1]["rules"]}
    assert alerts["ServetuneScaleOutQueueWait"]["expr"].endswith("> 0.3")
    assert alerts["ServetuneScaleOutQueueWait"]["for"] == "2m"
    assert alerts["ServetuneScaleIn"]["for"] == "15m"
    assert alerts["ServetuneSLOTTFTP99"]["expr"].endswith("> 2")
    assert alerts["ServetuneSLOTPOTP95"]["expr"].endswith("> 0.04")


@pytest.mark.parametrize(
    ("engine", "family"),
    [
        ("vllm", "vllm:request_time_per_output_token_seconds"),
        ("sglang", "sglang:request_time_per_output_token_seconds"),
        ("tgi", "tgi_request_mean_time_per_token_duration"),
    ],
)
def test_the_tpot_slo_rule_reads_the_per_request_tpot_not_the_token_gaps(
    engine: str, family: str
) -> None:
    """The SLO's P95 TPOT is over requests' mean TPOTs; a P95 over every token gap (the ITL
    histogram) runs far above it (TPOT P95 22 ms vs ITL P95 39 ms at a tuned point)."""
    d = from_description(engine, queue_target=2, kv_threshold=0.8, slo=SLO)
    records = {r["record"]: r["expr"] for r in documents(d)["rules"]["groups"][0]["rules"]}
    assert f"{family}_bucket" in records["servetune:tpot_seconds:p95"]
    assert "inter_token" not in records["servetune:tpot_seconds:p95"]


@pytest.mark.parametrize("engine", ENGINES)
def test_manifests_and_dashboard_pass_their_published_schemas(engine: str) -> None:
    kv = None if engine == "llamacpp" else 0.8
    d = from_description(engine, queue_target=2, kv_threshold=kv, slo=SLO)
    docs = documents(d)
    assert schemas.problems(docs["dashboard"], schemas.GRAFANA_DASHBOARD) == []
    assert schemas.problems(docs["keda"], schemas.KEDA_SCALED_OBJECT) == []
    assert schemas.problems(docs["hpa"], schemas.HPA_V2) == []
    assert schemas.problems(docs["adapter"], schemas.PROMETHEUS_ADAPTER) == []


def test_every_slo_alert_has_a_dashboard_panel_with_its_line() -> None:
    """The rules alerted on TTFT P50/mean, ITL P99 and E2E P95, but the dashboard's fixed
    panels showed none of them: an alert with nothing to look at."""
    d = from_description("vllm", queue_target=2, kv_threshold=0.8, slo=FULL_SLO)
    alerts = documents(d)["rules"]["groups"][1]["rules"]
    exprs = {r["record"]: r["expr"] for r in documents(d)["rules"]["groups"][0]["rules"]}
    panels = {q: p for p in dashboard(d)["panels"] for q in queries({"panels": [p]})}
    slo_alerts = [
        a for a in alerts if a["labels"]["servetune_action"] == "slo" and "_seconds:" in a["expr"]
    ]
    assert len(slo_alerts) > 5
    for a in slo_alerts:
        record, limit = (x.strip() for x in a["expr"].split(">"))
        assert record.endswith(SEL), a["expr"]  # this Deployment's series
        panel = panels.get(exprs[record.removesuffix(SEL)])
        assert panel is not None, a["alert"]
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert any(s["value"] == float(limit) for s in steps), (a["alert"], steps)
    titles = [p["title"] for p in dashboard(d)["panels"]]
    assert {"P50 TTFT (SLO)", "Mean TTFT (SLO)", "P95 E2E (SLO)"} <= set(titles)
    assert len(titles) == len(set(titles))


def test_the_schemas_reject_what_grafana_and_kubernetes_would() -> None:
    d = from_description("vllm", queue_target=2, kv_threshold=0.8)
    dash = dashboard(d)
    dash["panels"][0]["gridPos"]["w"] = 30  # wider than Grafana's 24-column grid
    assert any("gridPos/w" in p for p in schemas.problems(dash, schemas.GRAFANA_DASHBOARD))
    h = hpa(d)
    h["spec"]["minReplicas"] = 0  # autoscaling/v2 needs at least one
    assert schemas.problems(h, schemas.HPA_V2)
    k = keda_scaled_object(d)
    k["spec"]["triggers"][0]["metadata"]["threshold"] = 0.3  # KEDA reads strings only
    assert schemas.problems(k, schemas.KEDA_SCALED_OBJECT)


def test_autoscalers_follow_seed_003_scaling_arithmetic() -> None:
    d = from_description("vllm", queue_target=5, kv_threshold=0.7, min_replicas=2,
                         max_replicas=8)  # fmt: skip
    k = keda_scaled_object(d)["spec"]
    trig = {t["name"]: t for t in k["triggers"]}
    # pending > target x replicas  <=>  AverageValue target of the per-replica queue
    assert (trig["pending_requests"]["metricType"], trig["pending_requests"]["metadata"]
            ["threshold"]) == ("AverageValue", "5")  # fmt: skip
    assert trig["kv_cache_usage"]["metadata"]["threshold"] == "0.7"
    beh = k["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert beh["scaleUp"]["stabilizationWindowSeconds"] == 120
    assert beh["scaleDown"]["stabilizationWindowSeconds"] == 900
    assert (k["minReplicaCount"], k["maxReplicaCount"]) == (2, 8)
    spec = hpa(d)["spec"]
    targets = [m["external"]["target"] for m in spec["metrics"]]
    assert {"type": "AverageValue", "averageValue": "5"} in targets


def test_cli_exports_from_a_stored_study(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(db) as store:
        sig = {"requests_waiting_max": 6.0, "kv_cache_usage_max": 0.5}
        store.update_study_meta("s", {"summary": summary(sig)}, "tune")
    out = tmp_path / "mon"
    res = CliRunner().invoke(app, ["monitor", "export", "--from-study", "s", "--db", db,
                                   "-o", str(out), "--replicas", "2:6"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "queue target 6/replica" in res.output
    keda = yaml.safe_load((out / "keda-scaledobject.yaml").read_text())
    assert keda["spec"]["maxReplicaCount"] == 6
    rules = (out / "prometheus-rules.yaml").read_text()
    assert "> 6 * servetune:replicas:value" in rules and "> 0.5" in rules


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args, field in (
        (["--engine", "vllm"], "--queue-target"),
        (["--engine", "vllm", "--queue-target", "2", "--kv-threshold", "0.8",
          "--replicas", "a:b"], "--replicas"),
        (["--from-study", "nope", "--db", f"sqlite:///{tmp_path / 'x.db'}"], "--db"),
        (["--engine", "llamacpp", "--queue-target", "2", "--kv-threshold", "0.8"],
         "--kv-threshold"),
    ):  # fmt: skip
        res = subprocess.run(
            [str(ROOT / ".venv/bin/servetune"), "monitor", "export", "-o", str(tmp_path), *args],
            capture_output=True, text=True,
        )  # fmt: skip
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().count("\n") == 0 and field in res.stderr, res.stderr


def test_hand_limits_override_the_measured_ones_and_say_so() -> None:
    d = from_summary(summary({"kv_cache_usage_max": 0.5}), queue_target=3)  # no queue measured
    assert (d.queue_target, d.kv_threshold) == (3, 0.5)
    assert any("given by hand" in n for n in d.notes)
    with pytest.raises(InputError, match="no queue measurement"):
        from_summary(summary({"kv_cache_usage_max": 0.5}))


# --- every SLO target an alert or a note; the error rate; idle queue wait; scale-in;
# --- the prometheus-adapter rules; flags that would be ignored


def promtool_test(
    promtool: str,
    d: Deployment,
    tmp: Path,
    series: dict[str, str],
    exprs: dict[str, float] | None = None,
    alerts: dict[str, bool] | None = None,
    at: str = "20m",
) -> None:
    """Evaluate the exported rules on synthetic scrapes every 15 s (`promtool test
    rules`): each expression's value (to float rounding) and whether each alert fires at
    `at`."""
    files = export(d, tmp)
    groups = yaml.safe_load(files["rules"].read_text())["groups"]
    rules = {r["alert"]: r for r in groups[1]["rules"]}

    def close(expr: str, value: float) -> str:  # 1 where within float rounding, NaN: 0
        return f"sum(abs(({expr}) - {value}) < bool 1e-9)"  # sum: 2 where two series

    def expect(name: str, fires: bool) -> list[dict]:
        labels = {**d.labels, **rules[name]["labels"]}  # the Deployment's, from its series
        want = {"exp_labels": labels, "exp_annotations": rules[name]["annotations"]}
        return [want] if fires else []

    case = {
        "interval": "15s",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [
            {"expr": close(e, v), "eval_time": at, "exp_samples": [{"labels": "{}", "value": 1}]}
            for e, v in (exprs or {}).items()
        ],
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": expect(name, fires)}
            for name, fires in (alerts or {}).items()
        ],
    }
    test = {
        "rule_files": [files["rules"].name],
        "evaluation_interval": d.eval_interval,
        "tests": [case],
    }
    (tmp / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def slo_keys(data: dict) -> list[str]:
    """Every target an SLO file names: `ttft_ms.p95`, ..., `error_rate`, `goodput`."""
    out = []
    for metric, value in data.items():
        if isinstance(value, dict) and metric != "goodput":
            out += [f"{metric}.{stat}" for stat in value]
        else:
            out.append(metric)
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_every_slo_target_is_an_alert_or_a_note_naming_it(engine: str) -> None:
    kv = None if engine == "llamacpp" else 0.8
    d = from_description(engine, queue_target=3, kv_threshold=kv, slo=FULL_SLO)
    rules = documents(d)["rules"]["groups"]
    records = {r["record"] for r in rules[0]["rules"]}
    alerts = {r["alert"]: r for r in rules[1]["rules"] if r["labels"]["servetune_action"] == "slo"}
    watched = {a["annotations"]["summary"].split(" above")[0] for a in alerts.values()}
    noted = {n.split()[1] for n in d.notes if n.startswith("SLO ")}
    for key in slo_keys(FULL_SLO_DATA):
        assert (key in watched) != (key in noted), (key, watched, noted)
    for alert in alerts.values():  # each alert reads a series the rules record
        assert alert["expr"].split(" > ")[0].removesuffix(SEL) in records
    if engine == "vllm":  # every latency histogram, the failure counter, the KV gauge
        assert noted == {"ttft_ms.max", "goodput"}, d.notes
        assert alerts["ServetuneSLOTTFTP50"]["expr"] == f"servetune:ttft_seconds:p50{SEL} > 0.2"
        assert alerts["ServetuneSLOTTFTMEAN"]["expr"] == f"servetune:ttft_seconds:mean{SEL} > 0.3"
        assert alerts["ServetuneSLOE2EP95"]["expr"] == f"servetune:e2e_seconds:p95{SEL} > 9"
        assert (alerts["ServetuneSLOErrorRate"]["expr"]
                == f"servetune:request_errors:ratio{SEL} > 0.001")  # fmt: skip
    if engine == "tgi":
        assert "SLO ttft_ms.p95 800 ms: no rule (tgi exports no TTFT histogram)" in d.notes
        assert "ServetuneSLOErrorRate" in alerts
    if engine in ("sglang", "llamacpp"):
        assert any(n.startswith("SLO error_rate 0.1%: no rule") for n in d.notes)


def test_cli_prints_the_slo_targets_it_has_no_rule_for(tmp_path: Path) -> None:
    slo = tmp_path / "slo.yaml"
    targets = {"ttft_ms": {"p90": 500}, "e2e_ms": {"p95": 9000}, "error_rate": 0.001}
    slo.write_text(yaml.safe_dump(targets))
    args = ["monitor", "export", "--engine", "llamacpp", "--queue-target", "2"]
    res = CliRunner().invoke(app, [*args, "--slo", str(slo), "-o", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    for key in ("ttft_ms.p90 500 ms", "e2e_ms.p95 9000 ms", "error_rate 0.1%"):
        assert f"SLO {key}: no rule" in res.output, res.output


def test_the_failure_counters_are_the_engines_own() -> None:
    # vLLM: the canonical finished counter, by its finish reason; TGI: its router's counter
    assert FAILED_REQUESTS["vllm"][0] == adapter("vllm").METRICS["requests_finished_total"]
    assert published_cli("tgi").metrics[FAILED_REQUESTS["tgi"][0]] == "counter"
    assert set(FAILED_REQUESTS) == {"vllm", "tgi"}


def test_error_rate_alert_fires_on_the_engines_failed_requests(
    tmp_path: Path, promtool: str
) -> None:
    slo = parse_slo({"error_rate": 0.001})
    ratio, alert = "servetune:request_errors:ratio", "ServetuneSLOErrorRate"
    vllm = from_description("vllm", queue_target=2, kv_threshold=0.8, slo=slo)
    ok = f'vllm:request_success_total{{{JOB},finished_reason="stop"}}'
    err = f'vllm:request_success_total{{{JOB},finished_reason="error"}}'
    # 1 failure in 100 finished requests: 1%, over the SLO's 0.1%
    seen = {ok: "0+99x80", err: "0+1x80"}
    promtool_test(promtool, vllm, tmp_path / "a", seen, {ratio: 0.01}, {alert: True})
    seen = {ok: "0+99x80", err: "0x80"}
    promtool_test(promtool, vllm, tmp_path / "b", seen, {ratio: 0}, {alert: False})
    tgi = from_description("tgi", queue_target=2, kv_threshold=0.8, slo=slo)
    fail = f'tgi_request_failure{{{JOB},err="generation"}}'
    seen = {f"tgi_request_success{{{JOB}}}": "0+99x80", fail: "0+1x80"}
    promtool_test(promtool, tgi, tmp_path / "c", seen, {ratio: 0.01}, {alert: True})
    # every request failing: TGI never created its success counter, the ratio is still 1
    promtool_test(promtool, tgi, tmp_path / "d", {fail: "0+5x80"}, {ratio: 1}, {alert: True})


def test_queue_wait_reads_zero_when_idle_and_the_quantile_under_traffic(
    tmp_path: Path, promtool: str
) -> None:
    d = from_description("vllm", queue_target=2, kv_threshold=0.8)
    keda = {t["name"]: t["metadata"]["query"] for t in keda_scaled_object(d)["spec"]["triggers"]}
    recorded, trigger = "servetune:queue_wait_seconds:p95", keda["queue_wait_p95"]
    le = f"vllm:request_queue_time_seconds_bucket{{{JOB},le="
    # idle: all-zero rates, where histogram_quantile gives NaN; KEDA and the HPA read 0
    idle = {f'{le}"0.1"}}': "5x80", f'{le}"0.5"}}': "7x80", f'{le}"+Inf"}}': "7x80"}
    promtool_test(promtool, d, tmp_path / "idle", idle, {recorded: 0, trigger: 0})
    # traffic: of 20 requests a scrape, 10 under 0.1 s and all under 0.5 s: the P95 is
    # 0.1 + (19 - 10) / (20 - 10) * 0.4 = 0.46 s, the plain histogram_quantile's value
    busy = {f'{le}"0.1"}}': "0+10x80", f'{le}"0.5"}}': "0+20x80", f'{le}"+Inf"}}': "0+20x80"}
    promtool_test(promtool, d, tmp_path / "busy", busy, {recorded: 0.46, trigger: 0.46})


def llamacpp_study(running_max: float) -> Deployment:
    sig = {"requests_waiting_max": 2, "requests_running_max": running_max}
    return from_summary(summary(sig, engine="llamacpp"))


def test_scale_in_waits_for_the_slots_to_empty_not_just_the_queue(
    tmp_path: Path, promtool: str
) -> None:
    """Steady load with all 4 slots busy and no queue is capacity, not low load: scaling
    in would bring the queue, and the scale-out, straight back."""
    d = llamacpp_study(4)
    assert d.running_target == 4
    assert any("running capacity 4/replica" in n for n in d.notes)
    base = {f"up{{{JOB}}}": "1x120", f"llamacpp:requests_deferred{{{JOB}}}": "0x120"}
    running = f"llamacpp:requests_processing{{{JOB}}}"
    full, low = {**base, running: "4x120"}, {**base, running: "1x120"}
    promtool_test(promtool, d, tmp_path / "full", full, alerts={"ServetuneScaleIn": False})
    # one request on a 4-slot replica, under half its capacity for 15 min: scale in
    promtool_test(promtool, d, tmp_path / "low", low, alerts={"ServetuneScaleIn": True})
    # no measured capacity: under half the busiest the replicas ran that day
    hand = from_description("llamacpp", queue_target=2)
    assert any(n.startswith("no running capacity measured") for n in hand.notes)
    promtool_test(promtool, hand, tmp_path / "hand", full, alerts={"ServetuneScaleIn": False})
    drop = {**base, running: "4x20 1x100"}
    fires = {"ServetuneScaleIn": True}
    promtool_test(promtool, hand, tmp_path / "drop", drop, alerts=fires, at="25m")


def test_autoscalers_hold_replicas_while_their_slots_are_full() -> None:
    """HPA: desired = ceil(running / R) on an AverageValue target R, so N replicas with
    every slot busy (N x R running) stay N; one goes when a replica's worth drains."""
    d = llamacpp_study(4)
    trig = {t["name"]: t for t in keda_scaled_object(d)["spec"]["triggers"]}
    run = trig["running_requests"]
    assert (run["metricType"], run["metadata"]["threshold"]) == ("AverageValue", "4")
    assert run["metadata"]["query"] == f"sum(llamacpp:requests_processing{{{JOB}}})"
    r = float(run["metadata"]["threshold"])
    for n in (2, 3, 5):
        assert math.ceil(n * 4 / r) == n and math.ceil((n - 1) * 4 / r) == n - 1
    ext = {m["external"]["metric"]["name"]: m["external"] for m in hpa(d)["spec"]["metrics"]}
    want = {"type": "AverageValue", "averageValue": "4"}
    assert ext["servetune_requests_running_value"]["target"] == want
    # measured nothing about running (by hand): no running trigger
    hand = from_description("llamacpp", queue_target=2)
    assert "running_requests" not in {
        t["name"] for t in keda_scaled_object(hand)["spec"]["triggers"]
    }


def test_a_simulated_winner_gives_its_running_capacity() -> None:
    sim = {"max_in_flight": 22, "max_num_seqs": 16, "kv_blocks": 1000, "max_kv_blocks_used": 500}
    assert from_summary(summary(sim)).running_target == 16  # the running slots; 6 queued
    assert from_summary(summary({**sim, "max_in_flight": 10})).running_target == 10


@pytest.mark.parametrize("engine", ENGINES)
def test_adapter_rules_serve_every_external_metric_the_hpa_reads(engine: str) -> None:
    kv = None if engine == "llamacpp" else 0.8
    sig = {"requests_waiting_max": 2, "requests_running_max": 4}
    d = from_summary(summary(sig, engine=engine), kv_threshold=kv)
    rules = adapter_config(d)["externalRules"]
    served = [r["name"]["as"] for r in rules]
    assert sorted(served) == sorted(
        m["external"]["metric"]["name"] for m in hpa(d)["spec"]["metrics"]
    )
    records = {r["record"] for r in documents(d)["rules"]["groups"][0]["rules"]}
    for r in rules:  # each reads this Deployment's recorded series, under a name matching it
        series = r["seriesQuery"].removesuffix(SEL)
        assert series in records and re.fullmatch(r["name"]["matches"], series)
        assert r["resources"] == {"namespaced": False}  # the series carry no namespace label


def adapter_query(rule: dict, hpa_doc: dict) -> str:
    """What prometheus-adapter sends for the HPA's External metric `rule` serves:
    `<<.Series>>` the series name, `<<.LabelMatchers>>` the metric's selector."""
    metric = next(m["external"]["metric"] for m in hpa_doc["spec"]["metrics"]
                  if m["external"]["metric"]["name"] == rule["name"]["as"])  # fmt: skip
    labels = metric.get("selector", {}).get("matchLabels", {})
    series = rule["name"]["matches"].strip("^$")
    query = rule["metricsQuery"].replace("<<.Series>>", series)
    return query.replace("<<.LabelMatchers>>", ",".join(f'{k}="{v}"' for k, v in labels.items()))


def test_the_adapter_query_returns_the_recorded_value(tmp_path: Path, promtool: str) -> None:
    """What prometheus-adapter sends for the HPA (its metric selector as label matchers)."""
    d = from_description("vllm", queue_target=2, kv_threshold=0.8)
    rule = {r["name"]["as"]: r for r in adapter_config(d)["externalRules"]}
    query = adapter_query(rule["servetune_requests_waiting_value"], hpa(d))
    seen = {f"vllm:num_requests_waiting{{{JOB}}}": "7x80"}
    promtool_test(promtool, d, tmp_path, seen, {query: 7})
    files = export(d, tmp_path / "out")
    assert files["adapter"].name == FILES["adapter"] == "prometheus-adapter.yaml"
    assert yaml.safe_load(files["adapter"].read_text()) == adapter_config(d)


def test_kv_threshold_for_an_engine_without_a_kv_gauge_is_refused() -> None:
    with pytest.raises(InputError, match="--kv-threshold: llamacpp exports no KV cache gauge"):
        from_description("llamacpp", queue_target=2, kv_threshold=0.8)
    with pytest.raises(InputError, match="--kv-threshold"):
        from_summary(summary({"requests_waiting_max": 2}, engine="llamacpp"), kv_threshold=0.8)


def test_another_engine_than_the_studys_is_refused(tmp_path: Path) -> None:
    s = summary({"requests_waiting_max": 3, "kv_cache_usage_max": 0.5}, engine="vllm")
    with pytest.raises(InputError, match="--engine: the study tuned vllm"):
        from_summary(s, engine="sglang")
    assert from_summary(s, engine="vllm").engine == "vllm"  # the same engine, said twice
    db = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(db) as store:
        store.update_study_meta("s", {"summary": s}, "tune")
    res = subprocess.run(
        [str(ROOT / ".venv/bin/servetune"), "monitor", "export", "--from-study", "s", "--db", db,
         "--engine", "sglang", "-o", str(tmp_path / "m")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "--engine" in res.stderr and "drop --engine" in res.stderr
