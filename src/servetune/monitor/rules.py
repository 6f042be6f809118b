"""Prometheus recording and alert rules for one Deployment (seed 003 §11 for scaling,
the SLO file for the latency alerts). Alerts read the recorded series, so the
thresholds stay in one place."""

from __future__ import annotations

from typing import Any

from servetune.monitor.deployment import Deployment
from servetune.monitor.promql import record_name, signals

SCALE_OUT = "scale-out"
SCALE_IN = "scale-in"


def _alert(name: str, expr: str, hold: str, action: str, summary: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": hold,
        "labels": {"severity": "warning", "servetune_action": action},
        "annotations": {"summary": summary},
    }


def scale_out_alerts(d: Deployment, have: set[str]) -> list[dict[str, Any]]:
    """Seed 003 §11's three scale-out conditions, each its own alert (one may hold while
    the others lack data, e.g. llama.cpp exports no queue-time histogram)."""
    r = record_name
    out = []
    if "queue_wait_seconds:p95" in have:
        out.append(
            _alert(
                "ServetuneScaleOutQueueWait",
                f"{r('queue_wait_seconds:p95')} > {d.queue_wait_p95_s:g}",
                d.scale_out_for,
                SCALE_OUT,
                f"P95 queue wait above {d.queue_wait_p95_s * 1000:g} ms for {d.scale_out_for}",
            )
        )
    if "requests_waiting" in have:
        out.append(
            _alert(
                "ServetuneScaleOutPending",
                f"{r('requests_waiting')} > {d.queue_target:g} * {r('replicas')}",
                d.scale_out_for,
                SCALE_OUT,
                f"pending requests above {d.queue_target:g} per replica",
            )
        )
    if "kv_cache_usage" in have and d.kv_threshold is not None:
        out.append(
            _alert(
                "ServetuneScaleOutKVCache",
                f"{r('kv_cache_usage')} > {d.kv_threshold:g}",
                d.scale_out_for,
                SCALE_OUT,
                f"KV cache above {d.kv_threshold:.0%} on some replica",
            )
        )
    return out


def scale_in_alert(d: Deployment, have: set[str]) -> dict[str, Any] | None:
    """Low load: no queue (and the KV pool under half its threshold) for the whole window."""
    if "requests_waiting" not in have:
        return None
    expr = f"{record_name('requests_waiting')} == 0"
    if "kv_cache_usage" in have and d.kv_threshold is not None:
        expr += f" and {record_name('kv_cache_usage')} < {d.kv_threshold / 2:g}"
    return _alert(
        "ServetuneScaleIn", expr, d.scale_in_after, SCALE_IN, f"low load for {d.scale_in_after}"
    )


def slo_alerts(d: Deployment, have: set[str]) -> list[dict[str, Any]]:
    """The SLO file's P95/P99 TTFT and P95 TPOT targets, on the engine's own histograms."""
    if d.slo is None:
        return []
    out = []
    for metric, stat in (("ttft", "p95"), ("ttft", "p99"), ("tpot", "p95")):
        targets = getattr(d.slo, f"{metric}_ms")
        ms = getattr(targets, stat) if targets is not None else None
        sig = f"{metric}_seconds:{stat}"
        if ms is None or sig not in have:
            continue
        out.append(
            _alert(
                f"ServetuneSLO{metric.upper()}{stat.upper()}",
                f"{record_name(sig)} > {ms / 1000:g}",
                "5m",
                "slo",
                f"{stat.upper()} {metric.upper()} above the SLO's {ms:g} ms",
            )
        )
    return out


def rule_groups(d: Deployment) -> dict[str, Any]:
    """The rules file: one recording group, one alert group."""
    sig = signals(d.engine, d.job, d.rate_window)
    have = set(sig)
    alerts = scale_out_alerts(d, have) + slo_alerts(d, have)
    if (down := scale_in_alert(d, have)) is not None:
        alerts.append(down)
    return {
        "groups": [
            {
                "name": f"servetune-{d.name}-recording",
                "interval": d.eval_interval,
                "rules": [{"record": record_name(k), "expr": v} for k, v in sig.items()],
            },
            {"name": f"servetune-{d.name}-alerts", "interval": d.eval_interval, "rules": alerts},
        ]
    }
