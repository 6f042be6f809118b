"""`runs compare`: what differs between runs (engine knobs first, then the context:
model, hardware, software, workload, load), and how every metric moved against the
first run. Seed 000 §8 / seed 003 "change one thing at a time": more than one differing
factor gets a warning, because the deltas cannot then be attributed to any one of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.status import RunStatus
from servetune.store.runinfo import RunInfo

# (label, metrics path, which way is better)
METRICS: tuple[tuple[str, str, str | None], ...] = (
    ("TTFT P50 ms", "ttft_ms.p50", "lower"),
    ("TTFT P95 ms", "ttft_ms.p95", "lower"),
    ("TTFT P99 ms", "ttft_ms.p99", "lower"),
    ("TPOT P50 ms", "tpot_ms.p50", "lower"),
    ("TPOT P95 ms", "tpot_ms.p95", "lower"),
    ("TPOT P99 ms", "tpot_ms.p99", "lower"),
    ("ITL P99 ms", "itl_ms.p99", "lower"),
    ("E2E P50 ms", "e2e_ms.p50", "lower"),
    ("E2E P99 ms", "e2e_ms.p99", "lower"),
    ("output tok/s", "output_tok_s", "higher"),
    ("total tok/s", "total_tok_s", "higher"),
    ("req/s", "req_s", "higher"),
    ("goodput req/s", "goodput_req_s", "higher"),
    ("SLO attainment", "slo_attainment", "higher"),
    ("error rate", "error_rate", "lower"),
    ("completed", "completed", None),
    ("failed", "failed", "lower"),
)


@dataclass
class Factor:
    name: str
    kind: str  # knob | context
    values: list[Any]

    @property
    def differs(self) -> bool:
        return len({_key(v) for v in self.values}) > 1


@dataclass
class MetricRow:
    label: str
    path: str
    better: str | None
    values: list[float | None]
    deltas: list[float | None]  # vs the first run, absolute
    pcts: list[float | None]  # vs the first run, percent
    # a percentile's sample sizes, its own distribution's count (an ITL P99 rests on the
    # token gaps, not on the completed requests)
    counts: list[float | None] = field(default_factory=list)

    def verdict(self, i: int) -> str | None:
        """better | worse | None for run i against the first."""
        d = self.deltas[i]
        if d is None or d == 0 or self.better is None:
            return None
        return "better" if (d < 0) == (self.better == "lower") else "worse"


@dataclass
class Comparison:
    run_ids: list[str]
    factors: list[Factor]
    metrics: list[MetricRow]
    warnings: list[str] = field(default_factory=list)

    @property
    def differing(self) -> list[Factor]:
        return [f for f in self.factors if f.differs]

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.run_ids,
            "differing": [f.name for f in self.differing],
            "differing_knobs": [f.name for f in self.differing if f.kind == "knob"],
            "factors": {f.name: f.values for f in self.factors},
            "metrics": [
                {
                    "metric": r.label,
                    "path": r.path,
                    "values": r.values,
                    "delta": r.deltas,
                    "pct": r.pcts,
                    "n": r.counts or None,
                }
                for r in self.metrics
            ],
            "warnings": self.warnings,
        }


def knob_defaults() -> dict[str, Any]:
    """Every engine knob's default: a knob a run did not record had this value."""
    return {k: f.default for k, f in EngineConfig.model_fields.items()}


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _get(d: Mapping[str, Any] | None, path: str) -> Any:
    cur: Any = d or {}
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _context(info: RunInfo, simulated: bool = False) -> dict[str, Any]:
    """What a run was measured on, besides its knobs. `simulated` (every run compared is
    simulated): the servetune build too, since there it is the engine: two builds'
    simulators may price one config differently (servetune.build)."""
    hw = info.meta.get("hardware") or {}
    sw = info.meta.get("software") or {}
    ctx: dict[str, Any] = {
        "model": info.model,
        "backend": info.backend,
        "hardware.gpu": hw.get("gpu"),
        "hardware.gpu_count": hw.get("gpu_count") or info.gpu_count,
        "hardware.cpu": hw.get("cpu"),
        "software.engine_version": sw.get("engine_version") or info.engine_version,
        # the server measured and the SLO judged: two mocks (or two deployments) at one
        # load differ in everything, and an SLO changes goodput and pass/fail
        "target.url": info.target.url,
        "target.api": info.target.api,
        "slo": _key(info.part("slo")) if info.part("slo") else None,
    }
    if simulated:
        ctx["software.servetune_build"] = sw.get("servetune_build")
    for k, v in info.load.model_dump().items():
        ctx[f"load.{k}"] = v
    for k, v in (info.part("workload") or {}).items():
        if k != "arrival":  # the load, compared above
            ctx[f"workload.{k}"] = v
    return ctx


def compare_runs(
    infos: Sequence[RunInfo], metrics: Sequence[Mapping[str, Any] | None]
) -> Comparison:
    """Factors (knobs, then context) and metric deltas vs the first run. `metrics` are
    the runs' metrics dicts (computed from records for runs that never finished)."""
    defaults = knob_defaults()
    cfgs = [{**defaults, **i.engine_config} for i in infos]
    knob_names = list(dict.fromkeys(k for c in cfgs for k in c))
    factors = [Factor(k, "knob", [c.get(k) for c in cfgs]) for k in knob_names]
    simulated = all(i.backend == "sim" for i in infos)
    ctxs = [_context(i, simulated) for i in infos]
    ctx_names = list(dict.fromkeys(k for c in ctxs for k in c))
    factors += [Factor(k, "context", [c.get(k) for c in ctxs]) for k in ctx_names]

    rows = []
    for label, path, better in METRICS:
        vals = [_num(_get(m, path)) for m in metrics]
        base = vals[0]
        deltas = [None if v is None or base is None else v - base for v in vals]
        pcts = [None if d is None or not base else 100.0 * d / abs(base) for d in deltas]
        dist = path.rpartition(".")[0]
        counts = [_num(_get(m, f"{dist}.count")) for m in metrics] if dist else []
        rows.append(MetricRow(label, path, better, vals, deltas, pcts, counts))

    comp = Comparison([i.id for i in infos], factors, rows)
    diff = comp.differing
    if len(diff) > 1:
        names = ", ".join(f.name for f in diff)
        comp.warnings.append(
            f"{len(diff)} things differ ({names}): change one at a time, or the metric "
            "deltas cannot be attributed to any one of them"
        )
    if not diff:
        comp.warnings.append("no knob or context differs: the deltas are run-to-run noise")
    for i in infos:
        if i.status != RunStatus.COMPLETED:
            comp.warnings.append(f"{i.id} is {i.status}: its metrics cover what was recorded")
    return comp


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
