"""Fit a CPU engine's threads to the cores this host leaves it, before anything else is
verified (seed 003 §13: low utilisation, "check the CPU" first; seed 000 §8: one change
at a time from the baseline).

Why first, not in the blind phase's turn: the simulator cannot tell a llama.cpp config's
threads apart (its profile is fitted at one setting), so `threads` waits for the real
engine, after the simulator's picks; on a busy host that turn never comes. Beside one
CPU hog on a 2-core host the main job's real trials at llama.cpp's default threads (all
cores) ran P95 TPOT ~1,000 ms, each trial ~140 s, and the budget was spent before
`threads=1` could run (the note said "threads=1 on the real engine skipped"); the winner
it named carried the 50x slower threads. Measured right after the baseline, the fit is
decided in one short trial, and the simulator's picks run with it when it wins.
"""

from __future__ import annotations

from servetune.tune.space import SearchSpace
from servetune.tune.trial import TrialResult


def threads_for_host(base: TrialResult, space: SearchSpace) -> int | None:
    """The `threads` value to measure next to the baseline: the largest the space offers
    within the cores the others left free, when the baseline's run showed other processes
    holding cores its threads wanted (`telemetry.contention`, carried in the point's
    signals). None when `threads` is not a knob of the space, the host had the cores, or
    the baseline already runs that few. Whether the simulator models threads does not
    matter: neither its profile nor its roofline knows the host's other processes."""
    if "threads" not in space.knobs:
        return None
    free = next((int(p.signals["free_cores"]) for p in base.points if "free_cores" in p.signals), 0)
    if not free:
        return None
    now = base.cfg.threads  # None: the engine's default, all cores
    if now is not None and now <= free:
        return None
    fits = [v for v in space.knobs["threads"] if isinstance(v, int) and v <= free]
    return max(fits) if fits else None


def contention_of(base: TrialResult) -> str:
    """What the baseline's run showed of the host (for the note), or ""."""
    return next(
        (str(p.signals["contention"]) for p in base.points if "contention" in p.signals), ""
    )
