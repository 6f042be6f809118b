"""SGLang's step loop: prefill first, decode otherwise, retraction when the pool runs dry.

python/sglang/srt/managers/scheduler.py (`get_next_batch_to_run`, `get_new_batch_prefill`,
`update_running_batch`; sgl-project/sglang as read for `sim.sglang_policy`): every iteration
SGLang first tries to build a prefill batch - the request being chunked continues, then
waiting requests in the policy's order join while the chunk budget (--chunked-prefill-size),
the prefill budget (--max-prefill-tokens), --max-running-requests and the new-token-ratio
reservation (`sim.sglang_policy`) allow. If it has one, that step runs the prompts alone: the
decoding requests wait a step (they are mixed in only with --enable-mixed-chunk, which is
not modelled). Otherwise the running requests decode one token each, after a retraction if
the pool cannot supply the step. vLLM instead runs every decoder in every step, with
prefill chunks riding along within one token budget (`sim.scheduler`).

The loop reuses `RunState`'s pieces (arrivals, pricing, the lazy decoding batch, retiring):
a prefill-only step stops the decoders' lazy clocks (`stop_decode`) and restarts them after
it, so their tokens skip that step; the decay of the new-token ratio is kept lazily as a
function of the decode steps run (one per step in a decode stretch).
"""

from __future__ import annotations

from servetune.sim.request import Phase, SimRequest
from servetune.sim.scheduler import IDLE_REJECT, Chunk, RunState, Scheduler
from servetune.sim.sglang_policy import (
    CLIP_MAX_NEW_TOKENS,
    IN_BATCH_PREFIX_TOKENS,
    LPM_MAX_QUEUE,
    RadixConfig,
    RadixPolicy,
    ratio_after_retract,
    reserved_new_tokens,
)

_WAITING, _PREFILL, _DECODE = Phase.WAITING, Phase.PREFILL, Phase.DECODE


class RadixQueue(list):
    """SGLang's waiting list: arrivals and retracted requests join the end; the policy
    reorders it before each prefill batch (`order`)."""

    push = list.append
    requeue = list.append  # a retracted request rejoins the end (_add_request_to_queue)

    def head(self) -> SimRequest:
        return self[0]

    def pop_head(self) -> SimRequest:
        return self.pop(0)


def lpm_order(queue: list[SimRequest], cached: list[int]) -> list[SimRequest]:
    """SGLang's lpm order: longest cached prefix first (stable, so arrival order among
    equals); a request whose own cached match is at most 32 tokens and whose shared prefix
    (>= 32 tokens) an earlier waiting request already carries goes last this round, so
    one of them computes the prefix for the rest (schedule_policy `_compute_prefix_matches`)."""
    seen: set[int] = set()
    keys: list[float] = []
    for r, c in zip(queue, cached, strict=True):
        key = float(-c)
        if c <= IN_BATCH_PREFIX_TOKENS and r.prefix_group >= 0:
            if r.shared_tokens >= IN_BATCH_PREFIX_TOKENS and r.prefix_group in seen:
                key = float("inf")
            seen.add(r.prefix_group)
        keys.append(key)
    order = sorted(range(len(queue)), key=keys.__getitem__)
    return [queue[i] for i in order]


class RadixRunState(RunState):
    """One SGLang run (module docstring). `RunState`'s waiting queue is a `RadixQueue`."""

    __slots__ = (
        "radix",
        "ratio_at",
        "ratio_step",
        "decode_steps",
        "blocked",
        "page",
        "remaining_offset",
        "long_decoders",
    )

    def __init__(
        self, sched: Scheduler, requests: list[SimRequest], pool: list[SimRequest] | None
    ) -> None:
        super().__init__(sched, requests, pool)
        self.radix: RadixConfig = sched.cfg.radix
        self.waiting = RadixQueue()  # type: ignore[assignment]
        self.page = sched.cfg.block_size
        # new_token_ratio = max(min, ratio_at - decay x (decode_steps - ratio_step))
        self.ratio_at = self.radix.init_ratio
        self.ratio_step = 0
        self.decode_steps = 0
        # When admission stopped on memory: (tokens the head needs, reserved new tokens
        # of the decoders) - what `admission_horizon` needs; None otherwise.
        self.blocked: tuple[int, int] | None = None
        # Sum over decoders of output_tokens - generated + decode_start_step: their tokens
        # still to come at step s are remaining_offset - n_decoding x s (as context_offset
        # gives their context); exact while none expects more than SGLang's 4096-token
        # clip (`long_decoders` counts those, then the sum is taken one by one).
        self.remaining_offset = 0
        self.long_decoders = 0

    def ratio(self) -> float:
        """The new_token_ratio now (decayed once per decode step since it was set)."""
        r = self.radix
        decayed = self.ratio_at - r.decay_per_step * (self.decode_steps - self.ratio_step)
        return max(r.min_ratio, decayed)

    def run(self) -> None:
        """Prefill step, else decode step, until nothing runs, waits or is to arrive."""
        arrivals, running, waiting = self.arrivals, self.running, self.waiting
        policy, stats, check = self.policy, self.stats, self.sched.check
        while True:
            if arrivals and arrivals[0][0] <= self.now_s:
                self.take_arrivals()
            if not running and not waiting:
                self.ratio_at, self.ratio_step = self.radix.init_ratio, self.decode_steps
                if not arrivals:
                    break
                self.now_s = max(self.now_s, arrivals[0][0])
                continue
            chunks = self.prefill_batch()
            if chunks:
                self.prefill_step(chunks)
            elif self.n_decoding:
                self.decode_step()
            elif waiting:  # nothing can run: a guard, admission checks the idle pool
                self.reject(waiting.pop_head(), IDLE_REJECT, self.now_s)
                continue
            elif self.prefilling:  # its admission reserved its pages: cannot happen
                raise AssertionError("a chunked prompt found no pages with nothing decoding")
            elif not arrivals:
                break
            else:
                self.now_s = max(self.now_s, arrivals[0][0])
                continue
            if check:
                self.check_invariants()
            used = policy.blocks_used()
            if used > stats.max_blocks_used:
                stats.max_blocks_used = used
            if self.finish_events and self.finish_events[0][0] < self.step:
                self.retire()
        stats.steps = self.step
        stats.evictions = policy.evictions()

    # --- the prefill batch (get_new_batch_prefill + PrefillAdder) -------------------------

    def prefill_batch(self) -> list[Chunk]:
        """The chunked request's next chunk, then waiting requests in the policy's order,
        each admitted only within the budgets and the new-token-ratio reservation; stops at
        the first that cannot start."""
        policy: RadixPolicy = self.policy  # type: ignore[assignment]
        radix, page = self.radix, self.page
        chunk_left = radix.chunked_prefill_size or None  # None: no chunking
        input_left = radix.max_prefill_tokens
        chunks: list[Chunk] = []
        reserved = 0  # this batch's future tokens (its pages are taken already)
        self.blocked = None
        if self.prefilling:  # the request being chunked goes first (add_chunked_req)
            r = self.prefilling[0]
            left = r.prefill_target - r.computed_tokens
            room = min(chunk_left or left, policy.free_blocks() * page)
            n, need = policy.next_chunk(r, room)
            if n <= 0 or not policy.allocate(need, [(r, n, need)]):
                return chunks  # no room for its chunk: decode (and retract) first
            chunks.append((r, n, need))
            chunk_left = chunk_left - n if chunk_left is not None else None
            input_left -= n
            reserved += reserved_new_tokens(r, r.generated) if n == left else 0
        waiting = self.waiting
        if not waiting or len(self.running) >= self.max_seqs:
            return chunks
        queue = self.ordered_waiting(policy)
        ratio, decoding = self.ratio(), self.decoders_reserve()
        admitted = 0
        for r in queue:
            if len(self.running) >= self.max_seqs:
                break
            if input_left <= 0 or (chunk_left is not None and chunk_left <= 0):
                break
            extend = r.prefill_target - policy.cached_prefix(r)
            need = extend + reserved_new_tokens(r, r.generated) + page
            room = policy.free_blocks() * page - ratio * decoding - reserved
            if need >= room:
                self.blocked = (need, decoding) if not chunks else None
                break
            if chunk_left is None and chunks and extend > input_left:
                break  # without chunking only the batch's first prompt may pass the cap
            got = policy.admit(r, extend if chunk_left is None else chunk_left)
            if got is None:
                break
            cached, n, blocks = got
            r.prefix_hit_tokens += cached
            self.stats.prefix_hit_tokens += cached
            r.computed_tokens = cached
            r.phase = _PREFILL
            self.running.append(r)
            self.prefilling.append(r)
            chunks.append((r, n, blocks))
            admitted += 1
            input_left -= n
            if chunk_left is not None:
                chunk_left -= n
            reserved += (reserved_new_tokens(r, r.generated) if n == extend else 0) + page
        del waiting[:admitted]  # the admitted are the head of the (reordered) queue
        return chunks

    def ordered_waiting(self, policy: RadixPolicy) -> list[SimRequest]:
        """The waiting list in the policy's order (it is reordered in place, as SGLang's
        calc_priority sorts its queue): fcfs as is; lpm by cached prefix while at most 128
        wait; priority by (priority, arrival)."""
        waiting, kind = self.waiting, self.radix.schedule_policy
        if kind == "lpm" and len(waiting) <= LPM_MAX_QUEUE:
            waiting[:] = lpm_order(list(waiting), [policy.cached_prefix(r) for r in waiting])
        elif kind == "priority":
            waiting.sort(key=lambda r: (r.priority, r.arrival_s, r.send_id))
        return waiting

    def decoders_reserve(self) -> int:
        """The decoders' reserved new tokens now (before the ratio): max_new_tokens -
        generated, each clipped at 4096."""
        step = self.step
        if not self.long_decoders:
            return self.remaining_offset - self.n_decoding * step
        return sum(
            reserved_new_tokens(d, d.generated + step - d.decode_start_step)
            for d in self.running
            if d.phase is _DECODE
        )

    def prefill_step(self, chunks: list[Chunk]) -> None:
        """A step of prompt chunks alone: the decoders sit it out (`pause_decoders`)."""
        n = self.n_decoding
        if n:
            self.pause_decoders(self.step)
        # priced without them; the prompts that complete join them (start_decode)
        context, self.n_decoding, self.context_offset = self.context_offset, 0, 0
        self.price_chunks(chunks)
        self.n_decoding += n
        self.context_offset += context

    def pause_decoders(self, step: int) -> None:
        """The decoding batch skips `step`: each decoder's tokens so far are written back
        and it restarts at step + 1 with them, so every lazy quantity moves by one step at
        once - the finish events (a uniform shift keeps the heap a heap), the context and
        remaining-token sums, the page residues."""
        n = self.n_decoding
        for r in self.running:
            if r.phase is _DECODE:
                start = r.decode_start_step
                if step > start:
                    ranges = r.token_step_ranges  # r.record_tokens(start, step), inlined
                    if ranges and ranges[-1] == start:
                        ranges[-1] = step
                    else:
                        ranges += (start, step)
                    r.generated += step - start
                    r.decode_start_tokens += step - start
                r.decode_start_step = step + 1
        events = self.finish_events
        events[:] = [(last + 1, sid, v, r) for last, sid, v, r in events]
        self.context_offset -= n
        self.remaining_offset += n
        due = self.blocks_due_at
        if len(due) > 1:  # residue (start - tokens + 1) mod page grows by one
            due[:] = due[-1:] + due[:-1]

    def start_decode(self, r: SimRequest, step: int) -> None:
        super().start_decode(r, step)
        self.remaining_offset += r.output_tokens - r.generated + step
        self.long_decoders += r.output_tokens - r.generated > CLIP_MAX_NEW_TOKENS

    def stop_decode(self, r: SimRequest, step: int) -> int:
        self.remaining_offset -= r.output_tokens - r.generated + r.decode_start_step
        self.long_decoders -= r.output_tokens - r.generated > CLIP_MAX_NEW_TOKENS
        return super().stop_decode(r, step)

    # --- the decode step (update_running_batch) ------------------------------------------

    def decode_step(self) -> None:
        """Every running request one token: the pool supplies the step's pages, else
        requests are retracted first; then the stretch of decode steps up to the next
        change (`RunState.price_decodes`), cut where a blocked admission could pass."""
        policy: RadixPolicy = self.policy  # type: ignore[assignment]
        step = self.step
        due = self.blocks_due_at
        demand = due[step % len(due)]
        retracted = False
        if demand and not policy.allocate(demand, []):
            demand = self.retract(step)
            policy.allocate(demand, [])
            retracted = True
        if not retracted and self.blocked is not None and len(self.running) < self.max_seqs:
            policy.horizon = self.admission_horizon(*self.blocked)
        start = self.step
        self.price_decodes(retracted)
        policy.horizon = None
        self.decode_steps += self.step - start

    def retract(self, step: int) -> int:
        """retract_decode: fewest generated tokens first (longest prompt among equals), at
        least one, until the pool supplies the step for the rest; they wait again at the
        end of the queue and recompute what the tree no longer holds. Returns the pages
        the step still needs."""
        policy: RadixPolicy = self.policy  # type: ignore[assignment]
        due = self.blocks_due_at
        demand = due[step % len(due)]

        def generated(r: SimRequest) -> int:
            return r.generated + step - r.decode_start_step

        decoders = [r for r in self.running if r.phase is _DECODE]
        decoders.sort(key=lambda r: (generated(r), -r.prompt_tokens), reverse=True)
        first = True
        while decoders and (first or demand > policy.free_blocks()):
            if len(decoders) == 1 and demand <= policy.free_blocks():
                break  # SGLang never retracts the last request
            first = False
            victim = decoders.pop()
            if policy.needs_block_at(victim, step):
                demand -= 1
            kv_tokens = self.stop_decode(victim, step)
            self.running.remove(victim)
            policy.release_preempted(victim, kv_tokens)
            victim.phase = _WAITING
            victim.computed_tokens = 0
            victim.prefill_target = victim.prompt_tokens + victim.generated
            victim.preemptions += 1
            self.stats.preemptions += 1
            self.waiting.requeue(victim)
        ratio = ratio_after_retract(
            [generated(r) for r in decoders], [r.output_tokens for r in decoders]
        )
        # set for this step: the decay resumes from the next decode step on
        self.ratio_at, self.ratio_step = ratio, self.decode_steps + 1
        return demand

    def admission_horizon(self, need: int, decoding: int) -> int | None:
        """Decode steps after which the blocked head of the queue would pass the
        reservation (the ratio decays, the decoders' remaining tokens shrink, the pool
        fills): the stretch ends there so the next prefill attempt sees it. Reserved
        tokens are taken as shrinking by one per decoder and step (exact below SGLang's
        4096-token clip). None: not before the next finish."""
        if not self.finish_events:
            return None
        radix, n = self.radix, self.n_decoding
        free = self.policy.free_blocks() * self.page
        ratio, decay, low = self.ratio(), radix.decay_per_step, radix.min_ratio
        for k in range(1, self.finish_events[0][0] - self.step + 2):
            left = free - n * (k - 1)  # this step's pages are taken already
            if left <= 0:
                return k
            if need < left - max(low, ratio - decay * k) * max(decoding - n * k, 0):
                return k
        return None
