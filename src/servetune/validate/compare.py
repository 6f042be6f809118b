"""Simulated against real: the compared figures, their errors, the noise floor, the verdict.

Pure functions over RunResults and figure dicts; no engine, no simulator. Every figure is
the median over a workload's repeats (the host is shared and noisy), and the error of a
figure is |sim - real| / real x 100. The targets apply to the median of those errors over
the held-out workloads.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.results.schema import Metrics, RunResult, by_workload
from servetune.validate.cases import is_calibration

FIGURES = ("output_tok_s", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")
# The simulator's acceptance targets on held-out workloads: the median absolute % error
# over workloads, per figure.
TARGETS = {
    "output_tok_s": 10.0,
    "ttft_p50": 15.0,
    "ttft_p95": 25.0,
    "tpot_p50": 10.0,
    "tpot_p95": 25.0,
}
# Not scored: the latency a client times even when the host or a proxy holds the stream
# (its last chunk's arrival), so an effect on latency can still be checked on such a run.
E2E = "e2e_p50"
NOISE_FLOOR_TITLE = "noise floor, real vs real: odd repeats / even repeats / |difference|"

Figures = dict[str, float | None]


@dataclass
class Row:
    """One workload's outcome: real (median of repeats), simulated, errors, extras."""

    name: str
    real: Figures
    sim: Figures
    err: Figures
    extra: dict[str, Any] = field(default_factory=dict)


def figures(m: Metrics) -> Figures:
    """The five compared figures of one run, and its P50 E2E latency."""
    return {
        E2E: m.e2e_ms.p50,
        "output_tok_s": m.output_tok_s,
        "ttft_p50": m.ttft_ms.p50,
        "ttft_p95": m.ttft_ms.p95,
        "tpot_p50": m.tpot_ms.p50,
        "tpot_p95": m.tpot_ms.p95,
    }


def median_figures(runs: Sequence[Figures], keys: Sequence[str] = FIGURES) -> Figures:
    """Per-figure median over repeated runs (None when no run had the figure)."""
    out: Figures = {}
    for k in keys:
        vals = [v for r in runs if (v := r.get(k)) is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def abs_pct_errors(sim: Figures, real: Figures) -> Figures:
    """|sim - real| / real x 100 per figure (None where either is missing or real is 0)."""
    out: Figures = {}
    for k in FIGURES:
        s, r = sim.get(k), real.get(k)
        out[k] = None if s is None or not r else abs(s - r) / r * 100.0
    return out


def compare_runs(
    name: str,
    reals: Sequence[RunResult],
    sims: Sequence[RunResult],
    extra: dict[str, Any] | None = None,
) -> Row:
    """The row of one workload: the median figures of the `sims` scored against those of
    the `reals`, as a simulation is scored against the engine."""
    keys = (*FIGURES, E2E)
    real = median_figures([figures(r.metrics) for r in reals], keys)
    sim = median_figures([figures(s.metrics) for s in sims], keys)
    extra = dict(extra or {})
    if held := sum(1 for r in reals if r.metrics.stream_buffered):
        extra["held_streams"] = held  # TTFT/TPOT not measurable on those repeats
    return Row(name, real, sim, abs_pct_errors(sim, real), extra)


def medians_over(rows: Sequence[Row], keys: Sequence[str] = FIGURES) -> Figures:
    """Median absolute % error over workloads, per figure."""
    return median_figures([r.err for r in rows], keys)


def noise_floor(runs: Sequence[RunResult]) -> list[Row]:
    """Real against real: per held-out workload with two or more repeats, the median
    figures of its even repeats (r0, r2, ...) compared like a simulation with those of its
    odd ones (r1, r3, ...). Why: it is the error a perfect simulator would still be charged
    on this host, so a target below it cannot be verified here. (Half the repeats each:
    somewhat noisier than the median of all of them that the simulator is held to.)"""
    return [
        compare_runs(name, reps[1::2], reps[0::2], {"repeats": len(reps)})
        for name, reps in by_workload(runs).items()
        if not is_calibration(name) and len(reps) >= 2
    ]


def verdict(
    rows: Sequence[Row], floor: Sequence[Row], targets: Mapping[str, float] = TARGETS
) -> tuple[str, list[str]]:
    """The `targets` (% per figure: the held-out ones by default; the tuner judges its
    verified configs by its own), judged only where this host can judge them: "met" (every
    median error within its target), "missed" (with the figures missed where the real
    engine reproduced itself within the target), or "too noisy" (every miss is on a figure
    whose real-vs-real floor already exceeds its target: a perfect simulator would be
    charged as much, so the miss says nothing about the model). No floor (one repeat):
    every miss counts."""
    med = medians_over(rows, tuple(targets))
    fl = medians_over(floor, tuple(targets)) if floor else {}

    def above(v: float | None, t: float, unknown: bool) -> bool:
        return unknown if v is None else v > t

    missed = [k for k, t in targets.items() if above(med.get(k), t, True)]
    if not missed:
        return "met", []
    noisy = {k for k, t in targets.items() if above(fl.get(k), t, False)}
    judged = [k for k in missed if k not in noisy]
    return ("missed", judged) if judged else ("too noisy", missed)


def format_table(rows: Sequence[Row], title: str) -> str:
    """Plain-text table: real / sim / |err|% per figure, then the medians and targets."""
    head = f"{'workload':22s}" + "".join(f"{k:>26s}" for k in FIGURES)
    lines = [title, head]

    def cell(r: Row, k: str) -> str:
        a, b, e = r.real[k], r.sim[k], r.err[k]
        if a is None and k != "output_tok_s" and r.extra.get("held_streams"):
            return f"{'stream held':>26s}"  # the client got the tokens in bursts
        if a is None or b is None or e is None:
            return f"{'-':>26s}"
        return f"{a:9.1f} {b:9.1f} {e:5.1f}%".rjust(26)

    for r in rows:
        lines.append(f"{r.name:22s}" + "".join(cell(r, k) for k in FIGURES))
    med = medians_over(rows)
    lines.append(
        f"{'median |err| %':22s}"
        + "".join(f"{v:26.1f}" if (v := med[k]) is not None else f"{'-':>26s}" for k in FIGURES)
    )
    lines.append(f"{'target %':22s}" + "".join(f"{TARGETS[k]:26.0f}" for k in FIGURES))
    return "\n".join(lines)
