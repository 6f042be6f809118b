"""Write servetune's built-in session dataset, src/servetune/data/sessions/lmsys-stats.jsonl.

Conversations in the OpenAI messages format whose shape follows the published statistics
of LMSYS-Chat-1M (Zheng et al., 2023, arXiv:2309.11998, Table 1): 2.0 turns per
conversation, 69.5 tokens per user prompt and 214.5 per response on average. The paper
gives means only, so turns are geometric (mean 2.0, at most 8) and lengths lognormal with
those means and a log-space sigma of 0.8 (an assumption, stated in docs/sessions.md).
The text is common one-token English words, so a length in words is close to one in
tokens under most BPE tokenizers; servetune counts the real tokens when it loads them.

    .venv/bin/python scripts/make_session_dataset.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "src/servetune/data/sessions/lmsys-stats.jsonl"
CONVERSATIONS = 64
MEAN_TURNS, MEAN_PROMPT, MEAN_REPLY, SIGMA = 2.0, 69.5, 214.5, 0.8
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more write go see number no way could "
    "people my than first water been call who oil its now find long down day did get come "
    "made may part"
)
WORDS = _WORDS.split()


def lognormal(rng: np.random.Generator, mean: float, cap: int) -> int:
    mu = math.log(mean) - SIGMA**2 / 2  # E[X] = exp(mu + sigma^2/2)
    return int(min(cap, max(1, round(rng.lognormal(mu, SIGMA)))))


def text(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n).tolist())


def main() -> None:
    rng = np.random.default_rng(2309_11998)
    lines = []
    for _ in range(CONVERSATIONS):
        turns = min(8, int(rng.geometric(1 / MEAN_TURNS)))
        msgs = []
        for _ in range(turns):
            msgs.append({"role": "user", "content": text(rng, lognormal(rng, MEAN_PROMPT, 512))})
            msgs.append(
                {"role": "assistant", "content": text(rng, lognormal(rng, MEAN_REPLY, 1024))}
            )
        lines.append(json.dumps({"messages": msgs}))
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{OUT}: {CONVERSATIONS} conversations, {sum(1 for _ in lines)} lines")


if __name__ == "__main__":
    main()
