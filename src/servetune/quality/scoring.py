"""The quality figures, as pure functions of what the endpoints returned.

Perplexity is exp of the mean negative log-likelihood per token (the standard definition:
Jelinek et al. 1977; Hugging Face's "Perplexity of fixed-length models" page), pooled over
the passages' tokens. The noise bound is a percentile bootstrap over passages (Efron &
Tibshirani 1993, ch. 13): passages are the independent units, tokens within one are not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Bootstrap resamples and the interval: 2,000 resamples keep the 95% percentile interval's
# ends stable to about 1% (Efron & Tibshirani 1993, §19.3 recommend >= 1,000).
BOOTSTRAP_RESAMPLES = 2000
CI_LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap interval."""

    value: float
    low: float
    high: float

    def excludes(self, x: float) -> bool:
        return not self.low <= x <= self.high

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """exp(mean negative log-likelihood per token)."""
    return math.exp(nll_sum / n_tokens) if n_tokens else math.nan


def pooled_perplexity(logprobs: Sequence[Sequence[float]]) -> float:
    """Perplexity over all tokens of all passages (each passage's scored tokens)."""
    return perplexity(-sum(sum(p) for p in logprobs), sum(len(p) for p in logprobs))


def ppl_ratio_ci(
    base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], seed: int = 0
) -> Interval:
    """Candidate / baseline pooled perplexity, with a bootstrap interval over passages
    (the same resampled passages for both, so the pairing removes passage difficulty)."""
    b_nll = np.array([-sum(p) for p in base])
    c_nll = np.array([-sum(p) for p in cand])
    n_tok = np.array([len(p) for p in base])
    if len(b_nll) != len(c_nll) or np.any(n_tok != np.array([len(p) for p in cand])):
        raise ValueError("baseline and candidate must score the same tokens")
    point = math.exp((c_nll.sum() - b_nll.sum()) / n_tok.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(n_tok), size=(BOOTSTRAP_RESAMPLES, len(n_tok)))
    ratios = np.exp((c_nll[idx].sum(1) - b_nll[idx].sum(1)) / n_tok[idx].sum(1))
    return Interval(point, *_ends(ratios))


def agreement(base: Sequence[int | str], cand: Sequence[int | str]) -> float | None:
    """Share of the baseline's greedy tokens the candidate repeats at the same position
    (a shorter continuation misses the rest). None when the baseline generated nothing
    (it stopped at once): there is nothing to agree with, which is not a disagreement."""
    if not base:
        return None
    return sum(a == b for a, b in zip(base, cand, strict=False)) / len(base)


def mean_ci(values: Sequence[float], seed: int = 0) -> Interval:
    """Mean of per-passage (or per-task) values with a bootstrap interval."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(BOOTSTRAP_RESAMPLES, len(v)))].mean(1)
    return Interval(float(v.mean()), *_ends(means))


def first_word(text: str) -> str:
    """What an exact-match task compares: the continuation's first word, punctuation off."""
    words = text.split()
    return words[0].strip(".,;:!?\"'()") if words else ""


def _ends(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - CI_LEVEL) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)
