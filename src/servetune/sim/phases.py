"""Where closed-loop users stand in their request cycle when a run is measured.

A benchmark client starts its `c` users at once, so a simulated engine that prices steps
deterministically keeps them in lock-step for ever: equal output lengths make every user
finish within a few decode steps of the others, so the prompts of one round arrive
together again and queue behind each other (Qwen3-32B TP2, c=8, 1024/128: 414 ms
simulated against 154 ms measured). Real engines leave that state within a few rounds
(client, HTTP and detokenisation jitter). What the measurement then sees is users at
independent phases of their cycle; `start_offsets_s` draws those phases, uniform over one
estimated cycle, so prompts still collide by chance, as they do for real.

Pure; the seed makes a run reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from servetune.sim.request import SimRequest
from servetune.sim.steptime import StepModel

SEED = 20_241_115  # fixed: the same workload always gets the same phases


def cycle_s(model: StepModel, users: int, prompt_tokens: float, output_tokens: float) -> float:
    """One user's request cycle at steady state: its output's decode steps at a batch of
    `users` (each reading the batch's mean context, prompt + half the output), plus the
    `users` prompt steps that fall in the cycle (every user prefills once per cycle)."""
    p = max(int(prompt_tokens), 1)
    context = users * (prompt_tokens + output_tokens / 2)
    decode = model.time_s(0, users, context, 0.0, 0.0)
    prefill = model.time_s(p, 0, 0.0, p * (p + 1) / 2, p * (p + 1) / 2)
    return output_tokens * decode + users * prefill


def start_offsets_s(model: StepModel, first: Sequence[SimRequest], users: int) -> list[float]:
    """Send times of the users' first requests (`first`, one per user): uniform random
    phases over one cycle of the mean request, sorted, so user k starts at the k-th."""
    if users <= 1 or not first:
        return [0.0] * len(first)
    prompt = sum(r.prompt_tokens for r in first) / len(first)
    output = sum(r.output_tokens for r in first) / len(first)
    span = cycle_s(model, users, prompt, output)
    rng = random.Random(SEED + users)
    return sorted(rng.uniform(0.0, span) for _ in first)
