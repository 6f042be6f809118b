"""Session workloads: multi-turn conversations and agent tool loops (`WorkloadSpec.sessions`).

A session is a chain of requests: each turn re-sends the whole history (system prompt,
every earlier message and answer) plus something new, and is sent only after the
previous answer completed and a delay passed (the user's think time, or the tools'
latency). That history is a prefix of the next turn, which is what prefix caching and KV
capacity are about (seed 003 §4 prefix cache, §13 long/short mix; seed 000 §2 KV).

The workload's `arrival` then counts sessions, not requests: open loop, sessions start
at `rate` sessions/s (Poisson, gamma, constant); closed loop, `concurrency` users each
run sessions back to back. `count` is the number of sessions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from servetune.workload.spec import Fixed, LengthDist, PrefixGroups, StrictModel, as_fixed


class Seconds(StrictModel):
    """A delay in seconds. `fixed` (`value`), `uniform` (`low`..`high`), `exponential`
    (`mean`: a memoryless user) or `lognormal` (`mean`, log-space `sigma`: tool latencies
    have long tails). A bare number is `fixed`."""

    # At most a day (a pause longer than a session is a typo, and 1e300 s overflowed the
    # simulator's clock); sigma as a token length's LogNormal (10 spans e^±50).
    dist: Literal["fixed", "uniform", "exponential", "lognormal"] = "fixed"
    value: float = Field(0.0, ge=0, le=86_400, description="fixed: the delay (s).")
    low: float = Field(0.0, ge=0, le=86_400)
    high: float = Field(0.0, ge=0, le=86_400)
    mean: float = Field(0.0, ge=0, le=86_400)
    sigma: float = Field(0.5, ge=0, le=10)

    @model_validator(mode="before")
    @classmethod
    def _number(cls, data: Any) -> Any:
        return as_fixed(data)

    @model_validator(mode="after")
    def _order(self) -> Seconds:
        """A field the dist does not read is refused, and so is an exponential or lognormal
        delay without its mean: `{dist: exponential, value: 2}` ran with no delay."""
        uses = SECONDS_FIELDS[self.dist]
        fields = type(self).model_fields
        given = {f for f in fields if f != "dist" and getattr(self, f) != fields[f].default}
        if unused := sorted(given - uses):  # a spec dumped whole holds the defaults too
            raise ValueError(
                f"{', '.join(unused)}: not read by dist {self.dist} (it reads "
                f"{', '.join(sorted(uses))})"
            )
        if "mean" in uses and self.mean <= 0:
            raise ValueError(f"dist {self.dist} needs its mean (seconds, > 0)")
        if self.dist == "uniform" and self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


SECONDS_FIELDS = {  # what each delay distribution reads (`Seconds`)
    "fixed": {"value"},
    "uniform": {"low", "high"},
    "exponential": {"mean"},
    "lognormal": {"mean", "sigma"},
}


class SessionDataset(StrictModel):
    """Conversations from a file; each user message is a turn's new text and the reply that
    follows it sets that turn's output length (sent with ignore_eos, as for request
    datasets). `messages`: JSONL, one conversation a line as {"messages": [{role,
    content}, ...]} (the OpenAI chat format). `sharegpt`: the ShareGPT JSON list, every
    turn (human/gpt). `mooncake`: a Mooncake trace (JSONL: timestamp ms, input_length,
    output_length, hash_ids), its requests chained into sessions by their block hashes.
    `path: builtin` is the small set shipped with servetune (`servetune/data/sessions/`,
    made from published LMSYS-Chat-1M statistics)."""

    path: Path
    format: Literal["messages", "sharegpt", "mooncake"] = "messages"
    shuffle: bool = True


class _SessionBase(StrictModel):
    system_prompt: PrefixGroups | None = Field(
        None, description="Each session opens with one of `groups` system prompts."
    )
    context_cap_tokens: int | None = Field(
        None, ge=1, description="The client keeps prompt + output within this many tokens."
    )
    on_cap: Literal["drop_oldest", "end_session"] = Field(
        "drop_oldest",
        description="drop_oldest: drop the oldest exchanges (the system prompt stays), so "
        "the prompt no longer extends the cached history; end_session: the session ends.",
    )
    slo_turns: Literal["all", "first", "followup"] = Field(
        "all", description="The turns the SLO judges (e.g. followup: P95 TTFT of follow-ups)."
    )

    @model_validator(mode="after")
    def _cap_rule_needs_cap(self) -> _SessionBase:
        """`on_cap: end_session` with no cap would never end a session. Only the non-default
        rule is refused: a spec dumped whole (a result's workload) holds drop_oldest."""
        if self.on_cap != "drop_oldest" and self.context_cap_tokens is None:
            raise ValueError(
                f"on_cap {self.on_cap} is read only with context_cap_tokens "
                "(give context_cap_tokens, or drop on_cap)"
            )
        return self


class Conversation(_SessionBase):
    """A chat: `turns` per session; per turn a new user message (`user_tokens`) and the
    answer (`output_tokens`), then `think_time_s` before the next; or a `dataset`'s own
    conversations (turns, messages and answer lengths from the file)."""

    kind: Literal["chat"] = "chat"
    turns: LengthDist | None = None
    user_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    think_time_s: Seconds = Field(default_factory=Seconds)
    dataset: SessionDataset | None = None

    @model_validator(mode="after")
    def _source(self) -> Conversation:
        """Lengths come from the dataset or from the three fields, never both: beside a
        dataset they would be ignored."""
        names = ("turns", "user_tokens", "output_tokens")
        given = [n for n in names if getattr(self, n) is not None]
        if self.dataset is None and len(given) < len(names):
            raise ValueError("give turns, user_tokens and output_tokens, or a dataset")
        if self.dataset is not None and given:
            raise ValueError(
                f"{', '.join(given)}: not read with a dataset, whose conversations set "
                "them (drop them, or the dataset)"
            )
        mooncake = self.dataset is not None and self.dataset.format == "mooncake"
        if mooncake and self.think_time_s != Seconds():
            raise ValueError(
                "think_time_s: not read with a mooncake trace, whose turns keep the "
                "trace's gaps (drop it)"
            )
        return self


class AgentLoop(_SessionBase):
    """An agent task: a task prompt (`task_tokens`), then `steps` model calls. Every call
    but the last answers with `fan_out` parallel tool calls of `tool_call_tokens` each;
    the tools run together (the step waits for the slowest, `tool_latency_s` each), and
    their results (`tool_result_tokens` each) are appended for the next call. The last
    call writes the answer (`answer_tokens`)."""

    kind: Literal["agent"] = "agent"
    task_tokens: LengthDist
    steps: LengthDist
    tool_call_tokens: LengthDist
    tool_result_tokens: LengthDist
    tool_latency_s: Seconds = Field(default_factory=Seconds)
    fan_out: LengthDist = Field(default_factory=lambda: Fixed(value=1))
    answer_tokens: LengthDist | None = Field(None, description="Default: tool_call_tokens.")


Sessions = Annotated[Conversation | AgentLoop, Field(discriminator="kind")]

BUILTIN_DATASET = Path(__file__).resolve().parents[1] / "data" / "sessions" / "lmsys-stats.jsonl"


def _complete_workload_spec() -> None:
    """WorkloadSpec names `Sessions` before this module exists (it imports spec's length
    distributions); resolve the name now."""
    from servetune.workload import spec

    spec.WorkloadSpec.model_rebuild(_types_namespace={"Sessions": Sessions})


_complete_workload_spec()
