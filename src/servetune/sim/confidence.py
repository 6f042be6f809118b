"""Whether a calibrated profile is fit for use: the confidence rules, and the runs that
would lift a low or medium verdict.

A profile is judged on two kinds of evidence (pure functions, no I/O):

- how well it fits its own runs (`Fit`): the replay fit's RMS log error of the runs'
  figures, or, for a least-squares-only profile, R^2 of the per-step gaps; a per-chunk
  API overhead larger than the fastest first token the runs saw (every TTFT contains it
  once, so it cannot be real: it is step time the fit could not place); too few gaps;
- what its runs covered (`Coverage`, `coverage_of`): batches as large as the engine runs,
  shared prefixes served from the cache, open-loop and bursty arrivals, mixed lengths.
  A cost the runs never exercised is extrapolated, and an extrapolated term is how a
  held-out workload ends up 20% off while the profile fits its own runs well.

Levels: "low" when the fit fails a fit rule (not fit for use: the tuner's cache does not
keep it and `calibrate` says so loudly); "medium" when it fits but the runs left a gap in
coverage or dropped most of the step terms; "high" otherwise. The thresholds and why are
in docs/simulate.md ("Confidence").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servetune.results.schema import RunResult
from servetune.status import RequestStatus

# Replay fit: RMS log error of the replayed figures. 0.15 (a factor of 1.16) is the P50
# TTFT target of the CPU fidelity harness (validate.TARGETS): a profile that misses its
# own runs by more will miss unseen ones by more still. 0.30 (x1.35) is past every P95
# target: above it the figures are not worth a decision.
REPLAY_HIGH, REPLAY_LOW = 0.15, 0.30
# Least squares only (no replay: the engine's knobs were not given): R^2 of the per-step
# gaps. On a GPU or a quiet CPU the gaps are step boundaries (R^2 0.9+); on a shared CPU
# a chunk's arrival jitters by a step, so below 0.3 the fit has found little structure.
R2_HIGH, R2_LOW = 0.9, 0.3
MIN_GAPS_HIGH = 500  # inter-chunk gaps behind a "high" least-squares fit
BATCH_COVERED = 4  # a sweep must run batches of at least this many sequences
SPREAD_COVERED = 4.0  # longest / shortest prompt within one run: "mixed lengths"
BURSTY_SHAPE = 1.0  # gamma shape below this: inter-arrival CV > 1 (CV^2 = 1 / shape)


@dataclass(frozen=True)
class Coverage:
    """What a profile's runs exercised (`coverage_of`)."""

    runs: int
    max_batch: int  # most requests decoding at once, in any run
    prefix_runs: int  # runs whose requests share prefixes (prefix-cache hits)
    open_loop_runs: int  # runs with a rate (poisson, gamma, constant)
    bursty_runs: int  # gamma runs with inter-arrival CV > 1
    mixed_length_runs: int  # runs whose prompts span SPREAD_COVERED x or more
    fastest_ttft_s: float | None  # the smallest TTFT of any request (API overhead bound)


@dataclass(frozen=True)
class Fit:
    """How the fit went (`sim.calibrate.fit_profile`, `fit_by_replay`)."""

    method: str  # "least squares" or "least squares + replay"
    samples: int
    r2: float
    error: float  # replay: RMS log error of the figures; else relative RMSE of the steps
    dropped: Sequence[str]
    terms: int
    api_overhead_s: float
    spread: float | None = None  # how far repeats differ (calibrate.repeat_spread)
    worst: Sequence[str] = ()  # the worst-replayed runs, "name 41%", worst first


@dataclass(frozen=True)
class Verdict:
    confidence: str  # high | medium | low
    problems: list[str]  # which rules failed, one line each
    fixes: list[str]  # which runs would fix them


def max_decode_batch(res: RunResult) -> int:
    """Most requests decoding at once (between their first and last chunk: the decode
    batch as `calibrate.step_samples` reconstructs it; queued requests are not in it)."""
    events = []
    for r in res.records:
        if r.status == RequestStatus.OK and len(r.chunk_ns) > 1:
            events += [(r.chunk_ns[0], 1), (r.chunk_ns[-1], -1)]
    events.sort()
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return most


def coverage_of(runs: Sequence[RunResult]) -> Coverage:
    """What `runs` exercised, read off their records and workloads."""
    prefix = open_loop = bursty = mixed = 0
    ttfts = []
    for res in runs:
        ok = [r for r in res.records if r.status == RequestStatus.OK and r.chunk_ns]
        prefix += any(r.prefix_group is not None for r in ok)
        arrival = res.workload.get("arrival") or {}
        if arrival.get("kind") in ("poisson", "gamma", "constant"):
            open_loop += 1
            bursty += arrival.get("kind") == "gamma" and arrival.get("burstiness", 1) < BURSTY_SHAPE
        lengths = [r.usage_prompt_tokens or r.prompt_tokens or 0 for r in ok]
        lengths = [n for n in lengths if n > 0]
        mixed += bool(lengths) and max(lengths) >= SPREAD_COVERED * min(lengths)
        ttfts += [(r.chunk_ns[0] - r.send_ns) / 1e9 for r in ok]
    return Coverage(
        runs=len(runs),
        max_batch=max((max_decode_batch(r) for r in runs), default=0),
        prefix_runs=prefix,
        open_loop_runs=open_loop,
        bursty_runs=bursty,
        mixed_length_runs=mixed,
        fastest_ttft_s=float(np.min(ttfts)) if ttfts else None,
    )


def _replay_problem(fit: Fit, rule: str) -> str:
    spread = "" if fit.spread is None else f"; its runs' repeats differ by {fit.spread:.0%}"
    return f"replays its own runs with {fit.error:.0%} RMS log error ({rule}{spread})"


def replay_fix(fit: Fit) -> str:
    """What would lift a replay error, by its cause. The host's noise and a misfit look
    the same in one run; repeats of one workload tell them apart, because the host moves
    a repeat and a misfit does not (`calibrate.repeat_spread`).
    - The host is a cause when its noise alone is past what a "high" profile may miss
      (REPLAY_HIGH), or accounts for half the squared error or more (independent errors
      add in squares: spread^2 >= error^2 / 2).
    - A misfit is a cause when the host leaves more than half the squared error: the
      replay's scheduler is not the server's (its knobs), or the engine has a cost the
      step model lacks, or the search stopped short of it; the worst-replayed runs say on
      which workloads the error lies.
    Beside a busy host both can hold (the main job beside a CPU hog: repeats 42-45%
    apart, replays 71-75% off), and both are said."""
    if fit.spread is None:
        return (
            "calibrate with --repeats 2 or more: how far repeats of one workload differ "
            "tells the host's noise from a misfit"
        )
    misfit = 2 * fit.spread**2 < fit.error**2
    host = fit.spread > REPLAY_HIGH or not misfit
    worst = f" ({', '.join(fit.worst)})" if fit.worst else ""
    knobs = (
        "give the server's own scheduler knobs with --set (sequences and tokens per step, "
        "chunked prefill, block size), which the replay must share; if they are the "
        f"server's, the fit cannot reproduce its worst-replayed runs{worst}: expect that "
        "error on workloads like them"
    )
    differ = f"repeats of one workload differ by {fit.spread:.0%}"
    if host and not misfit:
        return f"calibrate on a quieter host: {differ}, most of the {fit.error:.0%}"
    if host:
        return (
            f"calibrate on a quieter host ({differ}), and, as that leaves most of the "
            f"{fit.error:.0%}, {knobs}"
        )
    return (
        f"the runs repeat within {fit.spread:.0%}, so the host does not explain a "
        f"{fit.error:.0%} error: {knobs}"
    )


def fit_problems(fit: Fit, fastest_ttft_s: float | None) -> list[tuple[str, str]]:
    """(problem, fix) for each fit rule the profile fails: any one makes it "low"."""
    out = []
    if "replay" in fit.method:
        if fit.error > REPLAY_LOW:
            out.append((_replay_problem(fit, f"low above {REPLAY_LOW:.0%}"), replay_fix(fit)))
    elif fit.r2 < R2_LOW:
        out.append(
            (
                f"the step times fit with R^2 {fit.r2:.2f} (low below {R2_LOW})",
                "give the engine's knobs (--set) so the fit can replay the runs",
            )
        )
    if fastest_ttft_s is not None and fit.api_overhead_s > fastest_ttft_s:
        out.append(
            (
                f"its per-chunk API overhead {fit.api_overhead_s * 1e3:,.0f} ms exceeds the "
                f"fastest TTFT measured ({fastest_ttft_s * 1e3:,.0f} ms): it absorbs step time",
                "add runs at batch 1 with short prompts (closed loop, 1 user)",
            )
        )
    return out


def coverage_gaps(cov: Coverage, fit: Fit, needs: Coverage | None = None) -> list[tuple[str, str]]:
    """(gap, fix) for each thing the runs did not exercise: any one caps at "medium".
    `needs`: what the workload the profile will predict exercises (the tuner's study:
    `tune.calibration.needs_of`); a gap it does not exercise is not one. None: a profile
    for any workload, every gap counts."""
    out = []
    if cov.max_batch < BATCH_COVERED and (needs is None or needs.max_batch > cov.max_batch):
        out.append(
            (
                f"batches of at most {cov.max_batch} requests",
                f"add runs with batch sizes of {BATCH_COVERED} or more (closed loops)",
            )
        )
    if not cov.prefix_runs and (needs is None or needs.prefix_runs):
        out.append(("no prefix-cache runs", "add prefix-cache runs (a workload with prefix:)"))
    if not cov.bursty_runs and (needs is None or needs.bursty_runs):
        out.append(
            (
                "no bursty open-loop runs",
                "add a run with gamma arrivals of burstiness < 1 (inter-arrival CV > 1)",
            )
        )
    if not cov.mixed_length_runs and (needs is None or needs.mixed_length_runs):
        out.append(
            (
                "no run mixes short and long prompts",
                f"add a run whose prompts span {SPREAD_COVERED:.0f}x or more (a mix:)",
            )
        )
    if len(fit.dropped) * 2 > fit.terms:
        out.append(
            (
                f"{len(fit.dropped)} of {fit.terms} step terms dropped by least squares",
                "add runs that vary batch size and prompt length independently",
            )
        )
    return out


def judge(fit: Fit, cov: Coverage, needs: Coverage | None = None) -> Verdict:
    """The confidence of a profile: low on any fit problem, medium on any coverage gap
    that matters to `needs` (or a least-squares-only fit below R2_HIGH / MIN_GAPS_HIGH,
    or a replay error above REPLAY_HIGH), else high."""
    bad = fit_problems(fit, cov.fastest_ttft_s)
    gaps = coverage_gaps(cov, fit, needs)
    if "replay" in fit.method:
        if REPLAY_HIGH < fit.error <= REPLAY_LOW:
            gaps.append(
                (_replay_problem(fit, f"high at {REPLAY_HIGH:.0%} or less"), replay_fix(fit))
            )
    elif (fit.r2 < R2_HIGH or fit.samples < MIN_GAPS_HIGH) and fit.r2 >= R2_LOW:
        gaps.append(
            (
                f"least squares only, R^2 {fit.r2:.2f} on {fit.samples} gaps",
                "give the engine's knobs (--set) so the fit can replay the runs",
            )
        )
    level = "low" if bad else "medium" if gaps else "high"
    items = bad + gaps
    return Verdict(level, [p for p, _ in items], list(dict.fromkeys(f for _, f in items)))
