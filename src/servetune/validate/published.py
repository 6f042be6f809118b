"""The visible fidelity set: published GPU serving runs, each simulated the way the held-out
set is judged, compared per step-time tier.

Each row of data/published/gpu_runs.csv is one closed-loop run at fixed input/output
lengths, with where it comes from (URL, title, date, engine and version) and what it
measured (mean TTFT and/or TPOT, ms). A row is replayed as `concurrency` users sending
`requests` requests (default 10 x concurrency, the held-out set's measure; a burst of N at
once is N users and N requests) of exactly those lengths; the simulated TTFT and TPOT, read
at the statistic the source published, are compared with the published figure. `stat`:
"mean", a mean over every request of the run, first round included (AIPerf, `vllm bench
serve`, SGLang's bench_serving), against the simulated mean; "window-mean", a mean over
GenAI-Perf's stable measurement windows, which leave the first round's burst out, against
the simulated median (the steady state); "median" and "derived" against the median;
"median-itl", a median TTFT with the median inter-token latency (`vllm bench serve`'s
"Median ITL") in the TPOT column, against the simulated median TTFT and median ITL: a
median over every gap leaves out the few a prefill stalls, which a request's TPOT holds,
so under load it sits below the median TPOT (for a mean the two are one figure at fixed
output lengths). `measure="median"` reads the simulated median whatever the source
published: issue 15's held-out measure, which sets a simulated median against a measured
mean. `role` says whether a row was used to set a figure of the step model (`fit`) or
only to check it (`check`); both are reported, apart.

Pure apart from `load_runs` (reads the CSV) and `replay` (runs the simulator; `simulate_run`
keeps each replay for the process, so a second measure of the same runs is only read).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.sim.expected_error import band_labels, band_of
from servetune.workload.spec import MAX_REQUESTS, MAX_TOKENS
from servetune.yamlfile import read_text

if TYPE_CHECKING:
    from servetune.engines.config import EngineConfig
    from servetune.workload.spec import WorkloadSpec

TIERS = ("roofline", "gpu")
# "published": the simulated figure at the row's own statistic; "median": the simulated
# median always (issue 15's held-out measure)
MEASURES = ("published", "median")
WITHIN_PCT = 25.0  # the "share of runs within 25%"
REQUESTS_PER_USER = 10  # the held-out set's measure: 10 x concurrency requests per run
PACKAGED = "data/published/gpu_runs.csv"
# The packaged set: vLLM, NIM and TensorRT-LLM runs, SGLang's (each engine its own group),
# and NVIDIA AIConfigurator's measured vLLM runs (scripts/vllm_runs_from_aic.py).
PACKAGED_FILES = ("gpu_runs.csv", "sglang_runs.csv", "aic_vllm_runs.csv")
# What produced a published figure besides servetune's engines: NVIDIA NIM, whose backend
# is not stated (`nim`) or is TensorRT-LLM (`nim-trtllm`). Every engine but SGLang is
# replayed with vLLM's scheduler model.
NIM_ENGINES = ("nim", "nim-trtllm")


class PublishedRun(BaseModel):
    """One published run (a CSV row), validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    source_url: str = Field(min_length=1)
    source_title: str = Field(min_length=1)
    published: str
    engine: str
    engine_version: str = ""
    model: str  # servetune catalog name
    source_model: str
    gpu: str  # servetune hardware name
    tp: int = Field(ge=1)
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = Field(None, ge=1)
    isl: int = Field(ge=1, le=MAX_TOKENS)
    osl: int = Field(ge=2, le=MAX_TOKENS)
    concurrency: int = Field(ge=1, le=MAX_REQUESTS)
    # None: 10 x concurrency, the held-out measure
    requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    stat: str = Field(pattern="^(mean|window-mean|median|median-itl|derived)$")
    role: str = Field(pattern="^(fit|check)$")
    note: str = ""

    @property
    def request_count(self) -> int:
        """The requests the run is replayed with: its own, else 10 x concurrency."""
        return self.requests or REQUESTS_PER_USER * self.concurrency

    @property
    def group(self) -> str:
        """Model x GPU, named with its engine when that is not vLLM: SGLang rows run SGLang's
        scheduler model, other engines' (NIM, TensorRT-LLM) run vLLM's and are checks of the
        step model only, so each is judged apart."""
        engine = "" if self.engine == "vllm" else f"{self.engine}: "
        return f"{engine}{self.model} x {self.gpu}"

    @property
    def band(self) -> str:
        """The run's load band (`sim.expected_error.band_of`): where the first round's burst
        (every user's first prompt queued at once) weighs on a measured mean, and how much."""
        return band_of(self.concurrency)

    @property
    def architecture(self) -> str:
        """The catalog model's kind, "dense models" or "MoE models": the held-out set is
        dense, and a MoE model's steps run kernels (fused experts, routing) a dense one never
        does, so the two are judged apart as well as together."""
        from servetune.model import get_model  # the catalog caches its specs

        return ARCHITECTURES[get_model(self.model).is_moe]


ARCHITECTURES = ("dense models", "MoE models")  # indexed by ModelSpec.is_moe


@dataclass(frozen=True)
class RunError:
    """One run under one tier: simulated figures and signed % errors (None: not published)."""

    run: PublishedRun
    tier: str
    sim_ttft_ms: float | None
    sim_tpot_ms: float | None
    ttft_err: float | None
    tpot_err: float | None
    refused: str = ""  # the simulator's one-line refusal (the config "would not start")


@dataclass(frozen=True)
class Summary:
    """Median |error|, median signed error (bias) and share within 25%, per figure."""

    runs: int
    refused: int  # runs the simulator refused to start (counted as misses in the shares)
    ttft_n: int
    tpot_n: int
    ttft_med: float | None
    tpot_med: float | None
    ttft_bias: float | None
    tpot_bias: float | None
    ttft_within: float | None  # share of runs, 0-1
    tpot_within: float | None
    both_within: float | None  # runs with both figures, both within


def load_runs(path: str | Path | None = None) -> list[PublishedRun]:
    """The packaged visible set (every file of PACKAGED_FILES), or a CSV with the same
    columns; one-line errors."""
    if path is None:
        folder = resources.files("servetune") / "data" / "published"
        return [
            run
            for name in PACKAGED_FILES
            for run in parse_runs((folder / name).read_text("utf-8"), f"data/published/{name}")
        ]
    p = Path(path)
    if not p.is_file():
        raise InputError("--published-file", f"{path} is not a file", None)
    return parse_runs(read_text(p, "--published-file"), str(path))


def parse_runs(text: str, where: str) -> list[PublishedRun]:
    """The runs of one CSV's text (`where` names it in errors), each checked as it will be
    replayed (`check_run`) and its id unique: a bad row is an error naming its line and
    column, never a row left out or counted twice."""
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise InputError("--published-file", f"{where} has no rows", "give a CSV with a header")
    out: list[PublishedRun] = []
    lines: dict[str, int] = {}  # id -> the line that gave it
    for n, raw in enumerate(rows, start=2):
        data = {k: (v if v != "" else None) for k, v in raw.items() if k is not None}
        for k in ("engine_version", "note"):
            data[k] = data.get(k) or ""
        row = f"{where} line {n}"
        try:
            run = PublishedRun(**data)
        except ValidationError as e:
            raise from_validation_error(e, row) from None
        if run.id in lines:
            raise InputError(
                f"{row}.id",
                f"{run.id!r} is also line {lines[run.id]}'s",
                "give each run its own id",
            )
        lines[run.id] = n
        check_run(run, row)
        out.append(run)
    return out


def check_run(run: PublishedRun, row: str) -> None:
    """What replaying `run` needs, checked when its file is read (`row` names it): a known
    engine, model and GPU, a figure to compare, an engine config and a workload that
    validate. Found later, a bad row would be a traceback from a worker process, or a
    refusal counted as the simulator's miss."""
    from servetune.engines.config import ENGINES
    from servetune.hardware import get_hardware
    from servetune.model import get_model

    engines = (*ENGINES, *NIM_ENGINES)
    if run.engine not in engines:
        raise InputError(
            f"{row}.engine", f"unknown engine {run.engine!r}", f"use one of {', '.join(engines)}"
        )
    if run.ttft_ms is None and run.tpot_ms is None:
        raise InputError(
            f"{row}.ttft_ms", "the row gives neither ttft_ms nor tpot_ms", "give either, in ms"
        )
    try:
        get_model(run.model)
    except InputError as e:
        raise InputError(f"{row}.model", e.problem, e.fix) from None
    try:
        get_hardware(run.gpu)
    except InputError as e:  # its fix names --hardware-file, which --published lacks
        raise InputError(f"{row}.gpu", e.problem, "use a name `servetune gpus` lists") from None
    try:
        engine_config(run)
    except ValidationError as e:
        raise from_validation_error(e, row, {"tensor_parallel_size": f"{row}.tp"}) from None
    try:
        workload(run)
    except ValidationError as e:  # the default count, 10 x concurrency, can be too many
        raise from_validation_error(e, row, {"count": f"{row}.requests"}) from None


def engine_config(run: PublishedRun) -> EngineConfig:
    """The engine `run` is replayed on: vLLM's defaults with the row's TP, quantization,
    KV dtype and context; SGLang's scheduler for SGLang rows."""
    from servetune.engines.config import EngineConfig

    knobs: dict[str, object] = {"tensor_parallel_size": run.tp}
    if run.engine == "sglang":  # SGLang's scheduler model; every other row runs vLLM's
        knobs["engine"] = "sglang"
    if run.engine in ("vllm", "sglang") and run.engine_version:
        knobs["engine_version"] = run.engine_version  # its release's CPU-side figures
    if run.quantization:
        knobs["quantization"] = run.quantization
    if run.kv_cache_dtype:
        knobs["kv_cache_dtype"] = run.kv_cache_dtype
    if run.max_model_len:
        knobs["max_model_len"] = run.max_model_len
    return EngineConfig(**knobs)


def workload(run: PublishedRun) -> WorkloadSpec:
    """`run` as a closed loop: `concurrency` users sending `requests` (default 10 x
    concurrency) requests of exactly its lengths."""
    from servetune.validate.cases import closed_workload, fixed_tokens

    return closed_workload(
        run.id,
        run.concurrency,
        run.request_count,
        fixed_tokens(run.isl),
        fixed_tokens(run.osl),
    )


def signed_pct(sim: float, real: float | None) -> float | None:
    """(sim - real) / real x 100, None when the source gives no figure."""
    return None if real is None else (sim - real) / real * 100.0


@dataclass(frozen=True)
class Replay:
    """A run's simulated figures under one tier, at every statistic a measure reads (ms),
    or the simulator's refusal. What `measure` reads of them is `read_at`."""

    ttft_mean: float = 0.0
    ttft_p50: float = 0.0
    tpot_mean: float = 0.0
    tpot_p50: float = 0.0
    itl_p50: float = 0.0
    refused: str = ""


def replay(run: PublishedRun, tier: str) -> Replay:
    """Replay `run` under `tier`: closed loop, fixed lengths, vLLM defaults otherwise."""
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate

    model, gpu = get_model(run.model), get_hardware(run.gpu)  # both checked by `check_run`
    try:
        res, _ = simulate(model, gpu, engine_config(run), workload(run), tier=tier)
    except InputError as e:  # the real engine ran: a refusal is a miss, shown apart
        return Replay(refused=str(e))
    m = res.metrics
    if not m.completed:  # every request refused (longer than the context): no figure to
        # compare, where 0 ms read as a -100% error and pulled every median down
        why = ", ".join(f"{k} {v}" for k, v in sorted(m.errors_by_class.items())) or "none"
        return Replay(refused=f"the simulated engine completed no request (errors: {why})")
    return Replay(
        m.ttft_ms.mean or 0.0,
        m.ttft_ms.p50 or 0.0,
        m.tpot_ms.mean or 0.0,
        m.tpot_ms.p50 or 0.0,
        m.itl_ms.p50 or 0.0,
    )


def read_at(run: PublishedRun, tier: str, rep: Replay, measure: str = "published") -> RunError:
    """`rep` read at `measure` (MEASURES) against `run`'s published figures."""
    if rep.refused:
        return RunError(run, tier, None, None, None, None, refused=rep.refused)
    if measure == "published" and run.stat == "mean":
        # a whole run's mean holds the first round's burst, which a median leaves out
        # (docs/fidelity-gpu.md)
        ttft, tpot = rep.ttft_mean, rep.tpot_mean
    else:
        ttft, tpot = rep.ttft_p50, rep.tpot_p50
    if run.stat == "median-itl":  # the published figure is an ITL median, whatever the measure
        tpot = rep.itl_p50
    return RunError(
        run, tier, ttft, tpot, signed_pct(ttft, run.ttft_ms), signed_pct(tpot, run.tpot_ms)
    )


# Replays already made in this process, by (run, tier): a replay is pure (seeded), so
# reading the same runs at another measure, or printing them again, simulates nothing anew.
_REPLAYED: dict[tuple[PublishedRun, str], Replay] = {}


def replayed(run: PublishedRun, tier: str) -> Replay:
    """`run` replayed under `tier`, once per process."""
    key = (run, tier)
    if key not in _REPLAYED:
        _REPLAYED[key] = replay(run, tier)
    return _REPLAYED[key]


def simulate_run(run: PublishedRun, tier: str, measure: str = "published") -> RunError:
    """Replay `run` under `tier` (once per process) and read it at `measure`."""
    return read_at(run, tier, replayed(run, tier), measure)


def _med(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _share_of(hits: int, n: int) -> float | None:
    return hits / n if n else None


def _share(xs: Sequence[float], misses: int = 0) -> float | None:
    """Share of runs within 25%: `xs` the signed errors, `misses` runs counted outside."""
    return _share_of(sum(abs(x) <= WITHIN_PCT for x in xs), len(xs) + misses)


def summarize(errors: Iterable[RunError]) -> Summary:
    """The figures the issue judges by, over `errors` (one tier)."""
    errs = list(errors)
    ran = [e for e in errs if not e.refused]
    refused = [e.run for e in errs if e.refused]
    tt = [e.ttft_err for e in ran if e.ttft_err is not None]
    tp = [e.tpot_err for e in ran if e.tpot_err is not None]
    both = [e for e in ran if e.ttft_err is not None and e.tpot_err is not None]
    both_ok = [
        abs(e.ttft_err) <= WITHIN_PCT and abs(e.tpot_err) <= WITHIN_PCT  # type: ignore[arg-type]
        for e in both
    ]
    # A refused run is outside 25% on every figure it publishes.
    miss_tt = sum(r.ttft_ms is not None for r in refused)
    miss_tp = sum(r.tpot_ms is not None for r in refused)
    miss_both = sum(r.ttft_ms is not None and r.tpot_ms is not None for r in refused)
    return Summary(
        runs=len(errs),
        refused=len(refused),
        ttft_n=len(tt),
        tpot_n=len(tp),
        ttft_med=_med([abs(x) for x in tt]),
        tpot_med=_med([abs(x) for x in tp]),
        ttft_bias=_med(tt),
        tpot_bias=_med(tp),
        ttft_within=_share(tt, miss_tt),
        tpot_within=_share(tp, miss_tp),
        both_within=_share_of(sum(both_ok), len(both_ok) + miss_both),
    )


def by_key(errors: Iterable[RunError], key: str) -> dict[str, Summary]:
    """Summaries per value of `key`: "group" (model x GPU), "role" (fit / check), "engine"
    (what produced the published figure) or "band" (load)."""
    buckets: dict[str, list[RunError]] = {}
    for e in errors:
        k = getattr(e.run, key)
        buckets.setdefault(k, []).append(e)
    return {k: summarize(v) for k, v in sorted(buckets.items())}


def vllm_by(errors: Iterable[RunError], key: str, order: Sequence[str]) -> dict[str, Summary]:
    """The vLLM rows (what a prediction quotes) per value of `key`, in `order`."""
    split = by_key((e for e in errors if e.run.engine == "vllm"), key)
    return {k: split[k] for k in order if k in split}


def vllm_bands(errors: Iterable[RunError]) -> dict[str, Summary]:
    """The vLLM rows per load band, lightest first."""
    return vllm_by(errors, "band", band_labels())


def vllm_architectures(errors: Iterable[RunError]) -> dict[str, Summary]:
    """The vLLM rows of dense models (the held-out set's kind) and of MoE models."""
    return vllm_by(errors, "architecture", ARCHITECTURES)


def evaluate(
    runs: Sequence[PublishedRun],
    tiers: Sequence[str] = TIERS,
    measure: str = "published",
    jobs: int = 1,
) -> dict[str, list[RunError]]:
    """Every run under every tier, read at `measure`, in the runs' order. With `jobs` > 1
    the replays run in that many processes: each is independent and pure, and the packaged
    set is ~1,230 of them at ~40 ms (50 s on one core). Spawned, not forked: the caller may
    hold threads (a test server, a live view). Runs replayed before in this process are
    read again, not replayed (`simulate_run`)."""
    tasks = [(r, t) for t in tiers for r in runs]
    todo = list(dict.fromkeys(k for k in tasks if k not in _REPLAYED))
    workers = min(jobs, len(todo))
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
            chunk = max(1, len(todo) // (4 * workers))
            made = pool.map(replay, [r for r, _ in todo], [t for _, t in todo], chunksize=chunk)
            _REPLAYED.update(zip(todo, made, strict=True))
    done = [simulate_run(r, t, measure) for r, t in tasks]
    out: dict[str, list[RunError]] = {t: [] for t in tiers}
    for e in done:
        out[e.tier].append(e)
    return out


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.0f}%" if signed else f"{v:.0f}%"


def _share_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def summary_line(name: str, s: Summary) -> str:
    runs = f"{s.runs}" + (f"-{s.refused}" if s.refused else "")
    return (
        f"{name:<42} {runs:>5} {_pct(s.ttft_med):>6} {_pct(s.ttft_bias, True):>6} "
        f"{_share_s(s.ttft_within):>6} {_pct(s.tpot_med):>6} {_pct(s.tpot_bias, True):>6} "
        f"{_share_s(s.tpot_within):>6} {_share_s(s.both_within):>6}"
    )


HEADER = (
    f"{'':<42} {'runs':>5} {'TTFT':>6} {'bias':>6} {'<=25%':>6} {'TPOT':>6} {'bias':>6} "
    f"{'<=25%':>6} {'both':>6}"
)


MEASURE_LINES = {
    "published": "each run read at the statistic its source published (a mean as a mean)",
    "median": "each run read at the simulated median (issue 15's held-out measure)",
}


def format_report(results: dict[str, list[RunError]], measure: str = "published") -> str:
    """Per tier: all runs, fit and check rows apart, and each model x GPU group; median
    |error| of TTFT and TPOT, their bias and the share of runs within 25%."""
    lines = [
        "median |error| (bias = median signed error) vs published runs; "
        "runs N-k: k refused by the simulator",
        MEASURE_LINES[measure],
        HEADER,
    ]
    for tier, errs in results.items():
        lines.append(summary_line(f"[{tier}] all", summarize(errs)))
        for k, s in by_key(errs, "role").items():
            lines.append(summary_line(f"  {k} rows", s))
        for k, s in by_key(errs, "engine").items():
            lines.append(summary_line(f"  {k} rows", s))
        for k, s in vllm_bands(errs).items():
            lines.append(summary_line(f"  vllm rows at {k}", s))
        for k, s in vllm_architectures(errs).items():
            lines.append(summary_line(f"  vllm rows, {k}", s))
        for k, s in by_key(errs, "group").items():
            lines.append(summary_line(f"  {k}", s))
    return "\n".join(lines)


def format_runs(results: dict[str, list[RunError]]) -> str:
    """One line per run and tier: published vs simulated TTFT and TPOT, ms."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    lines = [f"{'run':<38} {'tier':<8} {'TTFT pub/sim ms':>22} {'TPOT pub/sim ms':>18}"]
    for tier, errs in results.items():
        for e in errs:
            r = e.run
            line = (
                f"{r.id:<38} {tier:<8} {ms(r.ttft_ms):>10}/{ms(e.sim_ttft_ms):<11} "
                f"{ms(r.tpot_ms):>8}/{ms(e.sim_tpot_ms):<9}"
            )
            lines.append(line + (f"  refused: {e.refused}" if e.refused else ""))
    return "\n".join(lines)
