"""Real forward passes against the step model: the visible set's step rows.

Two packaged files, one row form:
- data/published/vllm_steps.csv: the median wall time of a group of identical vLLM forward
  passes measured on real GPUs (a lone prefill of N tokens, or a decode-only pass of B
  sequences at a given context), with its source. Scope `step`: checked against the
  tier's full step time (`StepModel.time_s`, CPU side included, as the simulator uses it).
- data/published/device_steps.csv: servetune's own forward passes on a real H200
  (scripts/measure_gpu_kernels.py: one GPU's shard of a model in PyTorch, CUDA graphs,
  compiled elementwise kernels; decode, prefill and mixed steps). Scope `kernels`: checked
  against the tier's kernels alone (`GpuStepModel.kernels_s`: no engine CPU side, no
  all-reduce), which only the gpu tier prices apart.

Unlike the published runs (`validate.published`), which judge a whole closed loop, a step
row checks one step's price directly. None of them set a figure.

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

PACKAGED = ("vllm_steps.csv", "device_steps.csv")


class StepPoint(BaseModel):
    """One measured pass (a CSV row), validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str
    engine: Literal["vllm", "torch"]
    version: str
    model: str
    gpu: str
    tp: int = Field(ge=1)
    quantization: str = ""
    # what the measured time holds: a whole engine step, or one GPU's kernels of it
    scope: Literal["step", "kernels"] = "step"
    # a mixed pass: a lone prefill chunk beside the decodes (chunked prefill)
    kind: Literal["prefill", "decode", "mixed"]
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
    """The packaged step rows; one-line errors naming the file and line."""
    out = []
    for name in PACKAGED:
        text = (resources.files("servetune") / "data" / "published" / name).read_text("utf-8")
        for n, raw in enumerate(csv.DictReader(text.splitlines()), start=2):
            try:
                out.append(StepPoint(**raw))
            except ValidationError as e:
                raise from_validation_error(e, f"data/published/{name} line {n}") from None
    return out


def simulate_step(p: StepPoint, tier: str) -> StepError | None:
    """The tier's price of the row's pass on its model, GPU, TP and quantisation (vLLM
    defaults otherwise); None where the tier does not price the row's scope apart."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import setup
    from servetune.sim.steptime import chunk_attn_pairs

    knobs: dict[str, object] = {"tensor_parallel_size": p.tp}
    if p.quantization:
        knobs["quantization"] = p.quantization
    sm = setup(get_model(p.model), get_hardware(p.gpu), EngineConfig(**knobs), tier=tier).step_model
    n, b = p.prefill_tokens, p.decode_seqs
    kv = float(b * p.context_per_seq)
    chunk = chunk_attn_pairs(0, n)  # the prefill's own pairs, n (n+1)/2, as the scheduler's
    if p.scope == "kernels":
        if not hasattr(sm, "kernels_s"):
            return None
        seconds = sm.kernels_s(n, b, kv, kv + chunk, chunk)
    elif p.kind == "decode":
        seconds = sm.decode_time_s(b, kv)
    else:
        seconds = sm.time_s(n, b, kv, kv + chunk, chunk)
    ms = seconds * 1e3
    return StepError(p, tier, ms, signed_pct(ms, p.measured_ms) or 0.0)


def evaluate_steps(points: Sequence[StepPoint], tiers: Sequence[str]) -> dict[str, list[StepError]]:
    """Every row under every tier that prices its scope."""
    out: dict[str, list[StepError]] = {}
    for t in tiers:
        errs = (simulate_step(p, t) for p in points)
        out[t] = [e for e in errs if e is not None]
    return out


def format_steps(results: dict[str, list[StepError]]) -> str:
    """Per tier, scope and kind of pass: rows, median |error|, median signed error, worst
    row."""
    lines = [
        "real forward passes vs the tier's step time: vLLM's (data/published/vllm_steps.csv),"
        " and servetune's own on an H200, kernels only (data/published/device_steps.csv)",
        f"{'':<42} {'rows':>5} {'|error|':>8} {'bias':>6} {'worst':>7}",
    ]
    for tier, errs in results.items():
        for scope, label in (("step", "passes"), ("kernels", "kernels")):
            for kind in ("decode", "prefill", "mixed"):
                sel = [e for e in errs if e.point.kind == kind and e.point.scope == scope]
                if not sel:
                    continue
                xs = [e.err for e in sel]
                gpus = sorted({e.point.gpu for e in sel})
                name = f"[{tier}] {kind} {label} ({', '.join(gpus)})"
                med = statistics.median(abs(x) for x in xs)
                worst = max(xs, key=abs)
                lines.append(
                    f"{name:<42} {len(xs):>5} {med:>7.0f}% {statistics.median(xs):>+5.0f}% "
                    f"{worst:>+6.0f}%"
                )
    return "\n".join(lines)
