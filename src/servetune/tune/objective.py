"""What the tuner maximises, from one measured point.

- `goodput` (default): requests per second that met every per-request SLO threshold, per
  GPU (DESIGN.md: errors and timeouts are misses), at a load whose percentiles pass.
- `cost`: dollars per 1M output tokens served within the SLO, given $/GPU-hour
  (tokens/s within the SLO = output tok/s x SLO attainment); lower is better, so the
  score is its negative.
- `latency`: for chat-like presets, the lowest P95 TTFT at the workload's own load (no
  capacity search); score = -P95 TTFT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from servetune.engines.config import EngineConfig
from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.measure.result import PointResult
    from servetune.tune.trial import TrialResult

ObjectiveKind = Literal["goodput", "cost", "latency"]
OBJECTIVES: tuple[str, ...] = ("goodput", "cost", "latency")


def gpus_of(cfg: EngineConfig) -> int:
    """Devices one replica occupies (TP x PP x DP); a CPU host counts as one."""
    return cfg.tensor_parallel_size * cfg.pipeline_parallel_size * cfg.data_parallel_size


# How each objective's own metric reads: its axis, and the margin words (better, worse).
_AXIS = {
    "goodput": "goodput per GPU (req/s/GPU), higher is better",
    "cost": "cost ($ per 1M output tokens), lower is better",
    "latency": "P95 TTFT (ms), lower is better",
}
_MARGIN_WORDS = {
    "goodput": ("more goodput per GPU", "less goodput per GPU"),
    "cost": ("cheaper", "more expensive"),
    "latency": ("lower P95 TTFT", "higher P95 TTFT"),
}


@dataclass(frozen=True)
class ObjectiveMetric:
    """How an objective's figures are shown, from its kind alone (a report knows no price).

    Scores are higher-is-better: the metric itself for goodput, its negative for cost and
    latency. Every display converts a score back to the metric's own value and unit
    (`value`) before it prints, plots or compares it."""

    kind: ObjectiveKind = "goodput"

    @property
    def higher_is_better(self) -> bool:
        """Whether the objective's own metric (what repetitions average: req/s/GPU, $ per
        1M tokens, P95 TTFT ms) is better higher; scores are that metric, negated if not."""
        return self.kind == "goodput"

    @property
    def searches_capacity(self) -> bool:
        return self.kind != "latency"

    @property
    def label(self) -> str:
        return {
            "goodput": "goodput per GPU",
            "cost": "cost per 1M tokens",
            "latency": "P95 TTFT",
        }[self.kind]

    @property
    def axis_title(self) -> str:
        return _AXIS[self.kind]

    def value(self, score: float | None) -> float | None:
        """The metric's own value (req/s/GPU, $ per 1M output tokens, ms) of a score."""
        if score is None:
            return None
        return score if self.higher_is_better else -score

    def text(self, value: float | None) -> str:
        """A value of the metric in its unit: `1.2 req/s/GPU`, `$0.0885/1M tok`, `P95 TTFT
        86 ms`."""
        if value is None:
            return "-"
        if self.kind == "goodput":
            return f"{value:.3g} req/s/GPU"
        if self.kind == "cost":
            return f"${value:.3g}/1M tok"
        return f"P95 TTFT {value:,.0f} ms"

    def show(self, score: float | None) -> str:
        return self.text(self.value(score))

    def margin(self, winner: float | None, other: float | None) -> str:
        """The winner's margin over another config, both as the metric's own values, in
        words that say which way is better: `32% more goodput per GPU` (winner / other -
        1), `89% cheaper` ($0.0885 against $0.804), `40% lower P95 TTFT`."""
        if winner is None or other is None or not other:
            return "n/a"
        if not (math.isfinite(winner) and math.isfinite(other)):  # a repetition that failed
            return "n/a"
        change = (winner - other) / abs(other)
        size = f"{abs(change):.0%}"
        if size == "0%":
            return f"the same {self.label} to within 0.5%"
        better = change > 0 if self.higher_is_better else change < 0
        return f"{size} {_MARGIN_WORDS[self.kind][0 if better else 1]}"

    def capacity_of(self, t: TrialResult) -> float | None:
        """A trial's capacity under the SLO, None for an objective that searches none (the
        latency trial's one load is the workload's own, not a capacity)."""
        return t.capacity if self.searches_capacity else None


@dataclass(frozen=True)
class Objective(ObjectiveMetric):
    gpu_hour_usd: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise InputError("--objective", f"unknown {self.kind!r}", "goodput, cost or latency")
        if self.kind == "cost" and not self.gpu_hour_usd:
            raise InputError("--gpu-hour-usd", "the cost objective needs $/GPU-hour", "e.g. 2.5")
        if self.gpu_hour_usd is not None and self.gpu_hour_usd <= 0:
            raise InputError("--gpu-hour-usd", "must be > 0")

    def score(self, p: PointResult, cfg: EngineConfig) -> float | None:
        """Higher is better; None when the point does not meet the SLO."""
        if not p.passed:
            return None
        g = gpus_of(cfg)
        if self.kind == "goodput":
            return (p.goodput_req_s or 0.0) / g
        if self.kind == "cost":
            tok_s = p.output_tok_s * (p.attainment or 0.0)
            return -self.cost_per_m(tok_s, g) if tok_s > 0 else None
        return -p.ttft_p95_ms if p.ttft_p95_ms is not None else None

    def cost_per_m(self, tok_s: float, gpus: int) -> float:
        """$ per 1M tokens = $/GPU-h x GPUs / (tok/s x 3600 s/h) x 1e6."""
        assert self.gpu_hour_usd is not None
        return self.gpu_hour_usd * gpus / (tok_s * 3600.0) * 1e6
