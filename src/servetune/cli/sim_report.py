"""`simulate`'s report for people: what is simulated, each point in a few short lines,
and with an SLO its verdict and the check that binds. Apart from render.py so that the
commands that only print tables (plan, models, runs) do not load the result schema."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from servetune.bench.progress import load_label
from servetune.metrics import schedule_note, window_note
from servetune.results.schema import Metrics, RunResult, SimStats, SLOCheck

if TYPE_CHECKING:
    from servetune.measure.simulated import SimSession


def print_lines(lines: Iterable[str]) -> None:
    """Plain lines on stdout, flushed so a sweep's points show as they finish."""
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()


def sim_header(session: SimSession) -> list[str]:
    """What is simulated: model, device, engine, step-time tier, and what the pool holds."""
    from servetune.sim.engine import capacity_note

    prof, su = session.profile, session.setup
    tier = su.step_model.tier + (f" ({prof.key})" if prof else "")
    # the tier's rule and its expected error (StepModel.note), one part a line
    note = [f"  {part}" for part in su.step_model.note.split("; ") if part]
    return [
        f"simulate {session.model.name} on {session.hw.name} [{session.cfg.engine}], "
        f"step times: {tier}",
        *note,
        capacity_note(su, session.model),
    ]


def sim_point(res: RunResult) -> list[str]:
    """One simulated point in a few short lines: throughput, latency percentiles, the
    scheduler's counters and, with an SLO, the verdict (`slo_verdict`)."""
    m, sim = res.metrics, res.target.sim or SimStats()
    t, p = m.ttft_ms, m.tpot_ms
    # the median over every gap between tokens, as `vllm bench serve` and GuideLLM print it:
    # it leaves out the gaps a prefill stalls, which each request's TPOT holds
    itl = f", ITL p50 {_ms(m.itl_ms.p50)} ms" if m.itl_ms.p50 is not None else ""
    lines = [
        f"{load_label(res)}: {m.output_tok_s:,.0f} out tok/s, {m.req_s:.2f} req/s, "
        f"{m.completed} completed  [{res.target.tier}, {sim.wall_s:.2f} s]",
        f"  TTFT p50/p95/p99 {_ms(t.p50, t.p95, t.p99)} ms, TPOT p50/p95 {_ms(p.p50, p.p95)} ms"
        + itl,
        f"  preemptions {sim.preemptions}, rejected {sim.rejected}, "
        f"prefix hits {sim.prefix_hit_tokens:,} tok",
    ]
    lines += [f"  {n}" for n in (window_note(m), schedule_note(m, res.load)) if n is not None]
    lines += phase_note(res)
    lines += band_error_note(res)
    lines += kv_note(res)
    lines += pool_note(res)
    if res.workload.get("sessions"):  # multi-turn: follow-up TTFT and hit rates
        from servetune.metrics.turns import session_line

        lines.append(f"  {session_line(res)}")
    return lines + [f"  {line}" for line in slo_verdict(m)]


# Users of a closed loop from which the gpu tier's median TTFT depends on its one seeded
# draw of phases: over 8 draws it moved 1.5x at 8 users, 1.7-3.9x at 16-64, while the
# mean moved 1.1-1.3x, 2.2x in one of six loops (docs/fidelity-gpu.md#known-misses).
PHASE_NOTE_USERS = 8


def phase_note(res: RunResult) -> list[str]:
    """For a gpu-tier closed loop of PHASE_NOTE_USERS or more: the mean TTFT beside the
    median, and why (which users collide is one seeded draw of phases, `sim.phases`)."""
    conc, mean = res.load.concurrency, res.metrics.ttft_ms.mean
    closed = res.load.kind == "closed" and conc is not None and conc >= PHASE_NOTE_USERS
    if not closed or res.target.tier != "gpu" or mean is None:
        return []
    return [
        f"  TTFT mean {mean:,.1f} ms; the median rests on one draw of which users collide",
        "  (over 8 draws at 8-64 users: the median moved 1.5-3.9x, the mean 1.1-2.2x)",
    ]


def band_error_note(res: RunResult) -> list[str]:
    """A vLLM closed loop's expected error at its own load band (`SimStats.expected_error`,
    `sim.engine.run_expected_error`): the error grows with load, so the header's all-runs
    figure would undersell it at 129+ users and oversell it at 1-8. Other runs carry the
    header's figure and print nothing more."""
    from servetune.sim.expected_error import band_users

    note = res.target.sim.expected_error if res.target.sim else None
    if not note or band_users(res.target.engine, res.load.kind, res.load.concurrency) is None:
        return []
    return [f"  {part}" for part in note.split("; ") if part]


def kv_note(res: RunResult) -> list[str]:
    """A run that preempted ran its KV pool full: `diagnose`'s KV-pressure finding, its
    first action (an FP8 KV cache and the blocks it gains, or a bigger pool when the
    pool already runs 8-bit), so a KV-bound figure says why and what moves it."""
    if not (res.target.sim and res.target.sim.preemptions):
        return []
    from servetune.diagnose.evidence import from_result
    from servetune.diagnose.rules import doable, kv_pressure

    ev = from_result(res)
    found = kv_pressure(ev)
    acts = [a for a in found.actions if doable(ev, a)] if found else []  # as diagnose shows
    if found is None or not acts:
        return []
    return [f"  KV-bound: {found.trigger}", f"  try {acts[0].line()}"]


def _ms(*values: float | None) -> str:
    """Milliseconds as the point's lines print them: `1,483.1`, `-` for none, `/` between."""
    return "/".join("-" if v is None else f"{v:,.1f}" for v in values)


def pool_note(res: RunResult) -> list[str]:
    """A GPU point at its KV pool's edge (`SimStats.pool_doubt`): its figures again on a
    pool as much smaller as servetune's may sit from vLLM's, beside this run's, so a
    KV-bound answer carries its doubt."""
    m, sim = res.metrics, res.target.sim
    d = sim.pool_doubt if sim else None
    if sim is None or d is None:
        return []
    rejected = (
        f", {d.rejected} requests it cannot hold (here {sim.rejected})"
        if d.rejected > sim.rejected
        else ""
    )
    return [
        f"  the KV pool ran to its edge; a pool {d.share:.0%} smaller ({d.kv_capacity_tokens:,} "
        f"tokens: servetune's is known to ~{d.share:.0%} of vLLM's) gives",
        f"  TTFT mean {_ms(d.ttft_mean_ms)} ms (here {_ms(m.ttft_ms.mean)}), p50 "
        f"{_ms(d.ttft_p50_ms)} (here {_ms(m.ttft_ms.p50)}), TPOT p50 {_ms(d.tpot_p50_ms)} "
        f"(here {_ms(m.tpot_ms.p50)}), {d.preemptions} preemptions (here {sim.preemptions})"
        + rejected,
    ]


def slo_verdict(m: Metrics) -> list[str]:
    """`SLO pass: goodput 3.90 req/s, 97.5% of requests met it` and `binding P95 TPOT 30 ms
    <= 40` (`2 of 5 checks missed` added on a miss); no lines when the run had no SLO."""
    from servetune.tune.explain import check_text

    if m.slo_pass is None:
        return []
    good = "-" if m.goodput_req_s is None else f"{m.goodput_req_s:.2f}"
    head = f"SLO {'pass' if m.slo_pass else 'FAIL'}: goodput {good} req/s"
    if m.slo_attainment is not None:
        head += f", {m.slo_attainment:.1%} of requests met it"
    bind = binding_check(m.slo_checks)
    if bind is None:
        return [head]
    missed = sum(not c.ok for c in m.slo_checks)
    more = f" ({missed} of {len(m.slo_checks)} checks missed)" if missed > 1 else ""
    why = f": {bind.note}" if bind.note else ""
    return [head, f"binding {check_text(bind.model_dump())}{more}{why}"]


def binding_check(checks: list[SLOCheck]) -> SLOCheck | None:
    """The check with the highest value / target: the one missed by the most, or on a
    passing run the one nearest its target (the first to break as load grows). A failed
    check without a value (no request completed) binds first; a check skipped with a
    note (not measured, not failed) never binds."""

    def load(c: SLOCheck) -> float:
        if c.value is None:
            return math.inf
        if not c.target:
            return math.inf if c.value else 0.0
        return c.value / c.target

    judged = [c for c in checks if c.value is not None or not c.ok]
    return max(judged, key=load, default=None)
