"""Which of the SLO file's targets the exported rules alert on for one engine, and why
each other one cannot be — so `monitor export` never drops a target silently (seed 003
§1 lists the targets, §15 asks for them monitored): every target is an alert on the
engine's own metrics, or a printed note naming it and the reason."""

from __future__ import annotations

from dataclasses import dataclass

from servetune.monitor.promql import LATENCY_SIGNALS, signals, slo_family
from servetune.slo import SLO

# Why an engine's /metrics gives no failed-request ratio (promql.FAILED_REQUESTS has the
# engines that do).
_NO_FAILURE_COUNTER = {
    "sglang": "SGLang's request counters (sglang:num_requests_total, "
    "sglang:num_aborted_requests_total) do not tell failures from client cancellations",
    "llamacpp": "llama.cpp's /metrics counts no requests by outcome",
}
_NO_MAX = "a histogram keeps bucket counts, not the largest value"
_NO_GOODPUT = (
    "goodput counts requests within every threshold at once; the engine's histograms are "
    "per metric and cannot join one request's TTFT, TPOT and E2E"
)


@dataclass(frozen=True)
class Target:
    """One SLO target: the alert that watches it, or why the engine cannot give one."""

    key: str  # as the SLO file names it: "ttft_ms.p95", "error_rate"
    shown: str  # its value as the user wrote it: "800 ms", "0.1%"
    limit: float  # in the recorded signal's unit: seconds, or a 0..1 fraction
    alert: str  # the alert's name
    signal: str | None  # the recorded signal the alert reads; None: no rule
    why: str = ""  # when signal is None


def _latency(engine: str, slo: SLO, have: set[str]) -> list[Target]:
    out = []
    for metric, name in LATENCY_SIGNALS.items():
        targets = getattr(slo, metric)
        if targets is None:
            continue
        for stat, ms in targets.items():
            sig = f"{name}:{stat}"
            label = metric.removesuffix("_ms").upper()
            if sig in have:
                why = ""
            elif slo_family(engine, metric) is None:
                why = f"{engine} exports no {label} histogram"
            else:
                why = _NO_MAX
            out.append(
                Target(
                    key=f"{metric}.{stat}",
                    shown=f"{ms:g} ms",
                    limit=ms / 1000,
                    alert=f"ServetuneSLO{label}{stat.upper()}",
                    signal=sig if sig in have else None,
                    why=why,
                )
            )
    return out


def _fraction(key: str, value: float, alert: str, sig: str, have: set[str], why: str) -> Target:
    return Target(
        key=key,
        shown=f"{value * 100:g}%",
        limit=value,
        alert=alert,
        signal=sig if sig in have else None,
        why="" if sig in have else why,
    )


def targets(engine: str, slo: SLO | None) -> list[Target]:
    """Every target of `slo` with its alert, or the reason it has none."""
    if slo is None:
        return []
    have = set(signals(engine, "job", "1m", slo))
    out = _latency(engine, slo, have)
    if slo.error_rate is not None:
        why = _NO_FAILURE_COUNTER.get(engine, f"{engine} exports no failed-request counter")
        out.append(
            _fraction(
                "error_rate", slo.error_rate, "ServetuneSLOErrorRate", "request_errors:ratio",
                have, why,
            )
        )  # fmt: skip
    if slo.kv_cache_usage_max is not None:
        out.append(
            _fraction(
                "kv_cache_usage_max", slo.kv_cache_usage_max, "ServetuneSLOKVCache",
                "kv_cache_usage", have, f"{engine} exports no KV cache gauge",
            )
        )  # fmt: skip
    return out


def notes(engine: str, slo: SLO | None) -> list[str]:
    """One printed line per SLO target that gets no alert, naming it and why."""
    out = [
        f"SLO {t.key} {t.shown}: no rule ({t.why})"
        for t in targets(engine, slo)
        if t.signal is None
    ]
    if slo is not None and slo.goodput is not None:
        out.append(f"SLO goodput thresholds: no rule ({_NO_GOODPUT})")
    return out
