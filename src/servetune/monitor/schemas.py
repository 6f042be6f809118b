"""The published schemas the exports are checked against, as the subset servetune writes
(JSON Schema, checked with jsonschema). Facts taken from, not copied out of:

- Grafana dashboard JSON model: grafana.com/docs/grafana/latest/dashboards/build-dashboards/
  view-dashboard-json-model/ (title, uid, schemaVersion, panels with type/gridPos/targets,
  the 24-column grid, templating.list).
- Kubernetes autoscaling/v2 HorizontalPodAutoscaler: the API reference,
  kubernetes.io/docs/reference/kubernetes-api/workload-resources/horizontal-pod-autoscaler-v2/
  (scaleTargetRef, minReplicas >= 1, maxReplicas, metrics[].type External with
  metric.name and a MetricTarget of type Value|AverageValue|Utilization, behavior).
- KEDA ScaledObject CRD keda.sh/v1alpha1 (keda.sh/docs/2.16/reference/scaledobject-spec/
  and the Prometheus scaler page): scaleTargetRef.name, min/maxReplicaCount,
  pollingInterval, cooldownPeriod, advanced.horizontalPodAutoscalerConfig.behavior,
  triggers[] with type, metricType, metadata.serverAddress/query/threshold as strings.
- prometheus-adapter's config (github.com/kubernetes-sigs/prometheus-adapter docs/config.md,
  docs/externalmetrics.md): externalRules[] with seriesQuery, resources (overrides or
  namespaced), name.matches/as, metricsQuery.
"""

from __future__ import annotations

from typing import Any

_INT0 = {"type": "integer", "minimum": 0}
# A Kubernetes resource.Quantity in its plain decimal form.
_QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(m|k|M|G)?$"}
_DATASOURCE = {
    "type": "object",
    "properties": {"type": {"type": "string"}, "uid": {"type": "string"}},
}

GRAFANA_DASHBOARD: dict[str, Any] = {
    "type": "object",
    "required": ["title", "schemaVersion", "panels"],
    "properties": {
        "uid": {"type": "string", "maxLength": 40},
        "title": {"type": "string", "minLength": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "timezone": {"enum": ["browser", "utc", ""]},
        "editable": {"type": "boolean"},
        "schemaVersion": {"type": "integer", "minimum": 1},
        "version": _INT0,
        "refresh": {"type": ["string", "boolean"]},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {
                            "name": {"type": "string"},
                            "type": {
                                "enum": [
                                    "query",
                                    "adhoc",
                                    "constant",
                                    "datasource",
                                    "interval",
                                    "textbox",
                                    "custom",
                                ]
                            },
                        },
                    },
                }
            },
        },
        "panels": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "gridPos"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"type": "string", "minLength": 1},
                    "title": {"type": "string"},
                    "datasource": _DATASOURCE,
                    "gridPos": {
                        "type": "object",
                        "required": ["x", "y", "w", "h"],
                        "properties": {
                            "x": {"type": "integer", "minimum": 0, "maximum": 23},
                            "y": _INT0,
                            "w": {"type": "integer", "minimum": 1, "maximum": 24},
                            "h": {"type": "integer", "minimum": 1},
                        },
                    },
                    "targets": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["refId"],
                            "properties": {
                                "refId": {"type": "string"},
                                "expr": {"type": "string", "minLength": 1},
                                "datasource": _DATASOURCE,
                            },
                        },
                    },
                    "fieldConfig": {
                        "type": "object",
                        "properties": {
                            "defaults": {"type": "object"},
                            "overrides": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}

_SCALE_TARGET = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "name": {"type": "string", "minLength": 1},
    },
}
_RULES = {
    "type": "object",
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
            },
        },
    },
}
_BEHAVIOR = {"type": "object", "properties": {"scaleUp": _RULES, "scaleDown": _RULES}}
# A metav1.LabelSelector's matchLabels: each value a Kubernetes label value (at most 63
# characters, alphanumeric at both ends; kubernetes.io/docs/concepts/overview/
# working-with-objects/labels/#syntax-and-character-set).
_LABEL_VALUE = {
    "type": "string",
    "maxLength": 63,
    "pattern": "^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$",
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": {"type": "object", "additionalProperties": _LABEL_VALUE}},
}
_META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
}

HPA_V2: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "autoscaling/v2"},
        "kind": {"const": "HorizontalPodAutoscaler"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "maxReplicas"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {**_SCALE_TARGET, "required": ["kind", "name"]},
                "minReplicas": {"type": "integer", "minimum": 1},
                "maxReplicas": {"type": "integer", "minimum": 1},
                "behavior": _BEHAVIOR,
                "metrics": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {
                            "type": {
                                "enum": [
                                    "ContainerResource",
                                    "External",
                                    "Object",
                                    "Pods",
                                    "Resource",
                                ]
                            },
                            "external": {
                                "type": "object",
                                "required": ["metric", "target"],
                                "properties": {
                                    "metric": {
                                        "type": "object",
                                        "required": ["name"],
                                        "properties": {
                                            "name": {"type": "string"},
                                            "selector": _LABEL_SELECTOR,
                                        },
                                    },
                                    "target": {
                                        "type": "object",
                                        "required": ["type"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "type": {
                                                "enum": ["Utilization", "Value", "AverageValue"]
                                            },
                                            "value": _QUANTITY,
                                            "averageValue": _QUANTITY,
                                            "averageUtilization": {"type": "integer"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

KEDA_SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        # KEDA writes the name into label values of the HPA it makes (controllers/keda/
        # hpa.go: app.kubernetes.io/part-of, scaledobject.keda.sh/name)
        "metadata": {
            **_META,
            "properties": {**_META["properties"], "name": {**_LABEL_VALUE, "minLength": 1}},
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": _SCALE_TARGET,
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": _INT0,
                "advanced": {
                    "type": "object",
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {"behavior": _BEHAVIOR},
                        }
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": {
                                "type": "object",
                                # KEDA reads every trigger metadata value as a string
                                "additionalProperties": {"type": "string"},
                                "required": ["serverAddress", "query", "threshold"],
                            },
                        },
                    },
                },
            },
        },
    },
}


PROMETHEUS_ADAPTER: dict[str, Any] = {
    "type": "object",
    "required": ["externalRules"],
    "properties": {
        "externalRules": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["seriesQuery", "metricsQuery", "name"],
                "additionalProperties": False,
                "properties": {
                    "seriesQuery": {"type": "string", "minLength": 1},
                    "seriesFilters": {"type": "array"},
                    "resources": {
                        "type": "object",
                        "properties": {
                            "namespaced": {"type": "boolean"},
                            "overrides": {"type": "object"},
                            "template": {"type": "string"},
                        },
                    },
                    "name": {
                        "type": "object",
                        "required": ["matches"],
                        "properties": {
                            "matches": {"type": "string"},
                            "as": {"type": "string"},
                        },
                    },
                    "metricsQuery": {"type": "string", "minLength": 1},
                },
            },
        }
    },
}


def problems(doc: Any, schema: dict[str, Any]) -> list[str]:
    """Every schema violation, as 'path: message' (empty when valid)."""
    from jsonschema import Draft202012Validator

    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '.'}: {e.message}"
        for e in sorted(Draft202012Validator(schema).iter_errors(doc), key=str)
    ]
