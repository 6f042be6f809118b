"""KEDA ScaledObject and autoscaling/v2 HPA manifests for seed 003 §11: scale out on
P95 queue wait, pending requests per replica, or KV usage; scale in only after the low
load has lasted; never on GPU utilisation.

HPA arithmetic (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/):
desired = ceil(replicas × value / target) for a Value target, ceil(value / target) for an
AverageValue target — so "pending > target × replicas" is an AverageValue target of the
per-replica queue on the summed pending count. The scale-up stabilisation window holds a
recommendation for the seed's 2 minutes; the scale-down one for its 10-20 minutes.

Where the replicas' running capacity R was measured, a running trigger (AverageValue R on
the summed running count) holds the replicas while their slots are full: desired =
ceil(running / R) stays N at N × R running, so a steady load with every slot busy and no
queue does not scale in and back out (seed 003 §11: scale in only after low load). Past R
per replica (slots beyond what ran at the measured capacity) it asks for one more: that is
past the load the tune proved within the SLO.

The HPA reads External metrics, which prometheus-adapter serves only through an
`externalRules` entry per metric (it reads no rule files): `adapter_config` writes those,
from the same names the HPA uses. Each HPA metric selects its Deployment's recorded
series by their labels (Deployment.labels), which the adapter passes on as label
matchers: another Deployment's series of the same name are not read.
"""

from __future__ import annotations

from typing import Any

from servetune.monitor.deployment import Deployment, duration_s, plain, short_name
from servetune.monitor.promql import external_name, record_name, recorded, signals

# KEDA copies a ScaledObject's name into label values of the HPA it makes
# (`app.kubernetes.io/part-of`, and `scaledobject.keda.sh/name` on each External metric:
# kedacore/keda controllers/keda/hpa.go), and a label value is at most 63 characters.
MAX_OBJECT_NAME = 63

# trigger name -> the recorded signal it reads (the HPA's External metric is its series)
TRIGGER_SIGNALS = {
    "queue_wait_p95": "queue_wait_seconds:p95",
    "pending_requests": "requests_waiting",
    "kv_cache_usage": "kv_cache_usage",
    "running_requests": "requests_running",
}


def _triggers(d: Deployment) -> list[tuple[str, str, str, str]]:
    """(signal, query, metric type, threshold) for each seed 003 §11 condition available."""
    sig = signals(d.engine, d.job, d.rate_window)
    out = []
    if "queue_wait_seconds:p95" in sig:
        out.append(("queue_wait_p95", sig["queue_wait_seconds:p95"], "Value", d.queue_wait_p95_s))
    if "requests_waiting" in sig:
        out.append(("pending_requests", sig["requests_waiting"], "AverageValue", d.queue_target))
    if "kv_cache_usage" in sig and d.kv_threshold is not None:
        out.append(("kv_cache_usage", sig["kv_cache_usage"], "Value", d.kv_threshold))
    if "requests_running" in sig and d.running_target is not None:
        out.append(("running_requests", sig["requests_running"], "AverageValue", d.running_target))
    return [(n, q, t, plain(v)) for n, q, t, v in out]  # a quantity: no exponent form


def behavior(d: Deployment) -> dict[str, Any]:
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": int(duration_s(d.scale_out_for)),
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": int(duration_s(d.scale_in_after)),
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
        },
    }


def object_name(d: Deployment) -> str:
    """The ScaledObject's and HPA's name: `<name>-servetune`, cut with a hash of the whole
    (short_name) past MAX_OBJECT_NAME, so a 54-63 character Deployment name still gives
    KEDA label values it can write, and two such names stay two objects."""
    return short_name(f"{d.name}-servetune", MAX_OBJECT_NAME)


def keda_scaled_object(d: Deployment) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": object_name(d), "namespace": d.namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": d.name},
            "minReplicaCount": d.min_replicas,
            "maxReplicaCount": d.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": int(duration_s(d.scale_in_after)),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(d)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "name": name,
                    "metricType": kind,
                    "metadata": {
                        "serverAddress": d.prometheus_url,
                        "query": query,
                        "threshold": value,
                    },
                }
                for name, query, kind, value in _triggers(d)
            ],
        },
    }


def hpa(d: Deployment) -> dict[str, Any]:
    """The same rules as a plain HPA over External metrics (served by prometheus-adapter,
    configured by `adapter_config`, from the recorded servetune:<signal> series), each
    selecting this Deployment's series by its labels."""
    metrics = []
    for name, _q, kind, value in _triggers(d):
        target: dict[str, Any] = {"type": kind}
        target["value" if kind == "Value" else "averageValue"] = value
        metrics.append(
            {
                "type": "External",
                "external": {
                    "metric": {
                        "name": external_name(TRIGGER_SIGNALS[name]),
                        "selector": {"matchLabels": d.labels},
                    },
                    "target": target,
                },
            }
        )
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": object_name(d), "namespace": d.namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": d.name},
            "minReplicas": d.min_replicas,
            "maxReplicas": d.max_replicas,
            "metrics": metrics,
            "behavior": behavior(d),
        },
    }


def adapter_config(d: Deployment) -> dict[str, Any]:
    """prometheus-adapter's `externalRules` serving each recorded series the HPA reads as
    its External metric (github.com/kubernetes-sigs/prometheus-adapter docs/config.md and
    docs/externalmetrics.md). `seriesQuery` finds this Deployment's recorded series; the
    HPA metric's selector (its labels) reaches `<<.LabelMatchers>>`, so the query reads
    them and no other Deployment's. `namespaced: false`: the recorded series carry no
    `namespace` label (they sum over the scrape job), and the adapter would otherwise add
    the HPA's namespace as a label matcher and match nothing. max() returns the one
    recorded series without its labels."""
    rules = []
    for name, _q, _kind, _value in _triggers(d):
        series = record_name(TRIGGER_SIGNALS[name])
        rules.append(
            {
                "seriesQuery": recorded(TRIGGER_SIGNALS[name], d.labels),
                "resources": {"namespaced": False},
                "name": {"matches": f"^{series}$", "as": external_name(TRIGGER_SIGNALS[name])},
                "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>})",
            }
        )
    return {"externalRules": rules}
