"""Seed 003 §2's acceptance rule for a quantized (or otherwise cheaper) model, as one pure
function of the measured numbers:

  质量下降不超过业务阈值,吞吐或可承载并发提升至少15%至20%,单位token成本下降,
  且P99延迟和错误率没有明显恶化。
  (quality drops no more than the business threshold; throughput or the concurrency carried
  rises by at least 15-20%; cost per token falls; P99 latency and the error rate do not get
  clearly worse.)

The seed gives no figure for "clearly worse"; the defaults below are ours and are flags.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# Seed 003 §2: "at least 15% to 20%"; the rule takes the lower end, --min-gain raises it.
MIN_THROUGHPUT_GAIN = 0.15
# Our reading of "not clearly worse": P99 up by at most 5%, errors up by at most 0.5 points.
P99_TOLERANCE = 0.05
ERROR_RATE_TOLERANCE = 0.005
# The business threshold when none is given: perplexity up by at most 5%. (For scale:
# llama.cpp's quantize README lists Q4_K_M at about +0.05 ppl on a 7B model, Q2_K well
# over +0.5.)
MAX_PPL_INCREASE = 0.05

PASS, FAIL, UNMEASURED = "pass", "fail", "not measured"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | fail | not measured
    evidence: str


@dataclass(frozen=True)
class Perf:
    """What the rule reads from one stored run."""

    output_tok_s: float | None
    p99_e2e_ms: float | None
    error_rate: float | None
    gpu_count: int

    @classmethod
    def from_metrics(cls, m: Mapping[str, Any], gpu_count: int | None) -> Perf:
        e2e = m.get("e2e_ms") or {}
        return cls(m.get("output_tok_s"), e2e.get("p99"), m.get("error_rate"), gpu_count or 1)

    @property
    def cost_per_mtok(self) -> float | None:
        """Device-seconds per million output tokens: cost per token at one price per
        device-second (the same hardware on both sides). A run that served no tokens
        (every request failed) measured an infinite cost, not a missing one."""
        if self.output_tok_s is None:
            return None
        if self.output_tok_s == 0:
            return math.inf
        return self.gpu_count / self.output_tok_s * 1e6


@dataclass(frozen=True)
class Verdict:
    verdict: str  # accepted | rejected | incomplete (quality passed, performance unproven)
    checks: tuple[Check, ...]

    @property
    def quality(self) -> str:
        return self.checks[0].status

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "checks": [asdict(c) for c in self.checks]}


def judge(
    ppl_increase: float,
    threshold: float,
    base: Perf | None,
    cand: Perf | None,
    *,
    min_gain: float = MIN_THROUGHPUT_GAIN,
    p99_tolerance: float = P99_TOLERANCE,
    error_tolerance: float = ERROR_RATE_TOLERANCE,
) -> Verdict:
    """The §2 rule: every check must pass; a check without numbers is `not measured`."""
    q = PASS if ppl_increase <= threshold else FAIL
    checks = [Check("quality", q, f"perplexity {ppl_increase:+.1%} vs threshold {threshold:+.1%}")]
    if base is None or cand is None:
        why = "give --baseline-run and --candidate-run (stored bench runs of each model)"
        checks += [Check(n, UNMEASURED, why) for n in ("throughput", "cost", "p99", "errors")]
    else:
        checks += [
            _rise("throughput", base.output_tok_s, cand.output_tok_s, min_gain, "output tok/s"),
            _fall("cost", base.cost_per_mtok, cand.cost_per_mtok, 0.0, "device-s per 1M tokens"),
            _fall("p99", base.p99_e2e_ms, cand.p99_e2e_ms, p99_tolerance, "E2E P99 ms"),
            _errors(base.error_rate, cand.error_rate, error_tolerance),
        ]
    statuses = {c.status for c in checks}
    verdict = (
        "rejected" if FAIL in statuses else "incomplete" if UNMEASURED in statuses else "accepted"
    )
    return Verdict(verdict, tuple(checks))


def _ok(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


DEAD_BASELINE = "the baseline run served no tokens, nothing to compare with (rerun the baseline)"


def _rise(name: str, b: float | None, c: float | None, need: float, what: str) -> Check:
    if not (_ok(b) and _ok(c)):
        return Check(name, UNMEASURED, f"{what} missing in a run")
    if b == 0:  # measured, but nothing to compare with: a dead baseline accepts nothing
        return Check(name, UNMEASURED, f"{what} 0 -> {c:.4g}: {DEAD_BASELINE}")
    gain = c / b - 1  # type: ignore[operator]
    status = PASS if gain >= need else FAIL
    return Check(name, status, f"{what} {b:.4g} -> {c:.4g} ({gain:+.1%}, need >= {need:+.0%})")


def _fall(name: str, b: float | None, c: float | None, slack: float, what: str) -> Check:
    """`c` must be below `b` (cost), or at most `slack` above it (P99). An infinite cost
    is a run that served no tokens: measured, and never below another."""
    if not (_known(b) and _known(c)):
        return Check(name, UNMEASURED, f"{what} missing in a run")
    if b == math.inf:
        return Check(name, UNMEASURED, f"{what} {_cost(b)} -> {_cost(c)}: {DEAD_BASELINE}")
    if c == math.inf:  # the candidate served nothing: measured, and never cheaper
        return Check(name, FAIL, f"{what} {_cost(b)} -> {_cost(c)}")
    if not b:
        return Check(name, UNMEASURED, f"{what} missing in a run")
    change = c / b - 1  # type: ignore[operator]
    status = PASS if (change < 0 if slack == 0 else change <= slack) else FAIL
    limit = "must fall" if slack == 0 else f"at most {slack:+.0%}"
    return Check(name, status, f"{what} {b:.4g} -> {c:.4g} ({change:+.1%}, {limit})")


def _known(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def _cost(x: float) -> str:
    return "inf (no tokens served)" if x == math.inf else f"{x:.4g}"


def _errors(b: float | None, c: float | None, slack: float) -> Check:
    if not (_ok(b) and _ok(c)):
        return Check("errors", UNMEASURED, "error rate missing in a run")
    status = PASS if c <= b + slack else FAIL  # type: ignore[operator]
    return Check("errors", status, f"error rate {b:.2%} -> {c:.2%} (at most +{slack:.1%} points)")
