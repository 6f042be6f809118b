"""One quality comparison: score the corpus on both endpoints, then the figures, their
noise bounds and the §2 verdict. I/O (the endpoints) here; the maths in `scoring`,
the rule in `verdict`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from servetune.errors import InputError
from servetune.quality.corpus import Corpus
from servetune.quality.endpoint import Endpoint, random_weights
from servetune.quality.scoring import (
    Interval,
    agreement,
    first_word,
    mean_ci,
    pooled_perplexity,
    ppl_ratio_ci,
)
from servetune.quality.verdict import (
    MAX_PPL_INCREASE,
    MIN_THROUGHPUT_GAIN,
    Perf,
    Verdict,
    judge,
)

# Exact match counts only when the baseline answers at least this share of the tasks: a
# 270M base model answers few, and 1/10 vs 0/10 says nothing about the candidate.
MIN_BASELINE_EXACT = 0.5


@dataclass
class Settings:
    max_tokens: int = 64  # tokens scored per passage
    continue_tokens: int = 24  # greedy tokens compared per passage
    threshold: float = MAX_PPL_INCREASE
    min_gain: float = MIN_THROUGHPUT_GAIN


@dataclass
class Scores:
    """What one endpoint returned for the corpus."""

    logprobs: list[list[float]] = field(default_factory=list)
    greedy: list[list[int | str]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


@dataclass
class QualityResult:
    baseline: Endpoint
    candidate: Endpoint
    corpus: Corpus
    base: Scores
    cand: Scores
    settings: Settings
    again: Scores | None = None  # the baseline scored a second time (the noise floor)
    base_perf: Perf | None = None
    cand_perf: Perf | None = None

    @property
    def ppl_ratio(self) -> Interval:
        return ppl_ratio_ci(self.base.logprobs, self.cand.logprobs)

    @property
    def agreement(self) -> Interval | None:
        """None: not measured (the baseline continued no passage)."""
        return _agreement(self.base, self.cand)

    @property
    def noise(self) -> tuple[Interval, Interval | None]:
        """The baseline against itself (ratio, agreement): a second scoring shows what the
        serving stack alone changes (batch-dependent numerics, cache reuse). Without one
        (the same URL twice), the comparison is its own floor: 1 and 1."""
        if self.again is None:
            one = Interval(1.0, 1.0, 1.0)
            return one, (one if self.agreement is not None else None)
        return ppl_ratio_ci(self.base.logprobs, self.again.logprobs), _agreement(
            self.base, self.again
        )

    def exact(self, s: Scores) -> int:
        return sum(a == t.answer for a, t in zip(s.answers, self.corpus.tasks, strict=True))

    @property
    def exact_usable(self) -> bool:
        n = len(self.corpus.tasks)
        return n > 0 and self.exact(self.base) >= MIN_BASELINE_EXACT * n

    @property
    def regression(self) -> bool:
        """Measurable: the perplexity ratio's interval lies wholly above the baseline's
        own (the noise floor), or the agreement's wholly below it."""
        ratio, floor = self.noise
        agree = self.agreement
        below = agree is not None and floor is not None and agree.high < floor.low
        return self.ppl_ratio.low > ratio.high or below

    @property
    def verdict(self) -> Verdict:
        s = self.settings
        return judge(
            self.ppl_ratio.value - 1,
            s.threshold,
            self.base_perf,
            self.cand_perf,
            min_gain=s.min_gain,
        )

    def table(self) -> dict[str, Any]:
        """The run's quality field (seed 003 §16 质量结果): flat keys `runs show` lists."""
        r, a, v, n = self.ppl_ratio, self.agreement, self.verdict, len(self.corpus.tasks)
        tokens = sum(len(p) for p in self.base.logprobs)
        return {
            "verdict": v.verdict,
            "quality_check": v.quality,
            "baseline": f"{self.baseline.model} @ {self.baseline.url} ({self.baseline.engine})",
            "candidate": f"{self.candidate.model} @ {self.candidate.url} ({self.candidate.engine})",
            "corpus": f"{len(self.corpus.passages)} passages, {tokens} tokens scored, {n} tasks",
            "perplexity_baseline": round(pooled_perplexity(self.base.logprobs), 3),
            "perplexity_candidate": round(pooled_perplexity(self.cand.logprobs), 3),
            "perplexity_ratio": round(r.value, 4),
            "perplexity_ratio_ci95": [round(r.low, 4), round(r.high, 4)],
            "greedy_agreement": round(a.value, 4) if a is not None else None,
            "greedy_agreement_ci95": _ends(a),
            "exact_match_baseline": f"{self.exact(self.base)}/{n}",
            "exact_match_candidate": f"{self.exact(self.cand)}/{n}",
            "exact_match_counts": self.exact_usable,
            "regression_measurable": self.regression,
            "noise_floor_ratio_ci95": [round(self.noise[0].low, 4), round(self.noise[0].high, 4)],
            "noise_floor_agreement_ci95": _ends(self.noise[1]),
            "noise_bound": "95% bootstrap intervals over passages; the floor is the baseline "
            "against itself" + (" (scored twice)" if self.again else " (same URL: 1 and 1)"),
            "threshold_ppl_increase": self.settings.threshold,
            "checks": [f"{c.name}: {c.status} ({c.evidence})" for c in v.checks],
        }


def _agreement(a: Scores, b: Scores) -> Interval | None:
    """Mean agreement over the passages the baseline `a` continued; a passage it stopped at
    once has nothing to agree with and is left out. None when none is left (not measured):
    a NaN would poison the mean, its interval, the regression check and the JSON."""
    values = [agreement(x, y) for x, y in zip(a.greedy, b.greedy, strict=True)]
    measured = [v for v in values if v is not None]
    return mean_ci(measured) if measured else None


def _ends(ci: Interval | None) -> list[float] | None:
    """An interval's ends as the table shows them; None when not measured."""
    return [round(ci.low, 4), round(ci.high, 4)] if ci is not None else None


def score(
    ep: Endpoint, corpus: Corpus, tokens: list[list[int]], s: Settings, tasks: bool = True
) -> Scores:
    out = Scores()
    for toks in tokens:
        out.logprobs.append(ep.token_logprobs(toks))
    for p in corpus.passages:
        out.greedy.append(ep.greedy(_head(p.text), s.continue_tokens)[0])
    for t in corpus.tasks if tasks else ():
        out.answers.append(first_word(ep.greedy(t.prompt, 6)[1]))
    return out


def compare(base: Endpoint, cand: Endpoint, corpus: Corpus, s: Settings) -> QualityResult:
    """Refuses random weights and models that tokenize differently (their perplexities
    are over different tokens), then scores both."""
    for ep, flag in ((base, "--baseline"), (cand, "--candidate")):
        why = random_weights(ep.weights)
        if why:
            raise InputError(flag, why, "serve real weights (a checkpoint or a GGUF)")
    tokens = []
    for p in corpus.passages:
        b = base.tokenize(p.text)[: s.max_tokens]
        if cand.tokenize(p.text)[: s.max_tokens] != b:
            raise InputError(
                "--candidate",
                f"tokenizes passage {p.id!r} differently from the baseline",
                "compare builds of one model (same tokenizer)",
            )
        if len(b) < 2:  # the first token has no context: nothing in it to score
            raise InputError(
                "--corpus",
                f"passage {p.id!r} is {len(b)} token(s) long: perplexity scores none of it",
                "give passages of 2 tokens or more",
            )
        tokens.append(b)
    first = score(base, corpus, tokens, s)
    other = score(cand, corpus, tokens, s)
    # The noise floor: the baseline once more, after the candidate (its cache state differs).
    again = score(base, corpus, tokens, s, tasks=False) if base.url != cand.url else None
    return QualityResult(base, cand, corpus, first, other, s, again)


def _head(text: str) -> str:
    """The first half of a passage (by words): the prompt a greedy continuation extends."""
    words = text.split()
    return " ".join(words[: max(1, math.ceil(len(words) / 2))])
