"""A study's SLO derived from the host it runs on (a preset's `slo_from_host`).

Before anything is ranked, the baseline config serves the study's workload one request at
a time (closed loop, one user: the idle probe); the SLO then asks P95 TTFT and P95 TPOT
under load to stay within `ttft_x` / `tpot_x` times the probe's own P95s
(`slo.derive_slo`). The probe is a run of the study (phase `slo`), so a resumed study
reads it back and judges every point by the same SLO.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.measure.result import Infeasible, PointResult
from servetune.slo import SLO, HostRule, derive_slo
from servetune.tune.trial import run_points

PHASE = "slo"


@dataclass(frozen=True)
class HostSLO:
    """The derived SLO and the probe it came from."""

    rule: HostRule
    slo: SLO
    probe_ttft_ms: float | None
    probe_tpot_ms: float | None
    samples: int
    config: str  # the probed config's label
    backend: str  # real | sim: what was probed
    run_id: str | None = None

    def text(self) -> str:
        """`SLO derived from this host: P95 TTFT <= 4 x probe 412 ms = 1,648 ms, ...`."""
        parts = []
        for name, probe, x, t in (
            ("TTFT", self.probe_ttft_ms, self.rule.ttft_x, self.slo.ttft_ms),
            ("TPOT", self.probe_tpot_ms, self.rule.tpot_x, self.slo.tpot_ms),
        ):
            if probe is not None and t is not None and t.p95 is not None:
                parts.append(f"P95 {name} <= {x:g} x probe {probe:,.0f} ms = {t.p95:,.0f} ms")
        where = "this host" if self.backend == "real" else "the simulated host"
        return (
            f"SLO derived from {where}: {', '.join(parts)} (probe: {self.samples} requests "
            f"one at a time on {self.config}; its P95s)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_x": self.rule.ttft_x,
            "tpot_x": self.rule.tpot_x,
            "probe_ttft_p95_ms": self.probe_ttft_ms,
            "probe_tpot_p95_ms": self.probe_tpot_ms,
            "samples": self.samples,
            "config": self.config,
            "backend": self.backend,
            "run_id": self.run_id,
            "slo": self.slo.model_dump(mode="json", exclude_none=True),
            "text": self.text(),
        }


def from_probe(base: SLO, rule: HostRule, point: PointResult, config: str, backend: str) -> HostSLO:
    """The SLO a probe point gives (pure)."""
    return HostSLO(
        rule=rule,
        slo=derive_slo(base, rule, point.ttft_p95_ms, point.tpot_p95_ms),
        probe_ttft_ms=point.ttft_p95_ms,
        probe_tpot_ms=point.tpot_p95_ms,
        samples=point.completed,
        config=config,
        backend=backend,
        run_id=point.run_id,
    )


def probe_host(
    backend: Any,
    cfg: EngineConfig,
    *,
    base: SLO,
    rule: HostRule,
    recorder: Any,
    label: str,
    say: Callable[[str], None] | None = None,
) -> HostSLO | str:
    """Probe `cfg` idle on `backend` and derive the SLO; a string says why it could not
    be derived (the config would not start, or no request completed)."""
    try:
        (point,) = run_points(
            backend, cfg, "concurrency", [1.0], recorder=recorder, phase=PHASE, say=say, label=label
        )
    except Infeasible as exc:
        return f"the probe of {label} failed ({exc.reason})"
    if point.ttft_p95_ms is None and point.tpot_p95_ms is None:
        return f"the probe of {label} completed no request"
    return from_probe(base, rule, point, label, backend.name)
