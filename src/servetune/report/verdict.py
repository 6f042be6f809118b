"""The box a report opens with, in one screen: the answer and how sure it is.

A tune study: the winner, its margin over the baseline, the launch command, and how
sure (repetitions and their 95% interval, the steady-state verdict of its capacity
point, the simulator's error against the real engine). Any other report: per config,
the highest load that met the SLO (or the best throughput when no SLO was set)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servetune.measure import steady
from servetune.measure.result import PointResult
from servetune.metrics.pct import pct_text
from servetune.report.data import ReportData, RunData, closed_loop
from servetune.report.tuning import metric, name, trials, unit
from servetune.slo import SLO_METRICS
from servetune.status import TrialStatus
from servetune.tune.explain import baseline_won
from servetune.tune.objective import ObjectiveMetric
from servetune.tune.trial import TrialResult


@dataclass
class Verdict:
    headline: str
    rows: list[tuple[str, str]] = field(default_factory=list)  # (label, text)
    command: str | None = None


def verdict(data: ReportData) -> Verdict:
    return tune_verdict(data) if data.is_tune else runs_verdict(data)


def _trial(d: dict | None) -> TrialResult | None:
    return TrialResult.from_json(d) if d else None


def _pct(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "n/a"
    return f"{(a - b) / abs(b):+.0%}"


def tune_verdict(data: ReportData) -> Verdict:
    s = data.tune or {}
    w, b = _trial(s.get("winner")), _trial(s.get("baseline"))
    m = metric(data)
    if w is None:
        return Verdict("No config could be measured", [("study", str(s.get("study")))])
    met = s.get("slo_met", True)
    head = f"{'Winner' if met else 'Best effort (no config met the SLO)'}: {name(data, w)}"
    rows: list[tuple[str, str]] = []
    capacity = m.capacity_of(w)
    if capacity is not None:
        least = "at least " if w.capacity_is_lower_bound else ""
        rows.append(("capacity", f"{least}{capacity:.3g} {unit(w)} within the SLO ({_slo(s)})"))
    elif not m.searches_capacity and w.best is not None:
        load = f"{w.best.load:.3g} {unit(w)}"
        rows.append(("load", f"{load}, the workload's own: no capacity search ({_slo(s)})"))
    if b is not None and b.key != w.key:  # like with like: each config's search run
        wv, bv = m.value(w.score), m.value(b.score)
        rows.append(
            (
                "vs baseline",
                f"{_bound(m, w, b)}{m.margin(wv, bv)} in the search "
                f"({m.text(wv)} vs {m.text(bv)}, baseline {name(data, b)})",
            )
        )
    elif b is not None:
        others = [t for t in trials(data) if t.key != w.key and t.status == TrialStatus.OK]
        rows.append(("vs baseline", baseline_won(w, others, m)))
    rows.append(("how sure", _sureness(w, s, m)))
    if host := (s.get("host_check") or {}).get("text"):
        rows.append(("host", host))  # a busy host: what the study ran at, and why
    at = _capacity_point(w) if m.searches_capacity else w.best
    if at is not None:
        evidence = steady.evidence_text(at.signals) or (
            "closed loop: not judged for steady state (its users bound the queue)"
        )
        p95 = pct_text("p95", at.ttft_p95_ms, at.completed)
        point = "capacity point" if m.searches_capacity else "measured point"
        rows.append((point, f"{at.load:.3g} {at.unit}: {evidence}; TTFT {p95}"))
    rows.append(("sim vs real", _sim_error(w, s, m)))
    ship, command = _ship(s.get("recommended") or {}, w)
    if ship:
        rows.append(("ship", ship))
    return Verdict(head, rows, command)


def _capacity_point(w: TrialResult) -> PointResult | None:
    """The winner's point at its capacity (the lattice load it was found at): the best
    scoring point can sit below it, past the sweet spot. None when no point passed."""
    load = w.capacity_load or w.capacity
    at = next((p for p in w.points if p.passed and p.load == load), None)
    return at or w.best


def _ship(rec: dict, w: TrialResult) -> tuple[str, str | None]:
    """The ship row and the command the box ends with: the step back from the OOM edge
    only when it met the SLO (or was not measured); one that missed it is no answer, the
    winner is (`tune.tuner.Tuner._recommend`'s note, or said here for older studies)."""
    if rec.get("note"):
        return rec["note"], w.launch_command
    if not rec or rec.get("same_as_winner") or not rec.get("launch_command"):
        return "", w.launch_command
    status = rec.get("status")
    if status is not None and status != "ok":
        return (
            f"the winner: its step back from the OOM edge, {rec.get('label')}, missed "
            f"the SLO ({status})",
            w.launch_command,
        )
    how = " (not measured)" if status is None else ""
    if rec.get("safety_margin"):
        how = f" (vs the winner: {rec['safety_margin']})"
    return f"one safe step back from the OOM edge: {rec.get('label')}{how}", rec["launch_command"]


def _bound(m: ObjectiveMetric, w: TrialResult, b: TrialResult) -> str:
    """How far a margin holds when a capacity search never broke the SLO (its figure is
    a lower bound on what the config serves): the winner's could only be better, so the
    margin is "at least"; the baseline's too, so "at most"; both: neither."""
    if not m.searches_capacity:
        return ""
    winner, base = w.capacity_is_lower_bound, b.capacity_is_lower_bound
    if winner and base:
        return "(both capacities are lower bounds) "
    return "at least " if winner else "at most " if base else ""


def _slo(s: dict) -> str:
    slo = s.get("slo") or {}
    parts = [
        f"{stat.upper()} {metric.split('_')[0].upper()} <= {target:g} ms"
        for metric in SLO_METRICS
        for stat, target in (slo.get(metric) or {}).items()
        if target is not None
    ]
    if slo.get("error_rate") is not None:
        parts.append(f"errors <= {slo['error_rate']:.1%}")
    if slo.get("kv_cache_usage_max") is not None:
        parts.append(f"KV cache peak <= {slo['kv_cache_usage_max']:.0%}")
    return ", ".join(parts) or "no SLO"


def _sureness(w: TrialResult, s: dict, m: ObjectiveMetric) -> str:
    if w.ci:
        ci = w.ci  # the metric's own values ($, ms, req/s/GPU), as repetitions keep them
        return (
            f"{ci['n']} repetitions: {m.text(ci['mean'])} (95% CI {ci['low']:.3g} .. "
            f"{ci['high']:.3g}), {ci['passed']}/{ci['n']} met the SLO"
        )
    if s.get("mode") == "sim":
        return "simulator only: one run per config, not repeated nor verified on an engine"
    return "not repeated: no interval (tune --repeats 3)"


def _sim_error(w: TrialResult, s: dict, m: ObjectiveMetric) -> str:
    rows = s.get("sim_vs_real") or []
    mine = next((r for r in rows if r.get("label") == w.label), None)
    if mine is not None and mine.get("req_s_error") is not None:
        return (
            f"simulator {mine['req_s_error']:+.0%} on req/s per GPU at the same load, "
            f"{_pct(m.value(mine.get('sim_score')), m.value(mine.get('real_score')))} on the "
            f"{m.label}"
        )
    if rows:
        errs = [abs(r["req_s_error"]) for r in rows if r.get("req_s_error") is not None]
        if errs:
            return f"simulator within {max(errs):.0%} on req/s over {len(errs)} verified configs"
    return "not checked: the study ran on one backend"


def own_load(r: RunData) -> float:
    """A run's own load, on or off the report's axis: users for a closed loop, the
    offered (else achieved) rate for an open one."""
    v = r.info.concurrency if closed_loop(r.info) else r.info.rate or r.result.metrics.req_s
    return float(v or 0.0)


def runs_verdict(data: ReportData) -> Verdict:
    """Per config: its highest load meeting the SLO, else its best throughput (a config
    measured without an SLO). Loads rank by the run's own load, runs on the report's
    load axis first (a config may hold both loop kinds)."""
    rows = []
    with_slo = 0
    for series, members in data.series.items():
        if any(r.result.metrics.slo_pass is not None for r in members):
            with_slo += 1
            passing = [r for r in members if r.result.metrics.slo_pass]
            best = max(passing, key=lambda r: (data.x(r) is not None, own_load(r)), default=None)
            rows.append((series, _carried(best) if best else "no load met the SLO"))
        else:
            top = max(members, key=lambda r: r.result.metrics.output_tok_s)
            rows.append((series, f"best throughput at {top.info.load_label()}: {_point(top)}"))
    head = "Best throughput per config"
    if with_slo:
        head = "Highest load within the SLO, per config"
        if with_slo < len(data.series):
            head += " (best throughput where no SLO was set)"
    return Verdict(head, rows[:8])


def _carried(r: RunData) -> str:
    return f"{r.info.load_label()} within the SLO: {_point(r)}"


def _point(r: RunData) -> str:
    m = r.result.metrics
    good = f", goodput {m.goodput_req_s:.3g} req/s" if m.goodput_req_s is not None else ""
    return (
        f"{m.output_tok_s:,.0f} out tok/s{good}, TTFT "
        f"{pct_text('p95', m.ttft_ms.p95, m.ttft_ms.count)}"
    )
