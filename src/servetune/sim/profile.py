"""Calibrated step-time profiles: fit from measured runs, store as JSON, check on load.

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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from servetune.errors import InputError
from servetune.results.schema import RunResult
from servetune.sim.steptime import FEATURES

PROFILE_KIND = "servetune-sim-profile"
NS = 1e9
MAX_SAMPLES = 200_000


class FitQuality(BaseModel):
    samples: int
    runs: list[str] = Field(default_factory=list)
    r2: float
    rel_rmse: float
    confidence: str  # high | medium | low
    dropped: list[str] = Field(default_factory=list)
    # "least squares" on per-step gaps, or "least squares + replay" (sim.fidelity.
    # fit_by_replay, which needs the engine's knobs); after a replay rel_rmse is the
    # root mean squared log error of the replayed figures.
    method: str = "least squares"


class Profile(BaseModel):
    """Coefficients of the calibrated tier for one (engine, version, model, hardware)."""

    kind: str = PROFILE_KIND
    version: int = 1
    engine: str
    engine_version: str = "unknown"
    model: str
    hardware: str
    tier: str = "calibrated"
    coefficients: dict[str, float]
    stderr: dict[str, float] = Field(default_factory=dict)
    api_overhead_s: float = 0.0
    # Serial front-end time per request before the engine sees it (steptime.StepModel).
    ingress_s: float = 0.0
    ingress_per_token_s: float = 0.0
    # First-time cost of a new step size (steptime.StepModel.new_shape_s).
    new_shape_s: float = 0.0
    new_shape_per_token_s: float = 0.0
    fit: FitQuality | None = None
    created_utc: str = ""

    @property
    def key(self) -> str:
        return f"{self.engine}@{self.engine_version}/{self.model}/{self.hardware}"

    def check(self, engine: str, model: str, hardware: str) -> None:
        """Refuse a profile measured on another engine, model or hardware."""
        if (self.engine, self.model, self.hardware) != (engine, model, hardware):
            raise InputError(
                "--profile",
                f"profile is for {self.engine}/{self.model} on {self.hardware}, "
                f"not {engine}/{model} on {hardware}",
                "calibrate one for this combination (servetune calibrate) or drop --profile",
            )


def load_profile(path: str | Path) -> Profile:
    from pydantic import ValidationError

    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise InputError("--profile", f"cannot read {p}: {exc.strerror}", "check the path") from exc
    except json.JSONDecodeError as exc:
        raise InputError("--profile", f"{p} is not JSON ({exc.msg})", None) from exc
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise InputError("--profile", f"{p} is not a servetune simulator profile", None)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise InputError("--profile", f"{p}: {exc.errors()[0]['msg']}", None) from None


def save_profile(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(profile.model_dump_json(indent=2) + "\n")


# --- features from client records -----------------------------------------------------


def step_samples(result: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """(X, y): one row per inter-chunk gap of `result`, features as in FEATURES, y the
    seconds per step (a gap over a k-token chunk is k steps; its features are per step)."""
    ok = [r for r in result.records if r.status == "ok" and len(r.chunk_ns) >= 1]
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
        c = np.asarray(r.chunk_ns, dtype=np.float64) / NS
        t0s.append(c[:-1])
        t1s.append(c[1:])
        ks.append(np.maximum(np.asarray(r.chunk_tokens[1:], dtype=np.float64), 1.0))
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
    x = np.column_stack([np.ones_like(m), pf / k, decode, kv, kv + pairs_pf / k, pairs_pf / k])
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
        neg = [i for i, v in zip(active, sol, strict=True) if v < 0 and i != 0]
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


def api_overhead(results: Sequence[RunResult], coef: np.ndarray) -> float:
    """P10 over requests of TTFT minus the predicted step of their prefill, >= 0."""
    resid = []
    for res in results:
        for r in res.records:
            if r.status != "ok" or not r.chunk_ns:
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
            "calibrate",
            f"only {len(y)} inter-token gaps in the results",
            "give streamed runs with output_tokens >= 2 and more requests",
        )
    coef, se, r2, rel, dropped = fit_coefficients(x, y)
    conf = "high" if r2 >= 0.9 and len(y) >= 500 else "medium" if r2 >= 0.6 else "low"
    return Profile(
        engine=engine,
        engine_version=engine_version,
        model=model,
        hardware=hardware,
        coefficients={f: float(c) for f, c in zip(FEATURES, coef, strict=True)},
        stderr={f: float(s) for f, s in zip(FEATURES, se, strict=True)},
        api_overhead_s=api_overhead(results, coef),
        fit=FitQuality(
            samples=int(len(y)),
            runs=[r.id for r in results],
            r2=float(r2),
            rel_rmse=rel,
            confidence=conf,
            dropped=dropped,
        ),
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def load_results(paths: Sequence[str | Path]) -> list[RunResult]:
    """Bench result files (RunResult JSON) for calibration."""
    from pydantic import ValidationError

    out = []
    for path in paths:
        p = Path(path)
        try:
            out.append(RunResult.model_validate_json(p.read_text()))
        except OSError as exc:
            raise InputError("calibrate", f"cannot read {p}: {exc.strerror}", None) from exc
        except ValidationError as exc:
            raise InputError(
                "calibrate", f"{p} is not a RunResult: {exc.errors()[0]['msg']}"
            ) from None
    return out
