"""The simulator's predicted effect of an action: the same workload, the same model and
hardware, with the action's knob at its next value, measured through the measure seam's
simulator session. Possible when the run names a catalog model and hardware (every
simulated run, and a real run recorded with them); otherwise the action keeps the
planner's estimate alone. A simulated run is re-simulated first, unchanged: when the
catalog's model and hardware with its config do not give the same figures (a --profile,
which the run names but does not hold; a --hardware-file; a --replay's own requests), its
what-ifs would compare another engine with it and quote another tier's error, so each
says why there is none instead."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from servetune.build import build_id
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


def _same(a: RunResult, b: RunResult) -> bool:
    """The same simulated figures: the tier, completions, preemptions and P99 latencies."""

    def close(x: float | None, y: float | None) -> bool:
        return x == y or (x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6))

    ma, mb = a.metrics, b.metrics
    return (
        a.target.tier == b.target.tier
        and ma.completed == mb.completed
        and a.target.sim.preemptions == b.target.sim.preemptions
        and close(ma.ttft_ms.p99, mb.ttft_ms.p99)
        and close(ma.e2e_ms.p99, mb.e2e_ms.p99)
    )


def why_no_whatif(res: RunResult) -> str | None:
    """Why the simulator cannot stand in for this simulated run (None: it can, or the run
    is real and its what-if is the simulator's alone). The run records its profile's key,
    not the profile, and its hardware's name, not a --hardware-file's spec: re-simulated
    without them it is another engine, with another tier's error bound."""
    if res.backend != "sim":
        return None
    if res.target.profile:
        return (
            f"no simulated what-if: the run used profile {res.target.profile}, which it names"
            " but does not hold (simulate the change with --profile)"
        )
    base = resimulate(res, {})
    if base is None or not _same(base, res):
        return "no simulated what-if: " + not_reproduced(res.target.sim.build, build_id())
    return None


def not_reproduced(run_build: str | None, this_build: str) -> str:
    """Why today's simulator does not give a simulated run's figures: by the build the run
    recorded (`SimStats.build`), the simulator changed since, or the run had what the store
    does not keep (a --hardware-file's spec, a --replay's own requests)."""
    what = "the catalog's model and hardware with this config do not reproduce the run"
    if run_build is None:
        return f"{what} (a --hardware-file, a --replay, or a servetune before builds were named)"
    if run_build != this_build:
        return (
            f"{what}: servetune build {run_build} simulated it and this is {this_build}"
            " (re-simulate it here to compare like with like)"
        )
    return f"{what}, though this build simulated it (a --hardware-file or a --replay)"


def _fmt_s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


# Simulated P99 TTFT within 2% of the run's is no change: a one-step shift in when a batch
# forms moves it that much on the same requests.
SAME_TTFT = 0.02


def _judged(before: RunResult, after: RunResult) -> tuple[str, float | None, float | None]:
    """The latency a what-if is judged on: P99 TTFT where both runs measured it, else P99
    E2E (a stream:false run has no TTFT: its first token comes with its last)."""
    b, a = before.metrics, after.metrics
    if b.ttft_ms.p99 is not None and a.ttft_ms.p99 is not None:
        return "TTFT", b.ttft_ms.p99, a.ttft_ms.p99
    return "E2E", b.e2e_ms.p99, a.e2e_ms.p99


def verdict(before: RunResult, after: RunResult) -> str | None:
    """None when the change gains (a lower simulated P99 TTFT, or P99 E2E where no TTFT was
    measured, or fewer preemptions); else "worse" (nothing completed, or either got worse)
    or "no gain"."""
    if not after.metrics.completed:
        return "worse (nothing completed)"
    _, b, a = _judged(before, after)
    timed = b is not None and a is not None
    bp = before.target.sim.preemptions if before.backend == "sim" else None
    ap = after.target.sim.preemptions
    if (timed and a < b * (1 - SAME_TTFT)) or (bp is not None and ap < bp):  # type: ignore[operator]
        return None
    if (timed and a > b * (1 + SAME_TTFT)) or (bp is not None and ap > bp):  # type: ignore[operator]
        return "worse"
    return "no gain"


def effect(before: RunResult, after: RunResult) -> str:
    """`simulated[: no gain|worse]: P99 TTFT a -> b, TPOT P50 c -> d ms, preemptions e -> f;
    <the simulator's expected error>`: the figures carry the error the tier is known for."""
    b, a = before.metrics, after.metrics
    name, b99, a99 = _judged(before, after)
    out = f"P99 {name} {_fmt_s(b99)} -> {_fmt_s(a99)}"
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
    unset = object()
    why: Any = unset  # why_no_whatif, asked once, at the first action to simulate
    for f in findings:
        if f.kind != "engine" or done >= MAX_WHATIFS or not f.actions:
            continue
        act = f.actions[0]
        if act.knob not in knobs or isinstance(act.next, str) and act.knob != "kv_cache_dtype":
            continue
        done += 1
        if why is unset:
            why = why_no_whatif(res)
        if why is not None:
            act.predicted = f"{act.predicted}; {why}" if act.predicted else why
            continue
        after = resimulate(res, {act.knob: act.next})
        if after is None:
            continue
        sim = effect(res, after)
        act.predicted = f"{act.predicted}; {sim}" if act.predicted else sim
        if verdict(res, after):
            f.actions.append(f.actions.pop(0))
