"""How far a closed loop's median TTFT sits below its mean, in real vLLM runs and in the
simulator: what issue 15's held-out measure (a simulated median against a measured mean)
reads for a simulator that is exact in its median.

data/published/ttft_spread.csv holds public `vllm bench serve` closed loops (fixed lengths,
`--max-concurrency`, request rate inf) that print both "Mean TTFT" and "Median TTFT", on
any accelerator: the spread is the benchmark's first round (every user's first prompt
queued at once) and the prompts that queue behind another's prefill, which the engine's
scheduler sets; the accelerator sets the scale of both figures, not much their ratio. None
of these rows can be replayed (their accelerators or models are not in the catalogs); they
are set beside the simulated ratio of the visible set's vLLM closed loops, per load band.

Pure apart from `load_spread` (reads the CSV); the simulated side reads the replays
`validate.published` made (`published.replayed`).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.sim.expected_error import band_labels, band_of
from servetune.validate.published import PublishedRun, replayed

PACKAGED = "ttft_spread.csv"


def is_loop(requests: int, users: int) -> bool:
    """More requests than users: a closed loop. As many is one burst (every prompt queued
    at once, GPUStack's runs), whose median is the middle of one queue."""
    return requests > users


class SpreadRun(BaseModel):
    """One public closed loop with both its mean and its median TTFT (a CSV row)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    # "": a public file found by its text in a code index that gives no address; its
    # title and the figures quoted name it
    source_url: str = ""
    source_title: str = Field(min_length=1)
    engine_version: str = ""
    accelerator: str = Field(min_length=1)
    model: str = Field(min_length=1)  # as the source names it
    tp: int | None = Field(None, ge=1)
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    requests: int = Field(ge=1)
    ttft_mean_ms: float = Field(gt=0)
    ttft_median_ms: float = Field(gt=0)
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.ttft_median_ms / self.ttft_mean_ms


@dataclass(frozen=True)
class Spread:
    """Median TTFT / mean TTFT over a band's runs: how many, their median and range, and
    the median run's rounds (requests per user: the fewer, the more of a run is its first
    round's burst)."""

    runs: int
    median: float | None
    low: float | None
    high: float | None
    rounds: float | None


def load_spread() -> list[SpreadRun]:
    """The packaged rows."""
    text = (resources.files("servetune") / "data" / "published" / PACKAGED).read_text("utf-8")
    return parse_spread(text, f"data/published/{PACKAGED}")


def parse_spread(text: str, where: str) -> list[SpreadRun]:
    """The rows of one CSV's text (`where` names it in errors); a bad row, a burst or a
    repeated id is a one-line error naming its line and column."""
    out: list[SpreadRun] = []
    seen: set[str] = set()
    for n, raw in enumerate(csv.DictReader(text.splitlines()), start=2):
        row_at = f"{where} line {n}"
        try:
            row = SpreadRun(**{k: v for k, v in raw.items() if v != ""})
        except ValidationError as e:
            raise from_validation_error(e, row_at) from None
        if not is_loop(row.requests, row.concurrency):
            raise InputError(
                f"{row_at}.requests",
                f"{row.requests} requests from {row.concurrency} users is one burst",
                "give closed loops: more requests than users",
            )
        if row.id in seen:
            raise InputError(f"{row_at}.id", f"{row.id!r} is given twice", "give each its own id")
        seen.add(row.id)
        out.append(row)
    return out


# One run: its users, its median / mean TTFT and its rounds (requests per user).
Point = tuple[int, float, float]


def spread_of(points: Sequence[Point]) -> Spread:
    """The median and range of the points' ratios, and their median rounds (no runs: no
    figures)."""
    if not points:
        return Spread(0, None, None, None, None)
    ratios = [r for _, r, _ in points]
    rounds = statistics.median(n for _, _, n in points)
    return Spread(len(ratios), statistics.median(ratios), min(ratios), max(ratios), rounds)


def by_band(points: Iterable[Point]) -> dict[str, Spread]:
    """Runs summed up per load band, lightest first, and over all."""
    bands: dict[str, list[Point]] = {b: [] for b in band_labels()}
    for p in points:
        bands[band_of(p[0])].append(p)
    every = [p for ps in bands.values() for p in ps]
    return {"all": spread_of(every)} | {b: spread_of(ps) for b, ps in bands.items()}


def published_spread(rows: Iterable[SpreadRun]) -> dict[str, Spread]:
    """The public runs' median / mean TTFT per load band."""
    return by_band((r.concurrency, r.ratio, r.requests / r.concurrency) for r in rows)


def simulated_spread(runs: Iterable[PublishedRun], tier: str) -> dict[str, Spread]:
    """The simulated median / mean TTFT of the visible set's vLLM closed loops (not its
    bursts) under `tier`, per load band."""
    points = []
    for run in runs:
        if run.engine != "vllm" or not is_loop(run.request_count, run.concurrency):
            continue
        rep = replayed(run, tier)
        if not rep.refused and rep.ttft_mean > 0:
            ratio = rep.ttft_p50 / rep.ttft_mean
            points.append((run.concurrency, ratio, run.request_count / run.concurrency))
    return by_band(points)


def spreads(
    runs: Sequence[PublishedRun], tiers: Iterable[str]
) -> tuple[dict[str, Spread], dict[str, dict[str, Spread]]]:
    """The packaged public runs' spread per band, and each tier's simulated one over `runs`
    (replayed once per process: `validate --published` has already replayed them)."""
    return published_spread(load_spread()), {t: simulated_spread(runs, t) for t in tiers}


def _cell(s: Spread) -> str:
    if s.median is None or s.low is None or s.high is None or s.rounds is None:
        return f"{'-':>32}"
    return f"{s.runs:>5} {s.median:>6.2f} {s.low:>5.2f}..{s.high:<5.2f} {s.rounds:>6.1f}"


def format_spread(published: dict[str, Spread], simulated: dict[str, dict[str, Spread]]) -> str:
    """Per load band: the public runs' median / mean TTFT, each tier's simulated one, and
    what the held-out measure reads for a simulator exact in its median (the public ratio
    less one)."""
    tiers = list(simulated)
    lines = [
        "median TTFT / mean TTFT of closed loops (runs, median, range, the median run's",
        "rounds): public vllm bench serve runs on any accelerator",
        f"(data/published/{PACKAGED}) and the visible set's vLLM loops simulated; `exact`:",
        "what issue 15's held-out measure (a simulated median against a measured mean) reads",
        "for a simulator exact in its median",
        f"{'':<16} {'public runs':>32}"
        + "".join(f" {'[' + t + ']':>32}" for t in tiers)
        + f" {'exact':>6}",
    ]
    for band, s in published.items():
        exact = "-" if s.median is None else f"{(s.median - 1) * 100:+.0f}%"
        cells = "".join(f" {_cell(simulated[t][band])}" for t in tiers)
        lines.append(f"{band:<16} {_cell(s)}{cells} {exact:>6}")
    return "\n".join(lines)
