"""Real vLLM forward passes against the step model: the visible set's step rows.

Each row of data/published/vllm_steps.csv is the median wall time of a group of identical
vLLM forward passes measured on real GPUs (a lone prefill of N tokens, or a decode-only
pass of B sequences at a given context), with its source. Unlike the published runs
(`validate.published`), which judge a whole closed loop, a step row checks one step's
price directly: the tier's full step time (`StepModel.time_s`, CPU side included, as the
simulator uses it) against the measured pass. None of them set a figure.

Pure apart from `load_steps` (reads the CSV) and `simulate_step` (builds the step model).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servetune.errors import from_validation_error
from servetune.validate.published import signed_pct

PACKAGED = "vllm_steps.csv"


class StepPoint(BaseModel):
    """One measured pass (a CSV row), validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str
    engine: Literal["vllm"]
    version: str
    model: str
    gpu: str
    tp: int = Field(ge=1)
    kind: Literal["prefill", "decode"]
    prefill_tokens: int = Field(ge=0)
    decode_seqs: int = Field(ge=0)
    context_per_seq: int = Field(ge=0)
    passes: int = Field(ge=1)
    measured_ms: float = Field(gt=0)


@dataclass(frozen=True)
class StepError:
    """One row under one tier: the simulated step and its signed error (%)."""

    point: StepPoint
    tier: str
    sim_ms: float
    err: float


def load_steps() -> list[StepPoint]:
    """The packaged step rows; one-line errors naming the line."""
    text = (resources.files("servetune") / "data" / "published" / PACKAGED).read_text("utf-8")
    out = []
    for n, raw in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            out.append(StepPoint(**raw))
        except ValidationError as e:
            raise from_validation_error(e, f"data/published/{PACKAGED} line {n}") from None
    return out


def simulate_step(p: StepPoint, tier: str) -> StepError:
    """The tier's price of the row's pass on its model, GPU and TP (vLLM defaults)."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import setup
    from servetune.sim.steptime import chunk_attn_pairs

    sm = setup(
        get_model(p.model), get_hardware(p.gpu), EngineConfig(tensor_parallel_size=p.tp), tier=tier
    ).step_model
    if p.kind == "prefill":
        n = p.prefill_tokens
        seconds = sm.time_s(n, 0, 0.0, chunk_attn_pairs(0, n), float(n) ** 2)
    else:
        seconds = sm.decode_time_s(p.decode_seqs, float(p.decode_seqs * p.context_per_seq))
    ms = seconds * 1e3
    return StepError(p, tier, ms, signed_pct(ms, p.measured_ms) or 0.0)


def evaluate_steps(points: Sequence[StepPoint], tiers: Sequence[str]) -> dict[str, list[StepError]]:
    """Every row under every tier."""
    return {t: [simulate_step(p, t) for p in points] for t in tiers}


def format_steps(results: dict[str, list[StepError]]) -> str:
    """Per tier and kind of pass: rows, median |error|, median signed error, worst row."""
    lines = [
        "real vLLM forward passes (data/published/vllm_steps.csv) vs the tier's step time",
        f"{'':<42} {'rows':>5} {'|error|':>8} {'bias':>6} {'worst':>7}",
    ]
    for tier, errs in results.items():
        for kind in ("decode", "prefill"):
            xs = [e.err for e in errs if e.point.kind == kind]
            if not xs:
                continue
            gpus = sorted({e.point.gpu for e in errs if e.point.kind == kind})
            name = f"[{tier}] {kind} passes ({', '.join(gpus)})"
            med = statistics.median(abs(x) for x in xs)
            worst = max(xs, key=abs)
            lines.append(
                f"{name:<42} {len(xs):>5} {med:>7.0f}% {statistics.median(xs):>+5.0f}% "
                f"{worst:>+6.0f}%"
            )
    return "\n".join(lines)
