"""How each engine holds a request's KV cache: what admitting it, its next prompt chunk and
its decode steps cost, and what freeing it returns. The step loop (`sim.scheduler`) is the
same for both; only these answers differ.

- `PagedPolicy`: vLLM v1 (vllm/v1/core/kv_cache_manager.py): a pool of fixed-size blocks
  allocated as tokens are written, full blocks shared through the prefix cache, prompts
  chunked within the step's token budget; when the pool runs dry the scheduler preempts.
- `SlotPolicy`: llama.cpp's server (tools/server): -np parallel slots, each with its
  context preallocated (n_ctx / np, or the shared n_ctx with --kv-unified), so nothing is
  allocated per step and nothing is ever preempted; a slot keeps its last prompt for reuse
  (cache_prompt), and prompts of models with sliding-window layers stop at checkpoints.
  A step (one llama_decode of up to -b tokens) runs as one forward pass per ubatch
  (`ubatch_sizes`): every pass pays the per-pass cost again (`extra_passes`).

A decoding request advances one token per step without being touched (`sim.scheduler`), so
the blocks the decoding batch needs at step s are kept as a count per residue s mod
block_size (`PagedPolicy.blocks_due_at`). The step loop reads that list and the
`max_request_tokens` bound directly, without a call: it does so every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from servetune.sim.kvcache import PagedKV
from servetune.sim.request import Phase, SimRequest


class SchedulingPolicy(Protocol):
    """What the step loop asks an engine's KV policy (both policies below answer it). A
    policy that ever asks for blocks (`blocks_due_at`, `next_chunk`, `admit`) also answers
    the step's allocation and preemption: `allocate`, `free_blocks`, `needs_block_at`,
    `release_preempted` (`PagedPolicy`)."""

    # Whether computed prompt blocks are published to a prefix cache (`register_shared`).
    caches_shared_blocks: bool
    # New blocks the decoding batch needs at step s: blocks_due_at[s % len(blocks_due_at)].
    blocks_due_at: Sequence[int]
    # The longest prompt + output the KV can ever hold (longer: `reject_reason`).
    max_request_tokens: int

    def reject_reason(self, r: SimRequest) -> str | None:
        """Why r can never run on this engine's KV, or None."""

    def admit(self, r: SimRequest, budget: int) -> tuple[int, int, int] | None:
        """Take r's KV for its first step with `budget` tokens left: (prompt tokens found
        cached, tokens this step, new blocks), or None when it cannot start now."""

    def next_chunk(self, r: SimRequest, budget: int) -> tuple[int, int]:
        """A prefilling request's next chunk: (tokens, new blocks)."""

    def decode_started(self, r: SimRequest) -> None:
        """r joined the decoding batch."""

    def decode_stopped(self, r: SimRequest, kv_tokens: int) -> None:
        """r left the decoding batch holding `kv_tokens` tokens of KV."""

    def decode_steps_supplied(self, step: int, n: int) -> int:
        """How many of n > 1 decode-only steps from `step` the KV can supply (at least 1:
        the first step's blocks are already taken)."""

    def take_stretch_blocks(self, step: int, n_steps: int) -> None:
        """Allocate what steps step+1 .. step+n_steps-1 of a decode stretch need."""

    def register_shared(self, r: SimRequest) -> None:
        """r computed more of its prompt: cache its newly full shared blocks."""

    def release(self, r: SimRequest, now_s: float) -> None:
        """r finished at `now_s`: free its KV."""

    def extra_passes(self, chunks: list[tuple[SimRequest, int, int]]) -> tuple[int, ...]:
        """Tokens of each forward pass the step runs beyond its first (empty: one pass),
        for the decoding batch plus `chunks` (request, tokens, blocks)."""

    def blocks_used(self) -> int:
        """KV blocks in use now (0 where KV is preallocated)."""

    def evictions(self) -> int:
        """Cached blocks evicted so far."""

    def check(self, running: list[SimRequest], step: int) -> None:
        """Assert the KV accounting holds (tests)."""


class PagedPolicy:
    """vLLM v1: paged KV blocks, chunked prefill, prefix cache; preemption's KV side."""

    caches_shared_blocks: bool
    blocks_due_at: list[int]
    max_request_tokens: int

    __slots__ = (
        "kv",
        "block_size",
        "chunked",
        "caching",
        "blocks_due_at",
        "caches_shared_blocks",
        "max_request_tokens",
    )

    def __init__(
        self, kv_blocks: int, block_size: int, chunked_prefill: bool, prefix_caching: bool
    ) -> None:
        self.kv = PagedKV(kv_blocks, prefix_caching)
        self.block_size = block_size
        self.chunked = chunked_prefill
        self.caching = prefix_caching
        self.caches_shared_blocks = prefix_caching
        # Decoders that need a fresh block at step s, by s % block_size (`decode_started`).
        self.blocks_due_at = [0] * block_size
        self.max_request_tokens = kv_blocks * block_size

    def reject_reason(self, r: SimRequest) -> str | None:
        if r.total_tokens > self.max_request_tokens:
            blocks = math.ceil(r.total_tokens / self.block_size)
            return f"needs {blocks} KV blocks, pool has {self.kv.total}"
        return None

    def admit(self, r: SimRequest, budget: int) -> tuple[int, int, int] | None:
        """Prefix-cache hits first (full blocks only, never the last prompt token: vLLM
        must compute one to sample from), then blocks for the first chunk; a fresh
        request can only hit its group's shared blocks, a preempted one its own too.
        Without chunked prefill the whole remaining prompt must fit the budget."""
        bs, kv = self.block_size, self.kv
        total = r.prefill_target
        hits = lru_hits = 0
        if self.caching:
            limit = (total - 1) // bs
            if not r.preemptions:
                limit = min(limit, r.shared_tokens // bs if r.prefix_group >= 0 else 0)
            refs, lru = kv.refs, kv.lru
            for i in range(limit):
                h = r.block_hash(i, bs)
                if h in refs:
                    hits += 1
                elif h in lru:
                    hits += 1
                    lru_hits += 1
                else:
                    break
        cached = hits * bs
        left = total - cached
        if not self.chunked and left > budget:
            return None
        n = min(left, budget)
        need = -(-(cached + n) // bs) - hits
        # A hit on an evictable block takes it off the free list as well.
        if need + lru_hits > kv.available:
            return None
        hashes = r.block_hashes
        for i in range(hits):
            h = r.block_hash(i, bs)
            kv.hit(h)
            hashes.append(h)
        kv.take(need)
        r.blocks_held = hits + need
        return cached, n, need

    def next_chunk(self, r: SimRequest, budget: int) -> tuple[int, int]:
        computed = r.computed_tokens
        n = min(r.prefill_target - computed, budget)
        return n, -(-(computed + n) // self.block_size) - r.blocks_held

    def decode_started(self, r: SimRequest) -> None:
        # With t tokens at step s0 it has t + s - s0 at step s, all but the last in KV; step
        # s writes that one, into a fresh block when t + s - s0 - 1 is a multiple of the
        # block size: s = s0 - t + 1 (mod block size).
        self.blocks_due_at[(r.decode_start_step - r.decode_start_tokens + 1) % self.block_size] += 1

    def decode_stopped(self, r: SimRequest, kv_tokens: int) -> None:
        self.blocks_due_at[(r.decode_start_step - r.decode_start_tokens + 1) % self.block_size] -= 1
        r.blocks_held = -(-kv_tokens // self.block_size)

    def needs_block_at(self, r: SimRequest, step: int) -> bool:
        """Whether decoding r takes a fresh block at `step` (see `decode_started`)."""
        bs = self.block_size
        return (r.decode_start_step - r.decode_start_tokens + 1) % bs == step % bs

    def decode_steps_supplied(self, step: int, n: int) -> int:
        avail, bs, due = self.kv.available, self.block_size, self.blocks_due_at
        # Steps step+1.. need due[(step + j) % bs] blocks each; stop before the pool runs dry.
        if sum(due) * ((n - 1) // bs + 1) > avail:
            need = 0
            for j in range(1, n):
                need += due[(step + j) % bs]
                if need > avail:
                    return j
        return n

    def take_stretch_blocks(self, step: int, n_steps: int) -> None:
        bs, due = self.block_size, self.blocks_due_at
        cycles, rest = divmod(n_steps - 1, bs)
        self.kv.take(cycles * sum(due) + sum(due[(step + j) % bs] for j in range(1, rest + 1)))

    def register_shared(self, r: SimRequest) -> None:
        """As in vLLM, a full block is cached once computed; when another request already
        cached the same content, this one keeps a private duplicate and stops trying."""
        kv, hashes = self.kv, r.block_hashes
        top = min(r.computed_tokens, r.shared_tokens) // self.block_size
        for i in range(len(hashes), top):
            h = r.block_hash(i, self.block_size)
            if not kv.register(h):
                r.sharing_done = True
                return
            hashes.append(h)

    def release(self, r: SimRequest, now_s: float) -> None:
        """Its private blocks become plain free blocks: no other request can hit them (an
        approximation: vLLM keeps them cached until evicted, which only changes the
        eviction order of shared blocks)."""
        self.kv.release(r.block_hashes, r.blocks_held - len(r.block_hashes), [])

    def extra_passes(self, chunks: list[tuple[SimRequest, int, int]]) -> tuple[int, ...]:
        """vLLM runs a step's whole batch as one forward pass."""
        return ()

    def free_blocks(self) -> int:
        """Blocks an allocation can take now (free and evictable cached)."""
        return self.kv.available

    def allocate(self, blocks: int, chunks: list[tuple[SimRequest, int, int]]) -> bool:
        """Take a step's blocks: the decoders' and each chunk's (request, tokens, blocks).
        False, and nothing taken, when the pool is short of them."""
        kv = self.kv
        if blocks > kv.available:
            return False
        kv.take(blocks)
        for r, _, need in chunks:
            r.blocks_held += need
        return True

    def release_preempted(self, r: SimRequest, kv_tokens: int) -> None:
        """A preempted request's blocks are freed; with prefix caching its full blocks stay
        cached (evictable), so its recompute may hit them."""
        bs = self.block_size
        cache = []
        if self.caching:
            cache = [r.block_hash(i, bs) for i in range(len(r.block_hashes), kv_tokens // bs)]
        self.kv.release(r.block_hashes, r.blocks_held - len(r.block_hashes), cache)
        r.block_hashes = []
        r.blocks_held = 0
        r.sharing_done = False

    def blocks_used(self) -> int:
        return self.kv.total - self.kv.available

    def evictions(self) -> int:
        return self.kv.evictions

    def check(self, running: list[SimRequest], step: int) -> None:
        """KV conservation (free + cached + referenced + private = total), references
        matching holders, no negative counts."""
        kv, bs = self.kv, self.block_size
        assert kv.free_plain >= 0, "negative free blocks"
        private = 0
        refs: dict[int, int] = {}
        for r in running:
            held = r.blocks_held
            if r.phase is Phase.DECODE:
                held = -(-(r.decode_start_tokens + step - r.decode_start_step - 1) // bs)
            assert held >= len(r.block_hashes), "a request holds fewer blocks than its hashes"
            private += held - len(r.block_hashes)
            for h in r.block_hashes:
                refs[h] = refs.get(h, 0) + 1
        assert refs == kv.refs, "cached-block references do not match their holders"
        used = kv.free_plain + len(kv.lru) + len(kv.refs) + private
        assert used == kv.total, f"KV blocks not conserved: {used} != {kv.total}"


class SlotPolicy:
    """llama.cpp's server: parallel slots with preallocated context, prompt reuse per slot,
    the checkpoint breaks of models whose KV cannot be rolled back, and each step's split
    into ubatches (forward passes)."""

    caches_shared_blocks = False  # a slot reuses its own last prompt, nothing is shared
    blocks_due_at = (0,)  # its KV is preallocated: no step ever needs a block

    __slots__ = (
        "slot_ctx",
        "unified",
        "caching",
        "breaks",
        "free_slots",
        "slot_group",
        "slot_freed_s",
        "unified_tokens",
        "max_request_tokens",
        "n_ubatch",
        "one_stream",
        "decoding",
        "decode_passes",
    )

    def __init__(
        self,
        n_slots: int,
        slot_ctx: int,
        kv_unified: bool,
        cache_prompt: bool,
        breaks: tuple[int, ...],
        n_ubatch: int = 0,
    ) -> None:
        self.slot_ctx = slot_ctx  # tokens per slot, or the shared pool with kv_unified
        self.unified = kv_unified
        self.caching = cache_prompt
        self.breaks = breaks  # `prompt_breaks`
        self.free_slots = list(range(n_slots))
        self.slot_group = [-2] * n_slots  # the prefix group each slot last held
        self.slot_freed_s = [0.0] * n_slots
        self.unified_tokens = 0  # kv_unified: tokens reserved by running requests
        self.max_request_tokens = slot_ctx
        self.n_ubatch = n_ubatch  # -ub (at most -b); 0: every step is one pass
        # llama_kv_cache keeps one KV stream when unified or with one slot, else one per
        # slot (n_stream = unified ? 1 : n_seq_max): that decides how a step is split.
        self.one_stream = kv_unified or n_slots == 1
        self.decoding: set[int] = set()  # the decoding batch's slots
        self.decode_passes: tuple[int, ...] | None = ()  # its extra passes (None: stale)

    def reject_reason(self, r: SimRequest) -> str | None:
        # llama-server: the request exceeds the slot's context size.
        if r.total_tokens > self.slot_ctx:
            return f"{r.total_tokens} tokens exceed the slot context of {self.slot_ctx}"
        return None

    def admit(self, r: SimRequest, budget: int) -> tuple[int, int, int] | None:
        if not self.free_slots:
            return None
        if self.unified:
            if self.unified_tokens + r.total_tokens > self.slot_ctx:
                return None
            self.unified_tokens += r.total_tokens
        cached = self._take_slot(r)
        total = r.prefill_target
        n = min(total - cached, budget)
        if self.breaks:
            n = cut_at_break(cached, n, total, self.breaks)
        return cached, n, 0

    def _take_slot(self, r: SimRequest) -> int:
        """llama-server's slot choice: a free slot that last held the same prefix (with
        cache_prompt its prompt is reused), else the least recently freed one. Returns the
        prompt tokens reused."""
        free = self.free_slots
        hit = -1
        if self.caching and r.prefix_group >= 0:
            group = self.slot_group
            hit = next((k for k in free if group[k] == r.prefix_group), -1)
        slot = hit if hit >= 0 else min(free, key=self.slot_freed_s.__getitem__)
        free.remove(slot)
        r.slot = slot
        self.slot_group[slot] = r.prefix_group
        return min(r.shared_tokens, r.prefill_target - 1) if hit >= 0 else 0

    def next_chunk(self, r: SimRequest, budget: int) -> tuple[int, int]:
        computed = r.computed_tokens
        n = min(r.prefill_target - computed, budget)
        if self.breaks:
            n = cut_at_break(computed, n, r.prefill_target, self.breaks)
        return n, 0

    def decode_started(self, r: SimRequest) -> None:
        self.decoding.add(r.slot)
        self.decode_passes = None

    def decode_stopped(self, r: SimRequest, kv_tokens: int) -> None:
        self.decoding.discard(r.slot)
        self.decode_passes = None

    def extra_passes(self, chunks: list[tuple[SimRequest, int, int]]) -> tuple[int, ...]:
        """The step's ubatches after the first (`ubatch_sizes`): llama-server's batch holds
        the decoding slots' one token each, then the prompt chunks, both in slot order
        (update_slots walks the slots in order). The decode-only split is kept until the
        decoding batch changes."""
        if not self.n_ubatch:
            return ()
        if chunks:
            seqs = [(k, 1) for k in sorted(self.decoding)]
            seqs += sorted((r.slot, n) for r, n, _ in chunks)
            return ubatch_sizes(seqs, self.n_ubatch, self.one_stream)[1:]
        if self.decode_passes is None:
            seqs = [(k, 1) for k in sorted(self.decoding)]
            self.decode_passes = ubatch_sizes(seqs, self.n_ubatch, self.one_stream)[1:]
        return self.decode_passes

    def decode_steps_supplied(self, step: int, n: int) -> int:
        return n

    def take_stretch_blocks(self, step: int, n_steps: int) -> None:
        return None

    def register_shared(self, r: SimRequest) -> None:
        return None

    def release(self, r: SimRequest, now_s: float) -> None:
        if r.slot >= 0:
            self.free_slots.append(r.slot)
            self.slot_freed_s[r.slot] = now_s
        if self.unified:
            self.unified_tokens -= r.total_tokens

    def blocks_used(self) -> int:
        return 0

    def evictions(self) -> int:
        return 0

    def check(self, running: list[SimRequest], step: int) -> None:
        return None


def prompt_breaks(n_batch: int, n_ubatch: int) -> tuple[int, ...]:
    """Where llama-server stops a prompt within one step, counted back from its end, for
    models whose KV cannot be rolled back (sliding-window attention, recurrent state): it
    processes the last 4 + n_ubatch and the last 4 tokens as separate steps so it can save a
    context checkpoint before each (tools/server/server-context.cpp, llama.cpp PR #20288;
    offsets capped at n_batch). Measured on Gemma 3 270M, 4 slots, four 769-token prompts
    sent at once: all four first tokens arrive within 5 ms of each other at 8.36 s, as the
    pieces [0, 253), [253, 765), [765, 769) of every slot share three steps; FCFS chunking
    would have finished the first prompt alone after ~2 s."""
    return tuple(min(n_batch, off) for off in (4 + n_ubatch, 4))


def cut_at_break(computed: int, n: int, total: int, breaks: tuple[int, ...]) -> int:
    """Shorten a prompt chunk [computed, computed + n) so it ends at the first break point
    (total - off) inside it; a chunk that starts on a break point runs on."""
    end = computed + n
    for off in breaks:
        b = total - off
        if computed < b < end:
            end = b
    return end - computed


def ubatch_sizes(seqs: list[tuple[int, int]], n_ubatch: int, one_stream: bool) -> tuple[int, ...]:
    """Tokens of each forward pass (ubatch) llama_decode runs for one batch. `seqs`:
    (sequence id, tokens) in batch order, each sequence's tokens together.

    llama.cpp (src/llama-kv-cache.cpp and -iswa.cpp, init_batch; src/llama-batch.cpp): with
    one KV stream (`one_stream`) split_simple cuts the batch into consecutive n_ubatch-token
    pieces; with a stream per slot, split_equal(sequential) takes, from the first sequence
    with tokens left, the run of sequences whose ids follow on by one (in batch order), and
    the same number of tokens from each: as many as the shortest has left, at most
    n_ubatch / run length. So a decode of slots {0, 2} is two passes, and a prompt joining
    slots 0-2's decode rides one token in their pass and the rest of it in its own."""
    if one_stream:
        total = sum(n for _, n in seqs)
        full, rest = divmod(total, n_ubatch)
        return (n_ubatch,) * full + ((rest,) if rest else ())
    left = dict(seqs)
    order = [k for k, _ in seqs]
    sizes: list[int] = []
    while True:
        run: list[int] = []
        for k in order:
            if left[k] and (not run or k == run[-1] + 1) and len(run) < n_ubatch:
                run.append(k)
        if not run:
            return tuple(sizes)
        each = max(1, min(min(left[k] for k in run), n_ubatch // len(run)))
        for k in run:
            left[k] -= each
        sizes.append(each * len(run))
