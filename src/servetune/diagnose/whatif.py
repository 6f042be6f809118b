"""The simulator's predicted effect of an action: the same workload, the same model and
hardware, with the action's knob at its next value, measured through the measure seam's
simulator session. Possible when the run names a catalog model and hardware (every
simulated run, and a real run recorded with them); otherwise the action keeps the
planner's estimate alone."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from servetune.diagnose.rules import Finding
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.results.schema import RunResult

MAX_WHATIFS = 2  # the first engine findings only: each costs one simulation


def resimulate(res: RunResult, changes: dict[str, Any]) -> RunResult | None:
    """`res`'s workload simulated with `changes` applied to its config, or None when the
    run lacks a catalog model/hardware or the changed config is refused."""
    from servetune.hardware import get_hardware
    from servetune.measure import Point, SimSession
    from servetune.model import get_model
    from servetune.workload.spec import WorkloadSpec

    tg = res.target
    if not tg.model or not tg.hardware or not res.workload:
        return None
    try:
        cfg = EngineConfig.model_validate({**(tg.config or {}), **changes})
        session = SimSession(get_model(tg.model), get_hardware(tg.hardware), cfg)
        spec = WorkloadSpec.model_validate(res.workload)
        return session.measure(Point("what-if", spec, requests=res.requests or None))
    except (InputError, ValidationError, ValueError):
        return None


def _fmt_s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


# Simulated P99 TTFT within 2% of the run's is no change: a one-step shift in when a batch
# forms moves it that much on the same requests.
SAME_TTFT = 0.02


def verdict(before: RunResult, after: RunResult) -> str | None:
    """None when the change gains (a lower simulated P99 TTFT or fewer preemptions); else
    "worse" (nothing completed, or either got worse) or "no gain"."""
    b, a = before.metrics.ttft_ms.p99, after.metrics.ttft_ms.p99
    if not after.metrics.completed or a is None:
        return "worse (nothing completed)"
    bp = before.target.sim.preemptions if before.backend == "sim" else None
    ap = after.target.sim.preemptions
    if (b is not None and a < b * (1 - SAME_TTFT)) or (bp is not None and ap < bp):
        return None
    if (b is not None and a > b * (1 + SAME_TTFT)) or (bp is not None and ap > bp):
        return "worse"
    return "no gain"


def effect(before: RunResult, after: RunResult) -> str:
    """`simulated[: no gain|worse]: P99 TTFT a -> b, TPOT P50 c -> d ms, preemptions e -> f;
    <the simulator's expected error>`: the figures carry the error the tier is known for."""
    b, a = before.metrics, after.metrics
    out = f"P99 TTFT {_fmt_s(b.ttft_ms.p99)} -> {_fmt_s(a.ttft_ms.p99)}"
    if b.tpot_ms.p50 is not None and a.tpot_ms.p50 is not None:
        out += f", TPOT P50 {b.tpot_ms.p50:.1f} -> {a.tpot_ms.p50:.1f} ms"
    if before.backend == "sim":
        out += f", preemptions {before.target.sim.preemptions} -> {after.target.sim.preemptions}"
    v = verdict(before, after)
    out = f"simulated: {v} ({out})" if v else f"simulated: {out}"
    note = after.target.sim.expected_error
    return f"{out}; {note}" if note else out


def add_simulated_effects(res: RunResult, findings: list[Finding]) -> None:
    """Append the simulator's prediction to the top action of the first engine findings,
    when that action is an engine knob with a concrete next value. An action the simulator
    shows gains nothing goes below the finding's other actions."""
    knobs = set(EngineConfig.model_fields)
    done = 0
    for f in findings:
        if f.kind != "engine" or done >= MAX_WHATIFS or not f.actions:
            continue
        act = f.actions[0]
        if act.knob not in knobs or isinstance(act.next, str) and act.knob != "kv_cache_dtype":
            continue
        after = resimulate(res, {act.knob: act.next})
        done += 1
        if after is None:
            continue
        sim = effect(res, after)
        act.predicted = f"{act.predicted}; {sim}" if act.predicted else sim
        if verdict(res, after):
            f.actions.append(f.actions.pop(0))
