"""Sim vs real on the hybrid flow's verified configs: each verified config's real point
against the simulator at the same config and the same load.

The same load, because the two capacity searches may stop at different loads: comparing
their scores would charge the simulator a whole lattice step for a small latency error at
the edge of the SLO. The real trial's best point (its score's) is the one compared, or its
highest load when none met the SLO. And the same requests: the real point's own requests
(prompt lengths as the server counted them) are replayed through the simulator
(`replay_point`). Each real point draws its own prompts (`measure.real.fresh_prompts`)
while the simulator's search draws the workload's, and with 6 requests a point's median
prompt differs by ~20 tokens between seeds: in the main job at 18:00 the real 1-user
points ran prompts of median 54 tokens, the simulator's 75, and TTFT grows ~1.1 ms per
prompt token there, most of the 26% P50 TTFT "error". The errors are (sim - real) / real.

"The simulator's error on the verified configs" is three figures, each the median over
the verified configs of |error| at the same load: throughput (req/s), P50 TTFT and P50
TPOT. Each is judged against TARGET and against this host's noise floor (`verdicts`, with
`validate.compare.verdict`'s rule): the floor is the real engine against itself over the
study, the same config at the same load measured twice: the baseline's calibration sweep
(what the simulator was fitted on) against the baseline's own trial at the same users
(`floor_rows`), and each finalist's point against its repetitions (`repeat_rows`, as
`validate`'s floor compares repeats). A perfect simulator would be charged that drift
too, so a miss on a figure whose floor exceeds the target says nothing about the model
("too noisy"), and the output says so with the floor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.measure.result import PointResult, whole_points
from servetune.measure.session import Point
from servetune.results.schema import RunResult
from servetune.sim.calibrate import replay_inputs
from servetune.tune.objective import gpus_of
from servetune.tune.trial import TrialResult
from servetune.validate import compare

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
ReplayAt = Callable[[EngineConfig, PointResult], PointResult | None]
# The hybrid flow's fidelity target: the most the simulator may miss the verified configs
# by, per judged figure (median |error| over the configs).
TARGET = 0.25
# The judged figures: their key in a row (`<key>_error`), their name in the output.
JUDGED: dict[str, str] = {"req_s": "throughput", "ttft_p50": "P50 TTFT", "tpot_p50": "P50 TPOT"}


def rel_error(sim: float | None, real: float | None) -> float | None:
    """(sim - real) / real, None when either is missing or real is 0."""
    if sim is None or not real:
        return None
    return (sim - real) / real


def compared_point(real: TrialResult) -> PointResult | None:
    """The real point a verified config is compared at: its best, else its highest load
    measured whole (else its highest: every point stopped early)."""
    if real.best is not None:
        return real.best
    points = whole_points(real.points) or real.points
    return max(points, key=lambda p: p.load) if points else None


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
    out.update(load_kind=at.load_kind, load=at.load, load_unit=at.unit)
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
    replay: ReplayAt | None = None,
) -> list[dict[str, Any]]:
    """A row per verified (real) config that the simulator ranked. Knobs the simulator
    does not model (`blind`) are ignored when matching. The simulator's figures: the real
    point's requests replayed (`replay`, when it can), else its own point at that load,
    else that load simulated now (`simulate_at`)."""

    def seen_by_sim(t: TrialResult) -> str:
        return repr(sorted((k, v) for k, v in t.config.items() if k not in blind))

    by_key = {seen_by_sim(t): t for t in sim}
    out = []
    for r in real:
        m = by_key.get(seen_by_sim(r))
        if m is None:
            continue
        at = compared_point(r)
        sim_at, same = None, False
        if at is not None:
            sim_at = replay(r.cfg, at) if replay is not None else None
            same = sim_at is not None
            sim_at = (
                sim_at
                or sim_point_at(m, at.load_kind, at.load)
                or simulate_at(r.cfg, at.load_kind, at.load)
            )
        out.append({**row(r, m, sim_at), "same_requests": same})
    return out


def replay_point(
    backend: Any, load_result: Callable[[str], RunResult], cfg: EngineConfig, at: PointResult
) -> PointResult | None:
    """The simulator (`backend`, a `SimBackend`) at `cfg` on the real point's own
    requests, as the server counted their prompts (`sim.calibrate.replay_inputs`); None
    when the point's run cannot be read back (`load_result`: the store's)."""
    if not at.run_id:
        return None
    try:
        run = load_result(at.run_id)
        spec, reqs = replay_inputs(run)
    except (InputError, ValueError):
        return None
    if not reqs:
        return None
    with backend.session(cfg) as sess:
        res = sess.measure(Point("replay", spec, requests=reqs))
    return PointResult.from_run(res, at.load_kind, at.load)


def throughput_errors(table: list[dict[str, Any]]) -> list[float]:
    """The rows' req/s errors at the same load (what the calibration check judges)."""
    return [r["req_s_error"] for r in table if r.get("req_s_error") is not None]


def throughput_floor(floor: list[compare.Row]) -> float | None:
    """The floor rows' median |req/s error| as a fraction (None: no row has one)."""
    med = compare.medians_over(floor, ("req_s",)).get("req_s") if floor else None
    return None if med is None else med / 100.0


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e:+.0%}"


def line(r: dict[str, Any]) -> str:
    """One printed line per verified config: sim vs real req/s/GPU, P50 TTFT and P50
    TPOT at the same load, each with its error."""
    if "load" not in r:
        return f"sim vs real, {r['label']}: no point to compare (the real trial measured none)"
    unit = r.get("load_unit") or ("users" if r["load_kind"] == "concurrency" else "req/s")

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


# --- the verdict: the judged figures against TARGET and this host's noise floor ----------


def _pct_row(name: str, errors: dict[str, float | None]) -> compare.Row:
    """A `validate.compare.Row` of the judged figures' |errors| in % (what its verdict
    reads)."""
    err = {k: None if (e := errors.get(k)) is None else abs(e) * 100.0 for k in JUDGED}
    return compare.Row(name, real={}, sim={}, err=err)


def point_figures(p: PointResult) -> dict[str, float | None]:
    """The judged figures of a tuner point."""
    return {"req_s": p.req_s, "ttft_p50": p.ttft_p50_ms, "tpot_p50": p.tpot_p50_ms}


def run_figures(r: RunResult) -> dict[str, float | None]:
    """The judged figures of a bench run (a calibration sweep's)."""
    m = r.metrics
    return {"req_s": m.req_s, "ttft_p50": m.ttft_ms.p50, "tpot_p50": m.tpot_ms.p50}


def floor_rows(sweep: Iterable[RunResult], baseline: TrialResult | None) -> list[compare.Row]:
    """The real engine against itself: each sweep run (a closed loop of c users at the
    baseline) against the baseline trial's point at c users, as the simulator is compared
    ((sweep - trial) / trial). The sweep is what the simulator was fitted on, so this is the
    error a perfect simulator would be charged for the host's drift since the sweep."""
    if baseline is None:
        return []
    at = {p.load: p for p in whole_points(baseline.points) if p.load_kind == "concurrency"}
    out = []
    for run in sweep:
        users = (run.workload.get("arrival") or {}).get("concurrency")
        p = at.get(float(users)) if users else None
        if p is None:
            continue
        fs, ft = run_figures(run), point_figures(p)
        errors = {k: rel_error(fs[k], ft[k]) for k in JUDGED}
        out.append(_pct_row(f"{run.workload.get('name')} vs baseline at {users:g}", errors))
    return out


def repeat_rows(trials: Iterable[TrialResult]) -> list[compare.Row]:
    """The real engine against itself: each finalist's compared point (the trial's best)
    against the median of its repetitions at that load, (point - reps) / reps."""
    out = []
    for t in trials:
        at = compared_point(t)
        if at is None or not t.reps:
            continue
        reps = compare.median_figures([point_figures(p) for p in t.reps], tuple(JUDGED))
        ft = point_figures(at)
        errors = {k: rel_error(ft[k], reps[k]) for k in JUDGED}
        out.append(_pct_row(f"{t.label} vs its {len(t.reps)} repetitions", errors))
    return out


def verdicts(table: list[dict[str, Any]], floor: list[compare.Row]) -> dict[str, dict[str, Any]]:
    """Per judged figure: the median |error| over the verified configs, the floor's median
    (None: no floor measured), and `validate.compare.verdict`'s word on it against TARGET:
    "met", "missed", or "too noisy" (missed, but the floor alone exceeds TARGET)."""
    rows = [_pct_row(r["label"], {k: r.get(f"{k}_error") for k in JUDGED}) for r in table]
    rows = [r for r in rows if any(v is not None for v in r.err.values())]
    if not rows:
        return {}
    med = compare.medians_over(rows, tuple(JUDGED))
    fl = compare.medians_over(floor, tuple(JUDGED)) if floor else {}
    out: dict[str, dict[str, Any]] = {}
    for k in JUDGED:
        if med.get(k) is None:
            continue
        word, _ = compare.verdict(rows, floor, {k: TARGET * 100.0})
        f = fl.get(k)
        out[k] = {
            "median_error": med[k] / 100.0,  # type: ignore[operator]
            "floor": None if f is None else f / 100.0,
            "verdict": word,
            "configs": sum(r.err.get(k) is not None for r in rows),
        }
    return out


def verdict_line(v: dict[str, dict[str, Any]]) -> str:
    """One line: each judged figure's median |error|, its floor and the verdict, e.g.
    `throughput 12% (floor 8%): within 25%; P50 TTFT 60% (floor 75%): beyond 25%, but so
    is the host's own floor: not judged; ...`."""
    if not v:
        return "sim vs real: no verified config to judge"
    n = max(x["configs"] for x in v.values())
    parts = []
    for k, x in v.items():
        floor = "no floor measured" if x["floor"] is None else f"floor {x['floor']:.0%}"
        word = {
            "met": f"within {TARGET:.0%}",
            "missed": f"MISSED {TARGET:.0%}",
            "too noisy": f"beyond {TARGET:.0%}, but so is the host's own floor: not judged",
        }[x["verdict"]]
        parts.append(f"{JUDGED[k]} {x['median_error']:.0%} ({floor}): {word}")
    return (
        f"sim vs real on {n} verified configs, median |error| at the same load (floor: the "
        f"real engine against itself, same config and load): " + "; ".join(parts)
    )
