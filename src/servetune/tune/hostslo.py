"""A study's SLO derived from the host it runs on (a preset's `slo_from_host`).

Before anything is ranked, the baseline config serves the study's workload one request at
a time (closed loop, one user: the idle probe), twice in a row; the SLO then asks P95 TTFT
and P95 TPOT under load to stay within `ttft_x` / `tpot_x` times the slower block's P95s
(`slo.derive_slo`). Why two blocks, the slower kept: one block is a few seconds, and a busy
host has quiet spells that long. A probe that fell in one set a target the same baseline
missed at one user a few seconds later (the main job beside a CPU hog: probe P95 TTFT
128 ms, so 513 ms; the baseline's own one-user point 535 ms; "no config meets the SLO").
Each block is the same statistic over the same requests as every load point. The blocks
are runs of the study (phase `slo`), so a resumed study reads them back and judges every
point by the same SLO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.measure.result import Infeasible, PointResult
from servetune.slo import SLO, HostRule, derive_slo
from servetune.tune.explain import check_with_n
from servetune.tune.shortfall import Shortfall
from servetune.tune.trial import TrialResult, run_points

PHASE = "slo"
BLOCKS = 2  # probe blocks; the slower one's P95s set the SLO


@dataclass(frozen=True)
class HostSLO:
    """The derived SLO and the probe it came from."""

    rule: HostRule
    slo: SLO
    probe_ttft_ms: float | None  # the slower block's P95s
    probe_tpot_ms: float | None
    samples: int  # requests per block: the P95s' sample size
    config: str  # the probed config's label
    backend: str  # real | sim: what was probed
    blocks: int = 1  # probe blocks run in a row
    run_ids: tuple[str, ...] = ()  # their runs

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
            f"one at a time on {self.config}, {self.blocks} blocks in a row; the slower "
            "block's P95s)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_x": self.rule.ttft_x,
            "tpot_x": self.rule.tpot_x,
            "probe_ttft_p95_ms": self.probe_ttft_ms,
            "probe_tpot_p95_ms": self.probe_tpot_ms,
            "samples": self.samples,
            "blocks": self.blocks,
            "config": self.config,
            "backend": self.backend,
            "run_ids": list(self.run_ids),
            "slo": self.slo.model_dump(mode="json", exclude_none=True),
            "text": self.text(),
        }


def _slower(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


def from_probe(
    base: SLO, rule: HostRule, blocks: list[PointResult], config: str, backend: str
) -> HostSLO:
    """The SLO the probe's blocks give: each figure the slower block's P95 (pure)."""
    ttft = _slower([b.ttft_p95_ms for b in blocks])
    tpot = _slower([b.tpot_p95_ms for b in blocks])
    return HostSLO(
        rule=rule,
        slo=derive_slo(base, rule, ttft, tpot),
        probe_ttft_ms=ttft,
        probe_tpot_ms=tpot,
        samples=min(b.completed for b in blocks),
        config=config,
        backend=backend,
        blocks=len(blocks),
        run_ids=tuple(b.run_id for b in blocks if b.run_id),
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
        blocks = run_points(
            backend, cfg, "concurrency", [1.0] * BLOCKS, recorder=recorder, phase=PHASE,
            say=say, label=label,
        )  # fmt: skip
    except Infeasible as exc:
        return f"the probe of {label} failed ({exc.reason})"
    if all(b.ttft_p95_ms is None and b.tpot_p95_ms is None for b in blocks):
        return f"the probe of {label} completed no request"
    return from_probe(base, rule, blocks, label, backend.name)


def slowed_since(host: HostSLO, trials: Sequence[TrialResult]) -> str | None:
    """When no config met the derived SLO, whether the host slowed after the probe: the
    probed config's own one-user points (its trial's, its repetitions') judged by that SLO.
    One that missed means the SLO asks more than the host gives now, so part of every
    config's shortfall is the host's, not the config's: said beside the best effort, with
    what to do. None: the probed config met it at one user, or was not measured there."""
    for t in trials:
        if t.label != host.config or t.backend != host.backend:
            continue
        ones = [p for p in [*t.points, *t.reps] if p.load_kind == "concurrency" and p.load == 1]
        missed = [sf for p in ones if not p.passed and (sf := Shortfall(p)).binding is not None]
        if not missed:
            return None
        worst = max(missed, key=lambda sf: sf.worst)
        b = worst.binding
        assert b is not None
        return (
            f"the host slowed after the SLO was derived: the probed config itself missed it "
            f"at 1 user ({check_with_n(b, worst.point)}; {len(missed)} of its {len(ones)} "
            "one-user runs), so the SLO asks more than this host gives now and part of every "
            "shortfall here is the host's: rerun on a quieter host, or give the SLO (--slo)"
        )
    return None
