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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from servetune.engines.config import EngineConfig
from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.measure.result import PointResult

ObjectiveKind = Literal["goodput", "cost", "latency"]
OBJECTIVES: tuple[str, ...] = ("goodput", "cost", "latency")


def gpus_of(cfg: EngineConfig) -> int:
    """Devices one replica occupies (TP x PP x DP); a CPU host counts as one."""
    return cfg.tensor_parallel_size * cfg.pipeline_parallel_size * cfg.data_parallel_size


@dataclass(frozen=True)
class Objective:
    kind: ObjectiveKind = "goodput"
    gpu_hour_usd: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise InputError("--objective", f"unknown {self.kind!r}", "goodput, cost or latency")
        if self.kind == "cost" and not self.gpu_hour_usd:
            raise InputError("--gpu-hour-usd", "the cost objective needs $/GPU-hour", "e.g. 2.5")
        if self.gpu_hour_usd is not None and self.gpu_hour_usd <= 0:
            raise InputError("--gpu-hour-usd", "must be > 0")

    @property
    def higher_is_better(self) -> bool:
        """Whether the objective's own metric (what repetitions average: req/s/GPU, $ per
        1M tokens, P95 TTFT ms) is better higher; scores are that metric, negated if not."""
        return self.kind == "goodput"

    @property
    def searches_capacity(self) -> bool:
        return self.kind != "latency"

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

    def show(self, score: float | None) -> str:
        if score is None:
            return "-"
        if self.kind == "goodput":
            return f"{score:.3g} req/s/GPU"
        if self.kind == "cost":
            return f"${-score:.3g}/1M tok"
        return f"P95 TTFT {-score:,.0f} ms"

    @property
    def label(self) -> str:
        return {
            "goodput": "goodput per GPU",
            "cost": "cost per 1M tokens",
            "latency": "P95 TTFT",
        }[self.kind]
