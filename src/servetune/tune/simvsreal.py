"""Sim vs real on the hybrid flow's verified configs: each verified config's real point
against the simulator at the same config and the same load.

The same load, because the two capacity searches may stop at different loads: comparing
their scores would charge the simulator a whole lattice step for a small latency error at
the edge of the SLO. The real trial's best point (its score's) is the one compared, or its
highest load when none met the SLO. The errors are (sim - real) / real.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.measure.result import PointResult
from servetune.tune.objective import gpus_of
from servetune.tune.trial import TrialResult

# The figures of a row: (name: sim_<name> and real_<name>, its error's key, the
# PointResult field, divided by the config's GPUs).
FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("req_s_gpu", "req_s_error", "req_s", True),
    ("ttft_p50_ms", "ttft_p50_error", "ttft_p50_ms", False),
    ("tpot_p50_ms", "tpot_p50_error", "tpot_p50_ms", False),
    ("ttft_p95_ms", "ttft_p95_error", "ttft_p95_ms", False),
    ("tpot_p95_ms", "tpot_p95_error", "tpot_p95_ms", False),
)
SimulateAt = Callable[[EngineConfig, str, float], PointResult | None]


def rel_error(sim: float | None, real: float | None) -> float | None:
    """(sim - real) / real, None when either is missing or real is 0."""
    if sim is None or not real:
        return None
    return (sim - real) / real


def compared_point(real: TrialResult) -> PointResult | None:
    """The real point a verified config is compared at: its best, else its highest load."""
    if real.best is not None:
        return real.best
    return max(real.points, key=lambda p: p.load) if real.points else None


def sim_point_at(sim: TrialResult, kind: str, load: float) -> PointResult | None:
    """The simulator trial's own point at that load, when its search probed it."""
    return next((p for p in sim.points if p.load_kind == kind and p.load == load), None)


def row(real: TrialResult, sim: TrialResult, sim_at: PointResult | None) -> dict[str, Any]:
    """One verified config: the scores (as before: each at its own best load) and, at the
    real point's load, req/s per GPU and P50/P95 TTFT and TPOT, sim and real, with errors."""
    out: dict[str, Any] = {
        "label": real.label,
        "sim_score": sim.score,
        "real_score": real.score,
        "sim_capacity": sim.capacity,
        "real_capacity": real.capacity,
        "score_error": rel_error(sim.score, real.score),
    }
    at = compared_point(real)
    if at is None or sim_at is None:
        return out
    gpus = gpus_of(real.cfg)
    out.update(load_kind=at.load_kind, load=at.load)
    for name, err, attr, per_gpu in FIGURES:
        s, r = getattr(sim_at, attr), getattr(at, attr)
        if per_gpu:
            s, r = s / gpus, r / gpus
        out[f"sim_{name}"], out[f"real_{name}"], out[err] = s, r, rel_error(s, r)
    return out


def rows(
    sim: Iterable[TrialResult],
    real: Iterable[TrialResult],
    blind: list[str],
    simulate_at: SimulateAt,
) -> list[dict[str, Any]]:
    """A row per verified (real) config that the simulator ranked. Knobs the simulator
    does not model (`blind`) are ignored when matching; a load the simulator's search did
    not probe is simulated now (`simulate_at`)."""

    def seen_by_sim(t: TrialResult) -> str:
        return repr(sorted((k, v) for k, v in t.config.items() if k not in blind))

    by_key = {seen_by_sim(t): t for t in sim}
    out = []
    for r in real:
        m = by_key.get(seen_by_sim(r))
        if m is None:
            continue
        at = compared_point(r)
        sim_at = None
        if at is not None:
            sim_at = sim_point_at(m, at.load_kind, at.load) or simulate_at(
                r.cfg, at.load_kind, at.load
            )
        out.append(row(r, m, sim_at))
    return out


def throughput_errors(table: list[dict[str, Any]]) -> list[float]:
    """The rows' req/s errors at the same load (what the calibration check judges)."""
    return [r["req_s_error"] for r in table if r.get("req_s_error") is not None]


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e:+.0%}"


def line(r: dict[str, Any]) -> str:
    """One printed line per verified config: sim vs real req/s/GPU, P50 TTFT and P50
    TPOT at the same load, each with its error."""
    if "load" not in r:
        return f"sim vs real, {r['label']}: no point to compare (the real trial measured none)"
    unit = "users" if r["load_kind"] == "concurrency" else "req/s"

    def ms(name: str) -> str:
        s, v = r.get(f"sim_{name}_ms"), r.get(f"real_{name}_ms")
        if s is None or v is None:
            return "n/a"
        return f"{s:,.0f} vs {v:,.0f} ms ({_pct(r.get(f'{name}_error'))})"

    return (
        f"sim vs real, {r['label']} at {r['load']:g} {unit}: "
        f"{r['sim_req_s_gpu']:.2f} vs {r['real_req_s_gpu']:.2f} req/s/GPU "
        f"({_pct(r.get('req_s_error'))}), P50 TTFT {ms('ttft_p50')}, P50 TPOT {ms('tpot_p50')}"
    )
