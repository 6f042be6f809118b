"""SLO: latency percentile targets, an error-rate ceiling, and the per-request thresholds
that define goodput.

Example (seed 003 §1: P95 TTFT < 800 ms, P99 TTFT < 2 s, P95 TPOT < 40 ms/token, 5xx < 0.1%):

    ttft_ms: {p95: 800, p99: 2000}
    tpot_ms: {p95: 40}
    error_rate: 0.001
    kv_cache_usage_max: 0.9     # memory headroom: the KV pool never more than 90% full

Each latency metric given needs at least one target: `ttft_ms: {}` is refused (it bounded
nothing, and every point "met the SLO").

A request "meets the SLO" (goodput, attainment) when it completed without error and its
TTFT, TPOT and E2E are each at or below that metric's per-request threshold: the
`goodput` entry when given, else the metric's tightest (smallest) target. Errors and
timeouts are misses (field notes: GuideLLM #1085 counts them so; vLLM ignores them).

`kv_cache_usage_max` is the memory-headroom target (seed 003 §15 "stay one step
back from the OOM edge"): the peak fraction of the KV pool in use during the run (the
engine's own gauge: vLLM `kv_cache_usage_perc`, SGLang `token_usage`; the simulator's
peak blocks) must stay at or below it. A pool that runs full is where preemption and
queueing cliffs start, so a config that only passes at 100% has no headroom left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servetune.errors import InputError, from_validation_error, refuse_bool
from servetune.yamlfile import load_yaml

Stat = Literal["p50", "p90", "p95", "p99", "mean", "max"]
SLO_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


class _Strict(BaseModel):
    """Every target finite (no .inf/.nan), no unknown keys, no true/false for a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool(cls, data: Any) -> Any:
        return refuse_bool(cls.model_fields, data)


class Targets(_Strict):
    """Upper bounds on statistics of one latency metric (ms)."""

    p50: float | None = Field(None, gt=0)
    p90: float | None = Field(None, gt=0)
    p95: float | None = Field(None, gt=0)
    p99: float | None = Field(None, gt=0)
    mean: float | None = Field(None, gt=0)
    max: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_target(self) -> Targets:
        """`ttft_ms: {}` sets no bound: accepted, it read as an SLO that every point met."""
        if not self.items():
            raise ValueError("has no target (e.g. p95: 800)")
        return self

    def items(self) -> list[tuple[str, float]]:
        return [(k, v) for k, v in self.model_dump().items() if v is not None]


class PerRequest(_Strict):
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2e_ms: float | None = Field(None, gt=0)


class SLO(_Strict):
    ttft_ms: Targets | None = None
    tpot_ms: Targets | None = None
    itl_ms: Targets | None = None
    e2e_ms: Targets | None = None
    error_rate: float | None = Field(None, ge=0, le=1, description="Max failed fraction.")
    goodput: PerRequest | None = None
    kv_cache_usage_max: float | None = Field(
        None, gt=0, le=1, description="Memory headroom: max peak fraction of the KV pool used."
    )

    @model_validator(mode="after")
    def _something(self) -> SLO:
        run_level = (self.error_rate, self.kv_cache_usage_max)
        if not any(getattr(self, m) for m in SLO_METRICS) and all(v is None for v in run_level):
            raise ValueError("an SLO needs at least one target (ttft_ms, tpot_ms, e2e_ms, ...)")
        return self

    def per_request(self) -> dict[str, float]:
        """Thresholds a single request must meet to count toward goodput."""
        out: dict[str, float] = {}
        for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
            explicit = getattr(self.goodput, m) if self.goodput else None
            t: Targets | None = getattr(self, m)
            if explicit is not None:
                out[m] = explicit
            elif t is not None and t.items():
                out[m] = min(v for _, v in t.items())
        return out


def parse_slo(data: Any, source: str = "slo") -> SLO:
    if not isinstance(data, dict):
        raise InputError(source, "must be a mapping like {ttft_ms: {p95: 800}}")
    try:
        return SLO.model_validate(data)
    except ValidationError as exc:
        from servetune.filekinds import check_kind

        check_kind(data, "SLO", source)
        raise from_validation_error(exc, source, model=SLO) from None


def load_slo(path: str | Path) -> SLO:
    return parse_slo(load_yaml(path, "--slo"), "slo")


class HostRule(_Strict):
    """An SLO derived from the machine a study runs on: P95 TTFT at most `ttft_x` times,
    and P95 TPOT at most `tpot_x` times, the P95 of an idle probe (the same requests sent
    one at a time). A fixed target written on one machine fails every config on a slower
    or busier one; a multiple of this host's own idle latency asks the same of every host:
    "under load, stay within k x what the host does idle". P95 against P95 compares like
    with like, so a noisy host's spikes widen the target instead of failing every config."""

    ttft_x: float = Field(4.0, gt=1, description="P95 TTFT target / idle P95 TTFT.")
    tpot_x: float = Field(3.0, gt=1, description="P95 TPOT target / idle P95 TPOT.")


def derive_slo(base: SLO, rule: HostRule, ttft_ms: float | None, tpot_ms: float | None) -> SLO:
    """`base` with its TTFT and TPOT targets replaced by P95 <= x * the probe's P95
    (whole ms), and their goodput thresholds with them; a metric the probe did not
    measure (None) keeps `base`'s targets. Pure."""
    data = base.model_dump(exclude_none=True)
    goodput = dict(data.pop("goodput", {}))
    for metric, probe, x in (("ttft_ms", ttft_ms, rule.ttft_x), ("tpot_ms", tpot_ms, rule.tpot_x)):
        if probe is None or probe <= 0:
            continue
        data[metric] = {"p95": max(1.0, round(x * probe))}
        goodput.pop(metric, None)
    if goodput:
        data["goodput"] = goodput
    return SLO.model_validate(data)
