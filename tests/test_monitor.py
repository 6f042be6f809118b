"""`monitor export` without an engine: limits from a tuned study's measured capacity, the
engines' real metric names in every query, promtool-valid rules, schema-valid dashboard
and autoscaling manifests, one-line errors. The live Prometheus check is in
test_monitor_prometheus.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servetune.cli.app import app
from servetune.engines.registry import adapter
from servetune.errors import InputError
from servetune.measure.result import PointResult
from servetune.monitor import Deployment, export, from_description, from_summary, schemas
from servetune.monitor.autoscale import hpa, keda_scaled_object
from servetune.monitor.dashboard import dashboard, queries
from servetune.monitor.writer import documents
from servetune.slo import parse_slo
from servetune.store import Store
from servetune.tune.trial import TrialResult, TrialStatus

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "sglang", "tgi", "llamacpp")
SLO = parse_slo({"ttft_ms": {"p95": 800, "p99": 2000}, "tpot_ms": {"p95": 40}})


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
    with pytest.raises(InputError, match="unknown engine"):
        from_description("vlm", queue_target=2, kv_threshold=0.8)
    with pytest.raises(InputError, match="--scale-out-for"):
        Deployment(engine="vllm", queue_target=1, kv_threshold=0.8, scale_out_for="2 min")


@pytest.mark.parametrize("engine", ENGINES)
def test_every_query_uses_the_engines_own_metric_names(engine: str, tmp_path: Path,
                                                       promtool: str) -> None:  # fmt: skip
    d = from_description(engine, queue_target=3, kv_threshold=0.8, slo=SLO)
    files = export(d, tmp_path)
    subprocess.run([promtool, "check", "rules", str(files["rules"])], check=True)
    mod = adapter(engine)
    known = set(mod.METRICS.values()) | {f + "_bucket" for f in mod.HISTOGRAMS.values()} | {"up"}
    rules = yaml.safe_load(files["rules"].read_text())["groups"]
    exprs = [r["expr"] for r in rules[0]["rules"]]
    exprs += queries(json.loads(files["dashboard"].read_text()))
    for expr in exprs:
        used = set(re.findall(r"([a-z_:]+)\{job=", expr))
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
