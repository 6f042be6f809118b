"""Where closed-loop users stand in their request cycle once a run has left its start.

A benchmark client starts its `c` users at once, so the first round is a burst, and a
simulated engine that prices steps deterministically then keeps them in lock-step for
ever: users that shared a prefill step finish in the same decode step and send together
again (Qwen3-32B TP2, c=8, 1024/128: 497 ms simulated against 154 ms measured). vLLM on a
GPU leaves that state (the cause is not modelled; random front-end time does not do it,
docs/fidelity-gpu.md). What the measurement then sees is the first round's burst, and
after it users at independent phases of their cycle; `phase_offsets_s` draws those
phases, uniform over one estimated cycle, so prompts still collide by chance, as they do
for real. vLLM on CPU does stay in lock-step (measured: benchmarks/closed_loop_rounds.py),
so only the gpu tier draws them (`StepModel.spread_closed_loop`).

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


def phase_offsets_s(model: StepModel, first: Sequence[SimRequest], users: int) -> list[float]:
    """How long each user waits, after its first request, before its second (`first`,
    one request per user): independent uniform phases over one cycle of the mean request,
    in a seeded random order."""
    if users <= 1 or not first:
        return [0.0] * len(first)
    prompt = sum(r.prompt_tokens for r in first) / len(first)
    output = sum(r.output_tokens for r in first) / len(first)
    span = cycle_s(model, users, prompt, output)
    rng = random.Random(SEED + users)
    return [rng.uniform(0.0, span) for _ in first]
