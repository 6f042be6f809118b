"""Which configs the tuner keeps, in pure functions: the ranking order, the configs the
real engine verifies (one per level of the simulator's score), the knobs the simulator
cannot see, the winner among the finalists, and the ranking phase's default budget."""

from __future__ import annotations

import math

from servetune.status import TrialStatus
from servetune.tune.shortfall import shortfall
from servetune.tune.trial import TrialResult


def rank(trials: list[TrialResult]) -> list[TrialResult]:
    order = {
        TrialStatus.OK: 0,
        TrialStatus.NO_SLO: 1,
        TrialStatus.INFEASIBLE: 2,
        TrialStatus.SKIPPED: 3,
    }
    return sorted(
        trials,
        key=lambda t: (order.get(t.status, 4), -(t.score if t.score is not None else -math.inf)),
    )


def held_in_repeats(t: TrialResult) -> bool:
    """The finalist met the SLO in most of its repetitions at its best load: its capacity
    reproduces (seed 003 §14: a figure is kept only when repeated runs agree)."""
    assert t.ci is not None
    return 2 * t.ci["passed"] > t.ci["n"]


def pick_winner(ok: list[TrialResult], *, higher_is_better: bool) -> TrialResult:
    """The winner among the ranked configs that ran: finalists (re-run with an interval)
    whose capacity held in most repetitions, by their mean; then finalists that did not
    hold; a config without repetitions (sim, or none re-run) only when no finalist exists,
    the first of the ranking."""
    finalists = [t for t in ok if t.ci]
    if not finalists:
        return ok[0]
    sign = 1 if higher_is_better else -1
    return max(finalists, key=lambda t: (held_in_repeats(t), sign * t.ci["mean"]))  # type: ignore[index]


def merit(t: TrialResult) -> float | None:
    """What the simulator says of a trial, higher is better: its score when a load met the
    SLO, else minus how far its closest point missed (`shortfall`: the worst check's value
    / target), so configs that all miss an SLO still rank (on a busy host the SLO derived
    from a quick idle probe can be beyond every simulated config). None: nothing measured."""
    if t.score is not None:
        return t.score
    sf = shortfall(t)
    return None if sf is None or math.isinf(sf.worst) else -sf.worst


def beats(t: TrialResult, other: TrialResult) -> bool:
    """`t` did better than `other` on the real engine: met the SLO with a higher score, or
    met it where `other` did not, or missed it by less (`merit`)."""
    a, b = merit(t), merit(other)
    return a is not None and (b is None or a > b)


def diverse_top(ranked: list[TrialResult], k: int, skip: str) -> list[TrialResult]:
    """The simulator's top `k` (not `skip`, the baseline), one per level of score: configs
    the simulator cannot tell apart (within 0.5%) are verified once, so the real engine's
    few trials go to configs that differ in what the model predicts. When none met the
    SLO, the configs closest to it (`merit`)."""
    ok = [t for t in ranked if t.status == TrialStatus.OK and t.score is not None]
    pool = ok or sorted(
        (t for t in ranked if t.status == TrialStatus.NO_SLO and merit(t) is not None),
        key=lambda t: -(merit(t) or 0.0),
    )
    picked: list[TrialResult] = []
    for t in pool:
        if len(picked) >= k:
            break
        m = merit(t)
        if t.key == skip or m is None:
            continue
        if any(_close(m, merit(p)) for p in picked):
            continue
        picked.append(t)
    return picked


def _close(a: float, b: float | None) -> bool:
    """Within 0.5% of each other (the simulator cannot tell them apart)."""
    return b is not None and abs(a - b) <= 0.005 * max(abs(a), abs(b), 1e-12)


def sim_blind_knobs(trials: list[TrialResult], knobs: list[str]) -> list[str]:
    """Knobs the simulator does not model (e.g. llama.cpp's threads): every pair of trials
    that differ in that knob alone scored the same (within 0.5%)."""
    blind = []
    scored = [t for t in trials if t.status in (TrialStatus.OK, TrialStatus.NO_SLO)]
    for knob in knobs:
        groups: dict[str, list[TrialResult]] = {}
        for t in scored:
            rest = {k: t.config.get(k) for k in knobs if k != knob}
            groups.setdefault(repr(sorted(rest.items())), []).append(t)
        pairs = [g for g in groups.values() if len({repr(t.config.get(knob)) for t in g}) > 1]
        if pairs and all(_same_scores(g) for g in pairs):
            blind.append(knob)
    return blind


def _same_scores(group: list[TrialResult]) -> bool:
    vals = [merit(t) or 0.0 for t in group]
    top = max(abs(v) for v in vals) or 1.0
    return (max(vals) - min(vals)) <= 0.005 * top


def default_budget(strategy: str, n_valid: int) -> int | None:
    if strategy == "grid" or strategy in ("one-at-a-time", "oat"):
        return None
    return min(n_valid, max(8, math.ceil(0.3 * n_valid)))
