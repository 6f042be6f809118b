"""What the exported rules and manifests are about: the engine, its SLO, the replicas, and
the per-replica limits — taken from a tuned study's measured capacity, not from defaults.

Seed 003 §11's scale-out rules: P95 queue_wait > 300 ms for 2 min, or pending requests >
per-replica target queue × replicas, or KV cache utilisation > 85%; scale in only after
10-20 min of low load; never on GPU utilisation alone.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from servetune.engines.registry import ADAPTERS, adapter
from servetune.errors import InputError, closest
from servetune.monitor import coverage
from servetune.monitor.promql import kv_usage
from servetune.slo import SLO, parse_slo

QUEUE_WAIT_P95_S = 0.3  # seed 003 §11: P95 queue_wait > 300 ms
KV_CEILING = 0.85  # seed 003 §11: KV cache utilisation > 85%
# pending requests per replica: a replica runs hundreds at most, so a million is a typo
MAX_QUEUE_TARGET = 1_000_000
# The HPA reads an AverageValue target in thousandths (`Quantity.MilliValue()`,
# kubernetes pkg/controller/podautoscaler/replica_calculator.go): a smaller target is 0 to
# it, and plain() writes 1e-300 as "0".
MIN_QUEUE_TARGET = 0.001
MAX_REPLICAS = 2**31 - 1  # Kubernetes keeps maxReplicas / maxReplicaCount as an int32
SCALE_OUT_FOR = "2m"  # seed 003 §11: "for 2 minutes"
SCALE_IN_AFTER = "15m"  # seed 003 §11: 10-20 min of low load; the middle of that range
NO_RUNNING_CAPACITY = (
    "no running capacity measured: ServetuneScaleIn waits for per-replica running under "
    "half its peak of the last day, and the autoscalers get no running trigger "
    "(--from-study STUDY gives both the measured capacity)"
)


@dataclass(frozen=True)
class Deployment:
    """One served model: its engine, SLO, replica bounds and per-replica limits.
    `notes` say where each limit came from (shown in the export's README)."""

    engine: str
    queue_target: float  # pending requests one replica absorbs at its measured capacity
    kv_threshold: float | None  # 0..1; None: the engine exports no KV gauge
    slo: SLO | None = None
    # requests one replica runs at its measured capacity; None: not measured (by hand)
    running_target: float | None = None
    name: str = "llm"  # Kubernetes Deployment name
    namespace: str = "default"
    job: str = "servetune-engine"  # the Prometheus scrape job of the replicas
    min_replicas: int = 1
    max_replicas: int = 4
    queue_wait_p95_s: float = QUEUE_WAIT_P95_S
    scale_out_for: str = SCALE_OUT_FOR
    scale_in_after: str = SCALE_IN_AFTER
    # How often Prometheus scrapes the replicas: its default global scrape_interval is 1m
    # (prometheus.io/docs/prometheus/latest/configuration/configuration/).
    scrape_interval: str = "1m"
    rate_window: str = "4m"  # PromQL rate() window: rate_window_for(scrape_interval)
    eval_interval: str = "15s"
    prometheus_url: str = "http://prometheus.monitoring.svc:9090"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_scalable(self.engine)  # unknown or unscalable, before the KV check (its fix
        # names the queue)
        check_names(self.name, self.namespace, self.job)
        check_prometheus_url(self.prometheus_url)
        check_limits(self.queue_target, self.kv_threshold)
        if self.kv_threshold is not None and not has_kv_gauge(self.engine):
            raise InputError(
                "--kv-threshold",
                f"{self.engine} exports no KV cache gauge, so no rule could use it",
                f"drop --kv-threshold: {self.engine} scales on its pending queue",
            )
        if self.running_target is not None and self.running_target <= 0:
            raise InputError("running_target", f"{self.running_target} must be > 0")
        for name in ("scale_out_for", "scale_in_after", "rate_window", "eval_interval"):
            duration_s(getattr(self, name), "--" + name.replace("_", "-"))
        check_rate_window(self.rate_window, self.scrape_interval)
        if not 1 <= self.min_replicas <= self.max_replicas <= MAX_REPLICAS:
            raise InputError(
                "--replicas",
                f"min {self.min_replicas} / max {self.max_replicas}",
                f"give MIN:MAX with 1 <= MIN <= MAX <= {MAX_REPLICAS:,}, e.g. 1:4",
            )

    @property
    def labels(self) -> dict[str, str]:
        """The labels every recorded series of this Deployment carries, and the selector
        its alerts, HPA and adapter rules read them by: two Deployments' rules loaded into
        one Prometheus record the same series names, which without them collide (one
        Deployment's pending count read as the other's). A Deployment is its namespace
        and name in Kubernetes; both are DNS labels, so valid label values in PromQL and
        in an HPA's matchLabels."""
        return {"servetune_deployment": self.name, "servetune_namespace": self.namespace}


def short_name(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, distinct for distinct texts: a cut one ends in
    `-` and 8 hex digits of its sha256, so two long names sharing their first characters
    do not become one (a Grafana uid, a ScaledObject's name). Never ends in `-`, which no
    Kubernetes name or label value may (the texts are DNS labels: they do not either)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: limit - len(digest) - 1].rstrip('-')}-{digest}"


# Robust Perception, "What range should I use with rate()?" (Brian Brazil, a Prometheus
# maintainer): at least 4x the scrape interval. rate() needs two samples in its window;
# the newest scrape may not be ingested yet, and one scrape may fail, so 2x flaps to
# nothing at each missed or late scrape (at a 1m scrape, a [1m] window read 0). Grafana's
# $__rate_interval keeps the same floor (max(interval + scrape, 4 x scrape)).
RATE_WINDOW_SCRAPES = 4


def duration_text(seconds: int) -> str:
    """A Prometheus duration in its largest whole unit: 240 -> '4m', 90 -> '90s'."""
    for unit in ("h", "m"):
        if seconds and seconds % _UNIT_S[unit] == 0:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    return f"{seconds}s"


def rate_window_for(scrape_interval: str) -> str:
    """The shortest safe rate() window at this scrape interval (RATE_WINDOW_SCRAPES)."""
    return duration_text(
        RATE_WINDOW_SCRAPES * int(duration_s(scrape_interval, "--scrape-interval"))
    )


def check_rate_window(rate_window: str, scrape_interval: str) -> None:
    """A window too short for the scrape interval reads 0 between samples: the queue-wait
    and rate signals flap, and no alert on them holds for its `for:`."""
    scrape = duration_s(scrape_interval, "--scrape-interval")
    if scrape <= 0:
        raise InputError(
            "--scrape-interval", f"{scrape_interval!r} must be more than 0", "e.g. 30s"
        )
    if duration_s(rate_window, "--rate-window") < RATE_WINDOW_SCRAPES * scrape:
        raise InputError(
            "--rate-window",
            f"{rate_window} is under {RATE_WINDOW_SCRAPES}x the {scrape_interval} scrape "
            "interval: rate() would read 0 at a missed or late scrape",
            f"give --rate-window {rate_window_for(scrape_interval)} or more, or "
            "--scrape-interval as your Prometheus scrapes the replicas",
        )


def rate_note(d: Deployment) -> str:
    """What the rate window assumes, printed: the scrape interval is not in any file
    servetune reads, and Prometheus's default is the slowest common one."""
    return (
        f"rate window {d.rate_window}: at least {RATE_WINDOW_SCRAPES}x a {d.scrape_interval} "
        "scrape interval (give --scrape-interval if Prometheus scrapes the replicas at "
        "another one)"
    )


def scalable_engines() -> list[str]:
    """The engines whose /metrics carry a pending-requests gauge: every autoscaler and
    scale-out rule here needs one (seed 003 §11's pending_requests)."""
    return [e for e, mod in ADAPTERS.items() if "requests_waiting" in mod.METRICS]


def check_scalable(engine: str, flag: str = "--engine") -> None:
    """An engine with no pending-requests gauge gives the autoscalers nothing to scale on:
    KEDA's triggers would be empty (its schema refuses them) and no scale-out rule fires.
    Named here, before a file is written or a limit asked for."""
    ok = scalable_engines()
    if engine not in ADAPTERS:  # the engines it can scale, not every engine servetune knows
        near = closest(engine, ok)
        raise InputError(
            flag,
            f"unknown engine {engine!r}",
            f"did you mean {', '.join(near)}?" if near else f"one of {', '.join(ok)}",
        )
    if "requests_waiting" not in adapter(engine).METRICS:
        raise InputError(
            flag,
            f"{engine} exports no /metrics servetune can scale on (no pending-requests gauge)",
            f"use {', '.join(ok[:-1])} or {ok[-1]}",
        )


def check_prometheus_url(url: str) -> None:
    """KEDA's `serverAddress`: the Prometheus its triggers query. KEDA appends
    `/api/v1/query?...` to it, so it must be an http(s) URL with a host and no query; an
    empty one was written as `serverAddress: ''` and every trigger failed in the cluster."""
    fix = "give the Prometheus KEDA queries, e.g. http://prometheus.monitoring.svc:9090"
    try:  # a malformed IPv6 host ('http://[::1') is a ValueError here
        parts = urlsplit(url)
    except ValueError as exc:
        raise InputError("--prometheus-url", f"{url!r} is not a URL ({exc})", fix) from None
    if parts.scheme not in ("http", "https") or any(c.isspace() for c in url):
        raise InputError("--prometheus-url", f"{url!r} is not an http(s):// URL", fix)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if not parts.hostname or not port_ok:
        raise InputError("--prometheus-url", f"{url!r} has no valid host[:port]", fix)
    if parts.query or parts.fragment:
        raise InputError(
            "--prometheus-url", f"{url!r} has a query or fragment: KEDA appends its own", fix
        )


def check_limits(queue_target: float | None, kv_threshold: float | None) -> None:
    """The hand-given limits, before a study is read or a file written: NaN passes every
    comparison and inf or 1e300 cannot be written as a Kubernetes quantity, so the flag
    is named here rather than the manifest that fails its schema later."""
    if queue_target is not None and not MIN_QUEUE_TARGET <= queue_target <= MAX_QUEUE_TARGET:
        raise InputError(
            "--queue-target",
            f"{queue_target} must be at least {MIN_QUEUE_TARGET:g} and at most "
            f"{MAX_QUEUE_TARGET:,}",
            "give the pending requests one replica absorbs within the SLO, e.g. 8",
        )
    if kv_threshold is not None and not 0 < kv_threshold <= 1:
        raise InputError(
            "--kv-threshold", f"{kv_threshold} must be in (0, 1]", "a fraction, e.g. 0.85"
        )


def plain(value: float) -> str:
    """`value` as `:g` writes it (6 significant digits) but never in exponent form: a
    Kubernetes quantity has none, and `:g` writes 1e+06 for a million."""
    text = format(Decimal(f"{value:.6g}"), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# Kubernetes' DNS-1123 label, what a namespace and a Deployment's name must be
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_names(name: str, namespace: str, job: str) -> None:
    """The names the manifests and queries carry, checked before anything is written:
    Kubernetes refuses a name or namespace that is not a DNS-1123 label, and a job with a
    quote, backslash or newline would end the PromQL string `{job="..."}` early."""
    for flag, value in (("--name", name), ("--namespace", namespace)):
        if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
            raise InputError(
                flag,
                f"{value!r} is not a Kubernetes name",
                "use 1-63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit",
            )
    if not job:  # `job=""` matches no scraped series: every panel and rule would be empty
        raise InputError("--job", "is empty", "give the Prometheus scrape job of the replicas")
    if any(c in job for c in '"\\\n'):
        raise InputError(
            "--job",
            f"{job!r} cannot be a PromQL label value",
            "give the scrape job's name without quotes, backslashes or line breaks",
        )


_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def duration_s(text: str, field: str = "duration") -> float:
    """A Prometheus duration ('30s', '2m', '1h': the forms rules and KEDA both accept)."""
    m = re.fullmatch(r"(\d+)([smh])", text)
    if not m:
        raise InputError(field, f"{text!r} is not a duration", "e.g. 30s, 2m or 1h")
    return int(m[1]) * _UNIT_S[m[2]]


def has_kv_gauge(engine: str) -> bool:
    """Whether the engine's /metrics give its KV usage, as a gauge or as parts."""
    return kv_usage(engine, "job") is not None


def running_from_signals(signals: dict[str, Any]) -> tuple[float | None, list[str]]:
    """Requests one replica ran at the measured capacity (the scale-in rule's "low" is
    under half of it): the engine's running peak on a real run; on a simulated one, what
    was in flight up to the running slots (max_num_seqs)."""
    peak = signals.get("requests_running_max")
    if peak is None and signals.get("max_num_seqs") and signals.get("max_in_flight"):
        peak = min(signals["max_in_flight"], signals["max_num_seqs"])
    if not peak or peak <= 0:
        return None, []
    return float(peak), [f"running capacity {peak:g}/replica: peak running at measured capacity"]


def check_engine(study_engine: str | None, engine: str | None) -> str:
    """The study's engine, or --engine where the study names none. Another engine than
    the study's is refused: its queue and KV limits were measured on the study's engine,
    and another engine's capacity under the same load is not that."""
    if study_engine and engine and engine != study_engine:
        raise InputError(
            "--engine",
            f"the study tuned {study_engine}; its limits were measured there, not on {engine}",
            f"drop --engine, or describe the {engine} deployment by hand without "
            f"--from-study: --engine {engine} --queue-target N",
        )
    eng = study_engine or engine
    if not eng:
        raise InputError("--engine", "the study does not name its engine", "give --engine")
    return eng


def limits_from_signals(
    signals: dict[str, Any], engine: str, slo: SLO | None
) -> tuple[float | None, float | None, dict[str, str]]:
    """Per-replica queue target (None: not measured) and KV threshold from the point the
    tuner measured as the winner's capacity (its `signals`: the engine's own peaks on a
    real run, the scheduler's counters on a simulated one), each with why it is that
    (`{"queue_target": ..., "kv_threshold": ...}`, for the notes)."""
    why: dict[str, str] = {}
    waiting = signals.get("requests_waiting_max")
    if waiting is None and signals.get("max_in_flight") and signals.get("max_num_seqs"):
        # simulated: what was in flight beyond the running slots was queued
        waiting = max(0.0, signals["max_in_flight"] - signals["max_num_seqs"])
    queue: float | None = None
    if waiting is not None:
        # A replica that met the SLO with W queued absorbs W; a zero queue still leaves one.
        queue = float(max(1, math.ceil(waiting)))
        why["queue_target"] = f"peak queue {waiting:g} at measured capacity"
    kv: float | None = None
    if has_kv_gauge(engine):
        peak = signals.get("kv_cache_usage_max")
        if peak is None and signals.get("kv_blocks") and signals.get("max_kv_blocks_used"):
            peak = signals["max_kv_blocks_used"] / signals["kv_blocks"]
        caps = [(KV_CEILING, "seed 003 §11 ceiling 85%")]
        if slo is not None and slo.kv_cache_usage_max is not None:
            caps.append((slo.kv_cache_usage_max, "SLO kv_cache_usage_max"))
        if peak:
            caps.append((float(peak), "KV peak at measured capacity"))
        kv, why["kv_threshold"] = min(caps)
    return queue, kv, why


# limit -> (what the note calls it, the flag that gives it by hand)
LIMITS = {
    "queue_target": ("queue target", "--queue-target"),
    "kv_threshold": ("KV threshold", "--kv-threshold"),
}


def _shown(key: str, value: float) -> str:
    return f"{plain(value)}/replica" if key == "queue_target" else f"{value:.0%}"


def _note(key: str, given: float | None, measured: float | None, why: dict[str, str]) -> str:
    """Where a limit came from, the value the files use first: one given by hand says so
    and keeps the measured one beside it, for reference."""
    label, flag = LIMITS[key]
    if given is None:
        assert measured is not None
        return f"{label} {_shown(key, measured)}: {why[key]}"
    ref = (
        f"measured {_shown(key, measured)}: {why[key]}" if measured is not None else "none measured"
    )
    return f"{label} {_shown(key, given)}: given by hand ({flag} {plain(given)}); {ref}"


def from_summary(summary: dict[str, Any], engine: str | None = None, **kw: Any) -> Deployment:
    """A Deployment from `tune`'s study summary: the winner's engine, the study's SLO and
    the limits measured at the winner's best passing point (a limit given by hand wins)."""
    winner = summary.get("winner") or {}
    best = winner.get("best") or {}
    if not best:
        raise InputError(
            "--from-study", "the study has no winner with a passing point", "tune it first"
        )
    eng = check_engine((winner.get("config") or {}).get("engine"), engine)
    check_scalable(eng, "--engine" if engine else "--from-study")
    slo = kw.pop("slo", None)
    if slo is None and summary.get("slo"):
        slo = parse_slo(summary["slo"], "study slo")
    measured = dict(best.get("signals") or {})
    queue, kv, why = limits_from_signals(measured, eng, slo)
    notes: list[str] = []
    hand_queue, hand_kv = kw.pop("queue_target", None), kw.pop("kv_threshold", None)
    if hand_queue is not None or queue is not None:
        notes.append(_note("queue_target", hand_queue, queue, why))
        queue = queue if hand_queue is None else hand_queue
    if hand_kv is not None or kv is not None:
        notes.append(_note("kv_threshold", hand_kv, kv, why))
        kv = kv if hand_kv is None else hand_kv
    running, running_notes = running_from_signals(measured)
    notes += running_notes
    load = f"{best.get('load_kind')}={best.get('load')}"
    notes.append(f"measured at the winner's best passing point ({load})")
    if queue is None:
        raise InputError(
            "--from-study",
            "the winner's capacity point has no queue measurement",
            "give --queue-target N (pending requests one replica absorbs within the SLO)",
        )
    return Deployment(
        engine=eng,
        queue_target=queue,
        kv_threshold=kv,
        slo=slo,
        running_target=running,
        notes=(*notes, *coverage.notes(eng, slo)),
        **kw,
    )


def from_study(study: str, db: str | None = None, **kw: Any) -> Deployment:
    """Read the tuning study's summary from the store."""
    from servetune.accept.inputs import study_summary

    return from_summary(study_summary(db, study), **kw)


def from_description(engine: str, **kw: Any) -> Deployment:
    """A deployment described by hand: the limits must be given (no defaults stand in for
    a measurement)."""
    # a misspelt engine first (which limits must be given depends on it), named among
    # the engines it can scale, before asking for limits no rule could use
    check_scalable(engine)
    if kw.get("queue_target") is None:
        raise InputError(
            "--queue-target",
            "no measured capacity to take the per-replica queue from",
            "give --from-study STUDY (a tuned study) or --queue-target N",
        )
    kv = kw.pop("kv_threshold", None)
    if kv is None and has_kv_gauge(engine):
        raise InputError(
            "--kv-threshold",
            "no measured capacity to take the KV threshold from",
            "give --from-study STUDY or --kv-threshold 0.85",
        )
    notes = ["limits given by hand"]
    if "requests_running" in adapter(engine).METRICS:
        notes.append(NO_RUNNING_CAPACITY)
    notes += coverage.notes(engine, kw.get("slo"))
    return Deployment(engine=engine, kv_threshold=kv, notes=tuple(notes), **kw)
