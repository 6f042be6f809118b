"""One simulated request: what it asks for, where it is in the engine, and the steps its
tokens came out in.

A decoding request is not touched per step (see `sim.scheduler`): while it decodes, its
token count is ``decode_start_tokens + (step - decode_start_step)``, and only leaving the
decode phase (finish, preemption) writes that back into ``generated`` and
``token_step_ranges``.
"""

from __future__ import annotations

from enum import Enum

from servetune.sim.kvcache import private_hash, shared_hash


class Phase(Enum):
    """Where a request is: queued, prefilling its prompt, decoding, or ended."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"
    REJECTED = "rejected"


# A module-level name: Enum's class attribute lookup (EnumType.__getattr__) is slow, and
# this one is read per request.
_WAITING = Phase.WAITING


class SimRequest:
    """Mutable per-request state (slots: one is built per simulated send)."""

    __slots__ = (
        "index",
        "send_id",
        "prompt_tokens",
        "output_tokens",
        "arrival_s",
        "scheduled_s",
        "priority",
        "prefix_group",
        "shared_tokens",
        "phase",
        "generated",
        "prefill_target",
        "computed_tokens",
        "blocks_held",
        "block_hashes",
        "sharing_done",
        "decode_start_step",
        "decode_start_tokens",
        "version",
        "token_step_ranges",
        "preemptions",
        "prefix_hit_tokens",
        "reject_reason",
        "slot",
    )

    def __init__(
        self,
        index: int,
        send_id: int,
        prompt_tokens: int,
        output_tokens: int,
        arrival_s: float,
        priority: int,
        prefix_group: int,
        shared_tokens: int,
        scheduled_s: float | None = None,
    ) -> None:
        self.index = index  # position in the materialised request list
        self.send_id = send_id  # unique per send (a closed loop may resend a pool entry)
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s  # when the client sends it
        self.scheduled_s = scheduled_s  # the workload's planned send time (open loop)
        self.priority = priority  # lower is served first under the priority policy
        self.prefix_group = prefix_group  # -1: no shared prefix
        self.shared_tokens = shared_tokens  # leading prompt tokens shared with its group
        self.phase = _WAITING
        self.generated = 0  # output tokens sampled (decoding: as of decode_start_step)
        # Tokens to prefill before the next token is sampled: the prompt, plus what it had
        # generated when it was preempted (vLLM recomputes those too).
        self.prefill_target = prompt_tokens
        self.computed_tokens = 0  # of prefill_target, in the KV cache
        self.blocks_held = 0  # paged KV blocks, cached and private (decoding: lazy)
        self.block_hashes: list[int] = []  # the cached blocks it holds a reference on
        self.sharing_done = False  # no more of its shared-prefix blocks to cache
        self.decode_start_step = 0  # the step it decodes its first token in
        self.decode_start_tokens = 0  # its tokens then, the last sampled one included
        self.version = 0  # bumped per decode start/stop: stale finish events are skipped
        self.token_step_ranges: list[int] = []  # flat [a0, b0, a1, b1, ...]: steps a..b-1
        self.preemptions = 0
        self.prefix_hit_tokens = 0  # prompt tokens found cached, over all its admissions
        self.reject_reason: str | None = None
        self.slot = -1  # llama.cpp: the slot it runs in

    @property
    def total_tokens(self) -> int:
        """Prompt + output: what the engine must be able to hold for it."""
        return self.prompt_tokens + self.output_tokens

    def block_hash(self, i: int, block_size: int) -> int:
        """The content hash of its i-th full KV block: shared while the block lies wholly
        in the group's shared prefix, private to this send otherwise (`sim.kvcache`)."""
        if self.prefix_group >= 0 and (i + 1) * block_size <= self.shared_tokens:
            return shared_hash(self.prefix_group, i)
        return private_hash(self.send_id, i)

    def record_tokens(self, first_step: int, end_step: int) -> None:
        """One token at each step first_step..end_step-1 (merged with a range it extends)."""
        ranges = self.token_step_ranges
        if ranges and ranges[-1] == first_step:
            ranges[-1] = end_step
        else:
            ranges.extend((first_step, end_step))

    def resend(self, send_id: int) -> SimRequest:
        """A fresh send of the same request (a closed loop cycling through its pool)."""
        return SimRequest(
            self.index,
            send_id,
            self.prompt_tokens,
            self.output_tokens,
            0.0,
            self.priority,
            self.prefix_group,
            self.shared_tokens,
        )
