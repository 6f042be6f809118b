"""Prometheus recording and alert rules for one Deployment (seed 003 §11 for scaling,
the SLO file for the latency alerts). Alerts read the recorded series, so the
thresholds stay in one place. Every recorded series carries the Deployment's labels
(Deployment.labels) and every alert selects by them: two Deployments' rules loaded
together record distinct series."""

from __future__ import annotations

from typing import Any

from servetune.monitor.coverage import targets
from servetune.monitor.deployment import Deployment, plain
from servetune.monitor.promql import record_name, recorded, signals

SCALE_OUT = "scale-out"
SCALE_IN = "scale-in"
# An SLO breach alerts after 5 min: longer than the 2 min scale-out hold (seed 003 §11), so
# a burst the autoscaler absorbs does not alert as a breach.
SLO_HOLD = "5m"
# Without a measured capacity, the busiest per-replica running load of the last day (a day
# holds the daily peak), sampled every 5 min (a peak that shapes capacity lasts longer).
RUNNING_PEAK_WINDOW = "1d:5m"


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

    def r(signal: str) -> str:
        return recorded(signal, d.labels)

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
                f"{r('requests_waiting')} > {plain(d.queue_target)} * {r('replicas')}",
                d.scale_out_for,
                SCALE_OUT,
                f"pending requests above {plain(d.queue_target)} per replica",
            )
        )
    if "kv_cache_usage" in have and d.kv_threshold is not None:
        out.append(
            _alert(
                "ServetuneScaleOutKVCache",
                f"{r('kv_cache_usage')} > {plain(d.kv_threshold)}",
                d.scale_out_for,
                SCALE_OUT,
                f"KV cache above {d.kv_threshold:.0%} on some replica",
            )
        )
    return out


def running_low(d: Deployment) -> str:
    """Low running load, the half of seed 003 §11's "low load" the queue misses: a
    replica with every slot busy and no queue is at capacity, and scaling it in only
    brings the queue (and the scale-out) back. With the measured per-replica capacity R,
    the average under R/2: then N-1 replicas carry the load for any N >= 2 (N/2 <= N-1).
    Without one (a hand-described deployment), the per-replica running under half its own
    peak over the last day (RUNNING_PEAK_WINDOW), the busiest it was driven to — or
    nothing running: a Deployment idle all day has a peak of 0, and 0 < 0.5 x 0 is false."""
    running, replicas = recorded("requests_running", d.labels), recorded("replicas", d.labels)
    if d.running_target is not None:
        return f"{running} < {plain(d.running_target / 2)} * {replicas}"
    per = f"({running} / {replicas})"
    return f"({per} < 0.5 * max_over_time({per}[{RUNNING_PEAK_WINDOW}]) or {running} == 0)"


def scale_in_alert(d: Deployment, have: set[str]) -> dict[str, Any] | None:
    """Low load for the whole window: no queue, the running requests low (running_low),
    and the KV pool under half its threshold."""
    if "requests_waiting" not in have:
        return None
    expr = f"{recorded('requests_waiting', d.labels)} == 0"
    if "requests_running" in have:
        expr += f" and {running_low(d)}"
    if "kv_cache_usage" in have and d.kv_threshold is not None:
        expr += f" and {recorded('kv_cache_usage', d.labels)} < {plain(d.kv_threshold / 2)}"
    return _alert(
        "ServetuneScaleIn", expr, d.scale_in_after, SCALE_IN, f"low load for {d.scale_in_after}"
    )


def slo_alerts(d: Deployment, have: set[str]) -> list[dict[str, Any]]:
    """Every SLO target the engine's own metrics can watch (coverage.targets: latency
    statistics on its histograms, the failed-request ratio, KV headroom); the others are
    the export's printed notes."""
    return [
        _alert(
            t.alert,
            f"{recorded(t.signal, d.labels)} > {t.limit:g}",
            SLO_HOLD,
            "slo",
            f"{t.key} above the SLO's {t.shown}",
        )
        for t in targets(d.engine, d.slo)
        if t.signal is not None and t.signal in have
    ]


def rule_groups(d: Deployment) -> dict[str, Any]:
    """The rules file: one recording group, one alert group."""
    sig = signals(d.engine, d.job, d.rate_window, d.slo)
    have = set(sig)
    alerts = scale_out_alerts(d, have) + slo_alerts(d, have)
    if (down := scale_in_alert(d, have)) is not None:
        alerts.append(down)
    return {
        "groups": [
            {
                "name": f"servetune-{d.name}-recording",
                "interval": d.eval_interval,
                "rules": [
                    {"record": record_name(k), "expr": v, "labels": d.labels}
                    for k, v in sig.items()
                ],
            },
            {"name": f"servetune-{d.name}-alerts", "interval": d.eval_interval, "rules": alerts},
        ]
    }
