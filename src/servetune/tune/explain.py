"""Why the winner won, in words a reviewer can check against the numbers: the margin over
the runner-up and the baseline, the knobs that differ, the SLO that binds at the next load
up, and the bottleneck seen there (KV capacity, compute, queueing), following seed 003 §13's
symptom table. Pure functions over trial results."""

from __future__ import annotations

from typing import Any

from servetune.measure import steady
from servetune.measure.result import PointResult
from servetune.metrics.pct import QUANTILES, fmt_ms, sample_note
from servetune.status import RunStatus, TrialStatus
from servetune.tune.objective import Objective, ObjectiveMetric
from servetune.tune.shortfall import Shortfall, shortfall
from servetune.tune.space import fmt_value
from servetune.tune.stats import Interval, differ, interval_of
from servetune.tune.trial import TrialResult

_METRIC = {
    "ttft_ms": "TTFT",
    "tpot_ms": "TPOT",
    "e2e_ms": "E2E",
    "itl_ms": "ITL",
    "error_rate": "error rate",
    "kv_cache_usage": "KV-cache usage",
}


def check_text(c: dict[str, Any]) -> str:
    """`P95 TTFT 1,234 ms > 800` (a missed check), `P95 TTFT 640 ms <= 800` (a met one)."""
    if c.get("metric") == steady.CHECK:
        return steady.check_text(c)
    name = _METRIC.get(str(c.get("metric")), str(c.get("metric")))
    v, t = c.get("value"), c.get("target")
    op = "<=" if c.get("ok") else ">"
    if c.get("metric") in ("error_rate", "kv_cache_usage"):
        return f"{name} {v or 0:.1%} {op} {t:.1%}"
    # 3 significant figures (`fmt_ms`): whole ms read a 7.29 ms miss as "7 ms > 7"
    shown = "none" if v is None else fmt_ms(v)
    return f"{str(c.get('stat', '')).upper()} {name} {shown} ms {op} {fmt_ms(t)}"


def check_with_n(c: dict[str, Any], p: PointResult) -> str:
    """`check_text` with the requests a percentile check rests on: `P95 TTFT 344 ms > 202
    (n=16, ~max)` (`metrics.pct`); a steady-state half check rests on half of the point's
    requests."""
    text = check_text(c)
    stat = str(c.get("stat", "")).lower()
    n = p.completed
    if c.get("metric") == steady.CHECK and stat.startswith(steady.HALVES):
        stat, n = stat.rsplit("_", 1)[-1], p.completed // 2
    return f"{text} ({sample_note(stat, n)})" if stat in QUANTILES else text


def failing_point(t: TrialResult) -> PointResult | None:
    """The point just above the capacity (where the SLO broke), else the worst one."""
    misses = [p for p in t.points if not p.passed]
    if not misses:
        return None
    if t.capacity is not None:
        above = [p for p in misses if p.load > t.capacity]
        if above:
            return min(above, key=lambda p: p.load)
    return min(misses, key=lambda p: p.load)


def binding_slo(t: TrialResult) -> str:
    """What broke the SLO just above the capacity, worded to follow "binding SLO ". When
    the capacity search never broke it but the repetitions at the capacity did (a busy
    host: the main job beside a CPU hog, 8 users passed once, then 0 of 3 repetitions),
    the repetitions' worst miss: "not reached" alone read as if nothing had missed."""
    p = failing_point(t)
    if p is None:
        reps = [r for r in t.reps if not r.passed and r.missed()]
        if not reps:
            return "not reached: every load tried met the SLO (capacity is a lower bound)"
        r = max(reps, key=lambda r: Shortfall(r).worst)
        return (
            f"not reached in the capacity search, but {len(reps)} of its {len(t.reps)} "
            f"repetitions at {_load(r)} missed it: "
            + ", ".join(check_with_n(c, r) for c in r.missed()[:2])
        )
    missed = p.missed()
    if not missed:
        why = "the run did not complete" if p.status != RunStatus.COMPLETED else "errors"
        return f"at {_load(p)}: {why}"
    return f"at {_load(p)}: " + ", ".join(check_with_n(c, p) for c in missed[:2])


def bottleneck(t: TrialResult, cfg_seqs: int | None = None) -> str:
    """KV capacity, compute or queueing, from the signals at the failing point."""
    p = failing_point(t) or t.best
    if p is None:
        return "unknown (no point measured)"
    s = p.signals
    notes: list[str] = []
    if s.get("rejected"):
        notes.append(f"KV / context: {s['rejected']} requests could not be admitted")
    used, blocks = s.get("max_kv_blocks_used"), s.get("kv_blocks")
    kv_full = bool(used and blocks and used >= 0.95 * blocks)
    kv_full = kv_full or (s.get("kv_cache_usage_max") or 0) >= 0.95
    if kv_full or (s.get("preemptions") or 0) > 0:
        notes.append(f"KV cache capacity (preemptions {s.get('preemptions') or 0:g})")
    waiting = s.get("requests_waiting_max") or 0
    if waiting > 0:
        notes.append(f"queueing: up to {waiting:g} requests waited for a batch seat / slot")
    missed = {c.get("metric") for c in p.missed()}
    if "kv_cache_usage" in missed:
        notes.append("memory headroom: the KV pool ran fuller than the SLO allows")
    if "ttft_ms" in missed and "tpot_ms" not in missed and not notes:
        notes.append(
            "queueing / prefill: TTFT broke while TPOT held (seed 003 §13: more "
            "prefill budget, prefix cache or replicas)"
        )
    if "tpot_ms" in missed:
        notes.append(
            "compute / memory bandwidth of decode: TPOT broke (seed 003 §13: a "
            "smaller decode batch or faster kernels)"
        )
    ss = t.sweet_spot or {}
    if "over-saturation" in (ss.get("regions") or []):
        notes.append(f"throughput saturated past {ss.get('knee'):g} in flight (seed 000 §3.1)")
    return "; ".join(dict.fromkeys(notes)) or "none visible in the engine's metrics"


def pool_doubt_line(t: TrialResult) -> list[str]:
    """Where the winner's best passing point ran a GPU's KV pool to its edge, whether its
    SLO still holds on a pool as much smaller as servetune's may sit from vLLM's
    (`sim.pool_doubt`): a capacity that rests on the pool's last few percent says so."""
    if t.best is None or "smaller_pool_share" not in t.best.signals:
        return []
    s = t.best.signals
    pool = (
        f"a pool {s['smaller_pool_share']:.0%} smaller ({s['smaller_pool_tokens']:,} tokens, "
        "as far as servetune's may sit from vLLM's)"
    )
    verdict = s.get("smaller_pool_slo_pass")
    if verdict is False:
        return [
            f"KV pool: at {_load(t.best)} the pool ran to its edge and {pool} misses the "
            "SLO: read vLLM's pool in its start-up log before relying on this capacity"
        ]
    held = "still meets the SLO" if verdict else "was simulated too"
    return [f"KV pool: at {_load(t.best)} the pool ran to its edge; {pool} {held}"]


def _load(p: PointResult) -> str:
    return f"{p.load:g} users" if p.load_kind == "concurrency" else f"{p.load:.3g} {p.unit}"


def differing(a: dict[str, Any], b: dict[str, Any], knobs: list[str]) -> list[str]:
    """`max_num_seqs 64 -> 128`: the knobs `a` changes from `b`. A knob a stored config
    leaves out is EngineConfig's default, shown as the tables show it (the baseline's
    0.9 utilization read "default -> 0.93" beside a label saying 0.9)."""
    from servetune.engines.config import EngineConfig

    base = EngineConfig.model_fields

    def value(cfg: dict[str, Any], k: str) -> Any:
        return cfg[k] if k in cfg else (base[k].default if k in base else None)

    names = [k for k in knobs if value(a, k) != value(b, k)]
    return [f"{k} {fmt_value(value(b, k))} -> {fmt_value(value(a, k))}" for k in names]


def explain(
    winner: TrialResult,
    ranked: list[TrialResult],
    baseline: TrialResult | None,
    objective: Objective,
    knobs: list[str],
) -> list[str]:
    """A few lines: margin, knobs, binding SLO, bottleneck, sweet spot."""
    out: list[str] = []
    score = winner.score
    others = [t for t in ranked if t.key != winner.key and t.status == TrialStatus.OK]
    line = objective.show(score)
    capacity = objective.capacity_of(winner)
    if capacity is not None:
        unit = winner.best.unit if winner.best else "req/s"
        cap_at = capacity if winner.capacity_load is None else winner.capacity_load
        least = "at least " if winner.capacity_is_lower_bound else ""
        if winner.best and winner.best.load != cap_at:
            # the score is the best passing point's, which need not be the capacity's
            # (a host past its sweet spot serves less at its capacity): name both loads
            line += (
                f" at {_load(winner.best)} (capacity {least}{capacity:.3g} {unit} within the SLO)"
            )
        else:
            line += f" at a capacity of {least}{capacity:.3g} {unit} within the SLO"
        evidence = steady.evidence_text(winner.best.signals) if winner.best else None
        line += f" ({evidence})" if evidence else ""
    elif not objective.searches_capacity and winner.best:
        line += f" at the workload's own load, {_load(winner.best)} (no capacity search)"
    if winner.ci:  # picked on its repetitions (`selection.pick_winner`): they lead
        ci = winner.ci  # the metric's own units, as the finalist line prints them
        line = (
            f"best {objective.label} on the finalists' repetitions: "
            f"{objective.text(_figure(winner, objective))} over {ci['n']} "
            f"(95% CI {ci['low']:.3g} .. {ci['high']:.3g}); its search trial: {line}"
        )
    else:
        line = f"best {objective.label}: {line}"
    out.append(line)
    if others and score is not None and others[0].score is not None:
        ru = others[0]
        out.append(
            f"runner-up {ru.label}: {_shown(ru, objective)} ({margin(winner, ru, objective)}); "
            f"differs in {', '.join(differing(winner.config, ru.config, knobs)) or 'nothing'}"
        )
    if baseline is not None and baseline.key != winner.key:
        if baseline.status == TrialStatus.OK and baseline.score is not None and score is not None:
            out.append(
                f"vs the baseline ({baseline.label}): {_shown(baseline, objective)} "
                f"({margin(winner, baseline, objective)}); changed "
                + (", ".join(differing(winner.config, baseline.config, knobs)) or "nothing")
            )
        else:
            out.append(f"the baseline ({baseline.label}) {baseline.reason or baseline.status}")
    elif baseline is not None:
        out.append(baseline_won(winner, others, objective))
    if objective.searches_capacity:
        out.append("binding SLO " + binding_slo(winner))
    else:
        out.append(
            "binding SLO not searched: the latency objective runs the workload's own load only"
        )
    out.append("bottleneck: " + bottleneck(winner))
    out += pool_doubt_line(winner)
    ss = winner.sweet_spot
    if ss and ss.get("knee") is not None:
        regions = ", ".join(
            f"{x:g}:{r.split('-')[0]}" for x, r in zip(ss["loads"], ss["regions"], strict=True)
        )
        out.append(f"sweet spot {ss['knee']:g} in flight ({ss['reason']}); regions {regions}")
    return out


def _figure(t: TrialResult, objective: ObjectiveMetric) -> float | None:
    """A config's figure for a margin, in the metric's own units ($, ms, req/s/GPU): the
    mean of its repetitions where it was re-run, else its trial's score (one measurement)."""
    return t.ci["mean"] if t.ci else objective.value(t.score)


def _shown(t: TrialResult, objective: Objective) -> str:
    """The figure a margin is taken from, said as such."""
    text = objective.text(_figure(t, objective))
    return f"{text} over {t.ci['n']} repetitions" if t.ci else text


def margin(winner: TrialResult, other: TrialResult, objective: Objective) -> str:
    """The winner's margin over `other`, from repetitions where either has them: on a busy
    host one trial can sit far from its own repeats (the main job beside a one-core hog:
    a trial at 0.307 req/s/GPU, its three repetitions 0.163, 95% CI 0.091 .. 0.235, against
    a baseline trial at 0.167). When the difference is not significant at 95% (Welch's
    t-test, `stats.differ`; against one trial: that trial inside the winner's interval)
    the line says so instead of a bare percentage. The line names its subject, the winner:
    it sits in the other config's parentheses, where a bare "16% less goodput per GPU"
    read as the other's shortfall when it was the winner's."""
    a, b = _figure(winner, objective), _figure(other, objective)
    if a is None or b is None:
        return "n/a"
    text = "the winner: " + objective.margin(a, b)
    if not winner.ci:
        return text
    text += " on both configs' repetitions" if other.ci else " on its repetitions"
    if within_noise(winner, other, objective):
        text += (
            "; within this host's noise at 95%, not a proven difference "
            "(a quieter host or more repetitions would settle it)"
        )
    return text


def baseline_won(winner: TrialResult, others: list[TrialResult], objective: ObjectiveMetric) -> str:
    """The line for a baseline that won (the CLI's explanation and the report's verdict):
    with the caveat where its repetitions cannot tell it from the runner-up, `others[0]`."""
    line = "the baseline itself won: no knob in the space beat it"
    if others and within_noise(winner, others[0], objective):
        line += ", though not by more than this host's noise over the runner-up"
    return line


def within_noise(winner: TrialResult, other: TrialResult, objective: ObjectiveMetric) -> bool:
    """The winner's repetitions do not tell it from `other` at 95%: Welch's test against
    the other's repetitions, or against its one trial as a point (the one-sample t-test).
    False when the winner was not re-run: one trial each has no noise estimate."""
    b = _figure(other, objective)
    if not winner.ci or b is None:
        return False
    theirs = interval_of(other.ci) if other.ci else Interval(1, b, b, b)
    return not differ(interval_of(winner.ci), theirs)


def explain_shortfall(t: TrialResult, sf: Shortfall, runner_up: TrialResult | None) -> list[str]:
    """Why the best-effort config is the closest to the SLO: the check that binds, every
    check as value vs target (a missed one with its ratio, a met one marked so), the
    bottleneck, and the next closest config."""
    out = [f"closest to the SLO at {_load(sf.point)} (no config met it)"]
    b = sf.binding
    if b is not None:
        out.append(f"binding SLO: {check_with_n(b, sf.point)} ({_ratio(b)})")
    elif not sf.point.passed:
        out.append(f"binding: the run at {_load(sf.point)} did not complete")
    out += [
        f"{check_with_n(c, sf.point)} ({_ratio(c) if not c.get('ok') else 'met'})"
        for c in sf.checks
        if c != b
    ]
    out.append("bottleneck: " + bottleneck(t))
    if runner_up is not None:
        ru = shortfall(runner_up)
        if ru is not None and ru.binding is not None:
            out.append(
                f"next closest {runner_up.label}: {check_text(ru.binding)} at {_load(ru.point)}"
            )
    return out


def _ratio(c: dict[str, Any]) -> str:
    r = c.get("ratio")
    return "not measured" if r is None or r == float("inf") else f"{r:.2f}x the target"
