"""A Grafana dashboard for one Deployment: the engine's own metrics (the same PromQL the
recording rules use), the SLO and scaling thresholds drawn on the panels.

Layout follows Grafana's dashboard JSON model (grafana.com/docs/grafana/latest/dashboards/
build-dashboards/view-dashboard-json-model/): a 24-column grid, `timeseries` panels with
Prometheus `targets`, a `datasource` template variable so the import asks which Prometheus.
"""

from __future__ import annotations

from typing import Any

from servetune.monitor.coverage import targets
from servetune.monitor.deployment import Deployment, short_name
from servetune.monitor.promql import LATENCY_SIGNALS, signals

SCHEMA_VERSION = 39  # Grafana 11's dashboard schemaVersion
# Grafana refuses a dashboard uid over 40 characters (its dashboard JSON model: "uid ...
# can have a maximum length of 40 characters").
MAX_UID = 40
DS = {"type": "prometheus", "uid": "${datasource}"}

# signal -> (title, unit, threshold from the deployment or None)
_PANELS: tuple[tuple[str, str, str], ...] = (
    ("requests_running", "Running requests", "short"),
    ("requests_waiting", "Waiting requests (pending)", "short"),
    ("kv_cache_usage", "KV cache usage", "percentunit"),
    ("queue_wait_seconds:p95", "P95 queue wait", "s"),
    ("ttft_seconds:p95", "P95 TTFT", "s"),
    ("ttft_seconds:p99", "P99 TTFT", "s"),
    ("tpot_seconds:p95", "P95 TPOT", "s"),
    ("generation_tokens:rate", "Generated tokens/s", "short"),
    ("requests_finished:rate", "Finished requests/s", "reqps"),
    ("request_errors:ratio", "Failed requests (share)", "percentunit"),
    ("replicas", "Replicas scraped", "short"),
)


def slo_panel(signal: str) -> tuple[str, str, str]:
    """The panel of an SLO latency statistic the fixed panels do not show
    (`ttft_seconds:p50` -> "P50 TTFT", `e2e_seconds:mean` -> "Mean E2E"): its alert has a
    line to be read against."""
    name, _, stat = signal.partition(":")
    metric = next((m for m, n in LATENCY_SIGNALS.items() if n == name), name)
    label = metric.removesuffix("_ms").upper()
    return signal, f"{'Mean' if stat == 'mean' else stat.upper()} {label} (SLO)", "s"


def panels(d: Deployment, sig: dict[str, str]) -> list[tuple[str, str, str]]:
    """(signal, title, unit) of each panel: the fixed ones the engine can give, then one
    per SLO target with an alert that no fixed panel shows."""
    shown = [(s, t, u) for s, t, u in _PANELS if s in sig]
    have = {s for s, _, _ in shown}
    for t in targets(d.engine, d.slo):
        if t.signal is not None and t.signal not in have and t.signal in sig:
            shown.append(slo_panel(t.signal))
            have.add(t.signal)
    return shown


def thresholds(d: Deployment) -> dict[str, float]:
    """The line each panel draws: where the scaling alerts and the SLO's alerts trip (the
    scale-out KV threshold over the SLO's looser KV headroom)."""
    out: dict[str, float] = {"queue_wait_seconds:p95": d.queue_wait_p95_s}
    if d.kv_threshold is not None:
        out["kv_cache_usage"] = d.kv_threshold
    for t in targets(d.engine, d.slo):
        if t.signal is not None:
            out.setdefault(t.signal, t.limit)
    return out


def _panel(i: int, title: str, unit: str, expr: str, line: float | None) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if line is not None:
        steps.append({"color": "red", "value": line})
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "datasource": DS,
        "gridPos": {"x": (i % 2) * 12, "y": (i // 2) * 8, "w": 12, "h": 8},
        "targets": [{"refId": "A", "datasource": DS, "expr": expr, "legendFormat": title}],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "custom": {"thresholdsStyle": {"mode": "line" if line is not None else "off"}},
            },
            "overrides": [],
        },
        "options": {},
    }


def dashboard_uid(d: Deployment) -> str:
    """`servetune-<name>`, cut with a hash of the whole past MAX_UID (short_name): cut
    bare, two long names sharing their first 30 characters got one uid, and importing the
    second dashboard replaced the first."""
    return short_name(f"servetune-{d.name}", MAX_UID)


def dashboard(d: Deployment) -> dict[str, Any]:
    sig = signals(d.engine, d.job, d.rate_window, d.slo)
    lines = thresholds(d)
    shown = panels(d, sig)
    return {
        "uid": dashboard_uid(d),
        "title": f"servetune · {d.name} ({d.engine})",
        "tags": ["servetune", d.engine],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                }
            ]
        },
        "annotations": {"list": []},
        "panels": [_panel(i, t, u, sig[s], lines.get(s)) for i, (s, t, u) in enumerate(shown)],
    }


def queries(dash: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard (what the live check runs)."""
    return [t["expr"] for p in dash.get("panels", []) for t in p.get("targets", [])]
