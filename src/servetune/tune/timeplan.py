"""The real trials' time plan: what a soft `--time-budget` pays for, and in which order.

1. The verified configs (hybrid: the baseline and the simulator's top k), each bounded to
   an equal share of the time left after the finalists' repetitions are set aside
   (`share_s`). A config whose capacity search reaches its share stops starting new load
   points: its capacity is then a lower bound, and the output says so (`cut_note`).
2. Knobs the simulator does not model, one change at a time, only while time is left.
3. The finalists' repetitions: always run (the interval is what makes the answer true).

Why the shares: run unbounded, the first verified configs of a busy host took the whole
budget and the rest of the top k was never run (`-7s left, a trial takes ~46s`), so the
simulator's ranking went unchecked beyond its first pick. Pure functions: the tuner
measures the time.
"""

from __future__ import annotations

STOPPED = "stopped by the time budget"  # how `tune.trial` marks a search cut short


def reserve_s(finalists: int, repeats: int, point_s: float) -> float:
    """Seconds set aside for the finalists' repetitions: one load point each
    (`finalists` x `repeats` x the mean seconds of a real point so far)."""
    if finalists <= 0 or repeats < 2:
        return 0.0
    return finalists * repeats * max(point_s, 0.0)


def share_s(left_s: float | None, reserve: float, configs_left: int) -> float | None:
    """Seconds the next verified config may take: an equal share of the budget left after
    the `reserve`, over the configs still to verify (itself included). A config that ends
    early leaves its rest to the ones after it. None: no budget. Never negative: with
    nothing left a config still measures its first load point (`tune.trial` starts one
    before it looks at the clock), so every config of the top k gets a figure."""
    if left_s is None:
        return None
    return max(0.0, left_s - reserve) / max(configs_left, 1)


def cut_note(label: str, share: float, points: int, capacity: float | None) -> str:
    """What the plan cut from one verified config, for the output's notes."""
    cap = (
        "no load point met the SLO"
        if capacity is None
        else f"capacity {capacity:g} is a lower bound"
    )
    where = (
        f"at its {share:.0f}s share of the budget"
        if share >= 0.5
        # "at its 0s share" read as a bug: `share_s` gives 0 once the budget is spent
        else "the budget was spent before its turn (each verified config measures one)"
    )
    return (
        f"time budget: {label}: capacity search stopped after {points} load "
        f"point{'' if points == 1 else 's'}: {where} ({cap})"
    )


def skipped_note(what: str, left_s: float, need_s: float) -> str:
    """A step the plan skipped: what, the seconds left (after the finalists' reserve) and
    what one such step takes. A budget already overrun says by how much (a slow host's
    verified configs each measure one point whatever the clock, `share_s`), not "-258s
    left"."""
    if left_s < 0:
        return (
            f"time budget: {what} skipped (the budget is spent: {-left_s:.0f}s over, "
            f"the finalists' repetitions counted; a trial takes ~{need_s:.0f}s)"
        )
    return f"time budget: {what} skipped ({left_s:.0f}s left, a trial takes ~{need_s:.0f}s)"
