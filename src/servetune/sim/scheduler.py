"""The discrete-event core: an engine's scheduler replayed step by step.

vLLM v1's scheduler (vllm/v1/core/sched/scheduler.py, described in FIELD-NOTES "replay the
real scheduler"): each step first serves the running requests in order - every decoding
request one token, then prefills in progress their next chunk - within a token budget
(max_num_batched_tokens); when the KV pool cannot supply a block, the tail of the running
queue (fcfs) or its worst (priority, arrival) request (priority) is preempted and
recomputed later from scratch; only when nothing was preempted are waiting requests
admitted, up to max_num_seqs, with prefix-cache hits taken first. A prefill that completes
in a step samples the request's next token at the end of that step.

llama.cpp's server (``mode="slots"``) is the same loop without paging or preemption: a
request takes a free slot (-np), its KV is bounded by the slot's context (n_ctx / np, or
the shared n_ctx with --kv-unified), prompts are processed in n_batch-token pieces after
the generating slots' tokens, each step runs as one forward pass per ubatch (-ub), and a
slot keeps its last prompt for reuse (cache_prompt).

The parts: `RunState` is the loop, one method per numbered step; the engine's KV answers
come from its policy (`sim.policies`: `PagedPolicy`, `SlotPolicy`), the waiting order and
the preemption victim from its queue (`sim.queues`), the arrivals from `sim.clients`.

Speed: a decoding request is not touched per step. It advances one token per step by
construction (vLLM requires max_num_batched_tokens >= max_num_seqs, so the budget always
covers every decode), so its state is a function of the global step index; its finish is a
heap event, and the blocks the decoding batch needs at step s are a count per residue
class s mod block_size. Stretches of decode-only steps with an unchanged batch are priced
in one vectorised call and advanced in one jump. The step methods copy the attributes they
use into locals: the loop runs once per step, tens of thousands of times a run.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Any

from servetune.sim.clients import Clients
from servetune.sim.policies import PagedPolicy, SchedulingPolicy, SlotPolicy
from servetune.sim.queues import waiting_queue
from servetune.sim.request import Phase, SimRequest
from servetune.sim.steptime import StepModel, chunk_attn_pairs

# Module-level names for the phases the loop sets and tests (a global load is cheaper than
# an attribute of the enum class on the hot path).
_WAITING, _PREFILL, _DECODE = Phase.WAITING, Phase.PREFILL, Phase.DECODE
_DONE, _REJECTED = Phase.DONE, Phase.REJECTED

IDLE_REJECT = "does not fit in the idle engine's KV cache"

# A step's prompt chunk: (request, tokens, new KV blocks).
Chunk = tuple[SimRequest, int, int]


@dataclass(frozen=True)
class SchedConfig:
    """What the scheduler needs, already resolved from EngineConfig + the plan."""

    mode: str  # "paged" (vLLM v1) | "slots" (llama.cpp)
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int = 16
    kv_blocks: int = 0  # paged: usable blocks
    chunked_prefill: bool = True  # paged (llama.cpp always splits prompts into n_batch)
    prefix_caching: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority"
    slot_ctx: int = 0  # slots: tokens per slot (or the shared pool with kv_unified)
    kv_unified: bool = False
    # slots: a prompt's processing stops, within one step, this many tokens before its end
    # (llama-server's context checkpoints for SWA/recurrent models, `prompt_breaks`)
    prompt_breaks: tuple[int, ...] = ()
    # slots: llama.cpp's -ub (at most -b): a step runs as one forward pass per ubatch
    # (`policies.ubatch_sizes`); 0: one pass per step
    n_ubatch: int = 0
    # radix (SGLang): its scheduler knobs, a `sim.sglang_policy.RadixConfig`; block_size
    # is then the page size and kv_blocks the pool in pages
    radix: Any = None


def make_policy(cfg: SchedConfig) -> SchedulingPolicy:
    """The KV policy of `cfg.mode`: vLLM's paged blocks, SGLang's radix pool or
    llama.cpp's slots."""
    if cfg.mode == "radix":
        from servetune.sim.sglang_policy import RadixPolicy

        chunked = cfg.radix.chunked_prefill_size > 0
        return RadixPolicy(cfg.kv_blocks, cfg.block_size, chunked, cfg.prefix_caching)
    if cfg.mode == "paged":
        return PagedPolicy(cfg.kv_blocks, cfg.block_size, cfg.chunked_prefill, cfg.prefix_caching)
    return SlotPolicy(
        cfg.max_num_seqs,
        cfg.slot_ctx,
        cfg.kv_unified,
        cfg.prefix_caching,
        cfg.prompt_breaks,
        cfg.n_ubatch,
    )


@dataclass
class SchedStats:
    """Counters of one run (RunResult.target.sim)."""

    steps: int = 0
    jumps: int = 0  # loop iterations priced as a decode-only stretch
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens computed, recomputes included
    rejected: int = 0
    evictions: int = 0
    max_blocks_used: int = 0
    trace: list[tuple] = field(default_factory=list)  # rows of TRACE_COLUMNS


TRACE_COLUMNS = (
    "step",
    "steps",
    "t_end_s",
    "step_s",
    "running",
    "waiting",
    "decode_seqs",
    "prefill_seqs",
    "prefill_tokens",
    "kv_blocks_used",
    "preemptions",
)


class Scheduler:
    """One simulated engine: `run()` fills each request's token steps, the step end times
    (`step_end_s`), the finished requests in finishing order (`done`) and `stats`."""

    def __init__(
        self,
        cfg: SchedConfig,
        model: StepModel,
        *,
        closed_users: int | None = None,
        client_cap: int | None = None,
        stop_issuing_s: float | None = None,
        trace: bool = False,
        check: bool = False,
        shapes: set[int] | None = None,
        clients: Clients | None = None,
    ) -> None:
        self.check = check  # verify KV accounting every step (tests)
        # Step sizes (tokens) this engine has run: the first of each pays
        # StepModel.new_shape_cost_s. Shared by the caller to chain runs on one engine.
        self.shapes: set[int] = set() if shapes is None else shapes
        self.cfg = cfg
        self.model = model
        self.policy = make_policy(cfg)
        self.closed_users = closed_users
        self.client_cap = client_cap
        self.stop_issuing_s = stop_issuing_s
        self.want_trace = trace
        self.stats = SchedStats()
        self.step_end_s: list[float] = []
        self.done: list[SimRequest] = []
        # The load side when the caller built it (`sim.sessions`); None: `Clients` above.
        self.clients = clients

    def reject_reason(self, r: SimRequest) -> str | None:
        """Why the engine would refuse this request outright, or None."""
        limit = self.cfg.max_model_len
        if r.total_tokens > limit:
            # vLLM's OpenAI server answers 400: prompt + max_tokens > max_model_len.
            return (
                f"prompt {r.prompt_tokens} + output {r.output_tokens} = {r.total_tokens} "
                f"tokens exceeds max_model_len {limit}"
            )
        return self.policy.reject_reason(r)

    def run(self, requests: list[SimRequest], pool: list[SimRequest] | None = None) -> None:
        """Simulate. Open loop: `requests` carry arrival times. Closed loop: `requests`
        are the first sends in order; `pool` (cycled) supplies the next ones."""
        if self.cfg.mode == "radix":  # SGLang's own loop (prefill-first steps, retraction)
            from servetune.sim.sglang_sched import RadixRunState

            RadixRunState(self, requests, pool).run()
        else:
            RunState(self, requests, pool).run()


class RunState:
    """One run's mutable state. Its methods are the loop's numbered steps: 1 take the
    arrivals, 2 schedule the running requests, 3 admit waiting ones, 4 price the step,
    5 retire the decoders that finished."""

    __slots__ = (
        "sched",
        "model",
        "policy",
        "stats",
        "times",
        "done",
        "shapes",
        "has_shape_cost",
        "extra_passes",
        "api_overhead_s",
        "want_trace",
        "max_seqs",
        "max_batched_tokens",
        "max_request_tokens",
        "blocks_due_at",
        "clients",
        "arrivals",
        "waiting",
        "running",
        "prefilling",
        "finish_events",
        "n_decoding",
        "context_offset",
        "step",
        "now_s",
    )

    def __init__(
        self, sched: Scheduler, requests: list[SimRequest], pool: list[SimRequest] | None
    ) -> None:
        cfg, model = sched.cfg, sched.model
        self.sched = sched
        self.model = model
        self.policy = sched.policy
        self.stats = sched.stats
        self.times = sched.step_end_s  # end time of every step, by step index
        self.done = sched.done
        self.shapes = sched.shapes
        self.has_shape_cost = model.has_shape_cost
        # llama.cpp's ubatches: a step of several forward passes (None: always one)
        self.extra_passes = self.policy.extra_passes if cfg.n_ubatch else None
        self.api_overhead_s = model.api_overhead_s
        self.want_trace = sched.want_trace
        self.max_seqs = cfg.max_num_seqs
        self.max_batched_tokens = cfg.max_num_batched_tokens
        # Longer requests are refused (`Scheduler.reject_reason` says why).
        self.max_request_tokens = min(cfg.max_model_len, self.policy.max_request_tokens)
        self.blocks_due_at = self.policy.blocks_due_at  # updated in place by the policy
        self.clients = sched.clients or Clients(
            model, requests, pool, sched.closed_users, sched.client_cap, sched.stop_issuing_s
        )
        self.arrivals = self.clients.arrivals  # (time the engine sees it, send id, request)
        self.waiting = waiting_queue(cfg.policy)
        self.running: list[SimRequest] = []
        self.prefilling: list[SimRequest] = []  # the running ones in prefill, in order
        # Decoders' finishes: (step of the last token, send id, version, request).
        self.finish_events: list[tuple[int, int, int, SimRequest]] = []
        self.n_decoding = 0
        # Sum over decoders of decode_start_tokens - decode_start_step: the decoding
        # batch's context sum at step s is context_offset + n_decoding * s.
        self.context_offset = 0
        self.step = 0  # index of the next step
        self.now_s = 0.0  # when the next step starts

    def run(self) -> None:
        """Steps 1-5 until nothing runs, waits or is still to arrive."""
        arrivals, running, waiting = self.arrivals, self.running, self.waiting
        finish_events, policy, stats = self.finish_events, self.policy, self.stats
        check = self.sched.check
        take_arrivals, schedule_running = self.take_arrivals, self.schedule_running
        admit_waiting, retire = self.admit_waiting, self.retire
        price_chunks, price_decodes = self.price_chunks, self.price_decodes
        while True:
            if arrivals and arrivals[0][0] <= self.now_s:
                take_arrivals()
            if not running and not waiting:
                if not arrivals:
                    break
                self.now_s = max(self.now_s, arrivals[0][0])
                continue
            chunks, budget, preempted = schedule_running()
            if waiting and not preempted:
                admit_waiting(chunks, budget)
            if chunks:
                price_chunks(chunks)
            elif self.n_decoding:
                price_decodes(preempted)
            else:
                # Nothing can run: the head needs more than the idle engine has (cannot
                # happen for requests that passed reject_reason; a guard against hangs).
                if waiting:
                    self.reject(waiting.pop_head(), IDLE_REJECT, self.now_s)
                    continue
                if not arrivals:
                    break
                self.now_s = max(self.now_s, arrivals[0][0])
                continue
            if check:
                self.check_invariants()
            used = policy.blocks_used()
            if used > stats.max_blocks_used:
                stats.max_blocks_used = used
            if finish_events and finish_events[0][0] < self.step:
                retire()
        stats.steps = self.step
        stats.evictions = policy.evictions()

    # --- 1. arrivals ----------------------------------------------------------------

    def take_arrivals(self) -> None:
        """1. Requests the engine has seen by now join the waiting queue (or are rejected;
        an open loop at its concurrency cap keeps them client-side)."""
        arrivals, clients, waiting = self.arrivals, self.clients, self.waiting
        max_tokens, now = self.max_request_tokens, self.now_s
        deferred = clients.deferred
        while arrivals and arrivals[0][0] <= now:
            t, _, r = heapq.heappop(arrivals)
            if deferred and clients.due(t, r):
                continue
            if not clients.accept(r):
                continue
            if r.prompt_tokens + r.output_tokens <= max_tokens:
                waiting.push(r)
            else:
                self.reject(r, self.sched.reject_reason(r), r.arrival_s)

    def reject(self, r: SimRequest, reason: str | None, t: float) -> None:
        """The engine refuses r: its client sees the error at t."""
        r.phase, r.reject_reason = _REJECTED, reason
        self.stats.rejected += 1
        self.done.append(r)
        self.clients.finished(t, r)

    # --- 2. the running requests ----------------------------------------------------

    def schedule_running(self) -> tuple[list[Chunk], int, bool]:
        """2. Every decoder one token (lazily: it only takes budget and the blocks due),
        then each prefill in progress its next chunk within the token budget; preemption
        while the KV cannot supply the step's blocks. Returns the step's chunks, the budget
        left and whether anything was preempted."""
        budget = self.max_batched_tokens - self.n_decoding
        due = self.blocks_due_at
        demand = due[self.step % len(due)]
        chunks: list[Chunk] = []
        if self.prefilling:
            policy = self.policy
            for r in self.prefilling:
                if budget <= 0:
                    break
                n, need = policy.next_chunk(r, budget)
                chunks.append((r, n, need))
                budget -= n
                demand += need
        # Only a paged policy ever asks for blocks: the decoders', then the chunks' (one
        # allocation); preemption when the pool is short of them.
        if demand and not self.policy.allocate(demand, chunks):
            budget, demand = self.preempt(chunks, budget, demand)
            if demand:
                self.policy.allocate(demand, chunks)
            return chunks, budget, True
        return chunks, budget, False

    def preempt(self, chunks: list[Chunk], budget: int, demand: int) -> tuple[int, int]:
        """vLLM v1 preempts while the pool cannot supply the step: the queue's victim
        leaves the running set, its KV is freed (`PagedPolicy.release_preempted`) and it
        waits again, at the front, to recompute its prompt and what it generated. Returns
        the budget and the block demand left."""
        policy, running, waiting, stats = self.policy, self.running, self.waiting, self.stats
        step = self.step
        while demand > policy.free_blocks() and running:
            victim = waiting.victim(running)
            running.remove(victim)
            if victim.phase is _DECODE:
                if policy.needs_block_at(victim, step):
                    demand -= 1
                kv_tokens = self.stop_decode(victim, step)
            else:
                self.prefilling.remove(victim)
                for k, (r, n, need) in enumerate(chunks):
                    if r is victim:
                        del chunks[k]
                        budget += n
                        demand -= need
                        break
                kv_tokens = victim.computed_tokens
            policy.release_preempted(victim, kv_tokens)
            victim.phase = _WAITING
            victim.computed_tokens = 0
            victim.prefill_target = victim.prompt_tokens + victim.generated
            victim.preemptions += 1
            stats.preemptions += 1
            waiting.requeue(victim)
        return budget, demand

    # --- 3. admission -----------------------------------------------------------------

    def admit_waiting(self, chunks: list[Chunk], budget: int) -> None:
        """3. Waiting requests start, in the queue's order, while budget is left and fewer
        than max_num_seqs run (only in a step without preemption). Admission stops at the
        first that cannot start (seqs cap, budget, KV) and stays stopped until a finish or
        an arrival."""
        waiting, running, prefilling = self.waiting, self.running, self.prefilling
        policy, stats, max_seqs = self.policy, self.stats, self.max_seqs
        while waiting and budget > 0 and len(running) < max_seqs:
            r = waiting.head()
            got = policy.admit(r, budget)
            if got is None:
                break
            waiting.pop_head()
            cached, n, need = got
            r.prefix_hit_tokens += cached
            stats.prefix_hit_tokens += cached
            r.computed_tokens = cached
            r.phase = _PREFILL
            running.append(r)
            prefilling.append(r)
            chunks.append((r, n, need))
            budget -= n

    # --- 4. pricing -------------------------------------------------------------------

    def price_chunks(self, chunks: list[Chunk]) -> None:
        """4. A step with prompt chunks (and the decoders), priced from its features
        (`sim.steptime`); then the chunks advance, and a prompt that completes samples its
        first token at the end of the step."""
        step, n_decoding = self.step, self.n_decoding
        prefill_tokens = 0
        kv_read = self.context_offset + n_decoding * step
        pairs = float(kv_read)
        sq = cached = 0.0
        for r, n, _ in chunks:
            prefill_tokens += n
            kv_read += r.computed_tokens
            pairs += chunk_attn_pairs(r.computed_tokens, n)
            sq += n * (n + 1) / 2
            cached += n * r.computed_tokens
        dt = self.model.time_s(prefill_tokens, n_decoding, kv_read, pairs, sq, cached)
        if self.extra_passes is not None:
            dt += self.model.extra_passes_s(self.extra_passes(chunks))
        if self.has_shape_cost:
            dt += self.new_shape_s(prefill_tokens + n_decoding)
        start = self.now_s
        now = start + dt
        self.now_s = now
        self.times.append(now)
        self.stats.prefill_tokens += prefill_tokens
        if self.want_trace:
            self.record_trace(step, 1, now, dt, len(chunks), prefill_tokens)
        policy, prefilling, running = self.policy, self.prefilling, self.running
        shares = policy.caches_shared_blocks
        first_tokens = 0
        for r, n, _ in chunks:
            r.computed_tokens += n
            if shares and not r.sharing_done and r.prefix_group >= 0:
                policy.register_shared(r)
            if r.computed_tokens >= r.prefill_target:
                prefilling.remove(r)
                r.record_tokens(step, step + 1)
                r.generated += 1
                first_tokens += 1
                if r.generated >= r.output_tokens:
                    running.remove(r)
                    self.finish(r, now)
                else:
                    self.start_decode(r, step + 1)
        self.clients.streamed(start, n_decoding + first_tokens)
        self.step = step + 1

    def price_decodes(self, preempted: bool) -> None:
        """4. A decode-only step. With nothing able to join, the whole stretch of them up
        to the next change is priced in one call and advanced in one jump: it ends at the
        next finish, at the last step whose blocks the KV can still supply, and at the last
        step that starts before the next arrival that could join. Right after a
        preemption, one step (the next may admit again)."""
        model, n_decoding, step, now = self.model, self.n_decoding, self.step, self.now_s
        context = float(self.context_offset + n_decoding * step)
        passes = self.extra_passes
        extra = 0.0 if passes is None else model.extra_passes_s(passes([]))
        if preempted:
            ends = [now + model.decode_time_s(n_decoding, context, extra)]
        else:
            n = self.finish_events[0][0] - step + 1
            if n > 1:
                n = self.policy.decode_steps_supplied(step, n)
            # A full batch cannot take an arrival (it only joins the queue), so then
            # arrivals do not cut the stretch; they are queued after it with their own
            # timestamps.
            arrivals = self.arrivals
            if n > 1 and arrivals and len(self.running) < self.max_seqs:
                t_arr = arrivals[0][0]
                # Steps only get longer in a decode stretch (contexts grow), so the first
                # step's time bounds how many can start before the arrival.
                first = model.decode_time_s(n_decoding, context, extra)
                # (bounded by n before int(): an arrival at +inf would overflow it)
                n = min(n, int(min((t_arr - now) / max(first, 1e-12), n)) + 2)
                ends = model.decode_ends_s(now, n_decoding, context, n, extra)
                # steps starting before the arrival: the first always, then those ending
                # before it
                ends = ends[: 1 + bisect.bisect_left(ends, t_arr, 0, len(ends) - 1)]
            else:
                ends = model.decode_ends_s(now, n_decoding, context, max(n, 1), extra)
        n_steps = len(ends)
        if self.has_shape_cost:
            extra_s = self.new_shape_s(n_decoding)
            if extra_s:
                ends = [e + extra_s for e in ends]
        if n_steps > 1:
            self.policy.take_stretch_blocks(step, n_steps)
        self.times.extend(ends)
        end = ends[-1]
        if self.want_trace:
            self.record_trace(step, n_steps, end, end - now, 0, 0)
        self.clients.streamed(now, n_decoding * n_steps)
        self.now_s = end
        self.step = step + n_steps
        self.stats.jumps += 1

    def new_shape_s(self, tokens: int) -> float:
        """The extra time of the engine's first step of `tokens` tokens (0 after it;
        `StepModel.new_shape_s`)."""
        if tokens in self.shapes:
            return 0.0
        self.shapes.add(tokens)
        return self.model.new_shape_cost_s(tokens)

    # --- 5. retiring ------------------------------------------------------------------

    def retire(self) -> None:
        """5. Decoders whose last token came out in the steps just run leave the engine
        (an event of a decoder preempted since is stale, and skipped)."""
        events, step = self.finish_events, self.step
        while events and events[0][0] < step:
            last, _, version, r = heapq.heappop(events)
            if version != r.version:
                continue
            self.running.remove(r)
            self.stop_decode(r, last + 1)
            self.finish(r, self.times[last])

    def finish(self, r: SimRequest, t_last_s: float) -> None:
        """r produced its last token, at t_last_s: its KV is freed, and its client has the
        answer one API overhead later."""
        self.policy.release(r, self.now_s)
        r.phase = _DONE
        self.done.append(r)
        self.clients.finished(t_last_s + self.api_overhead_s, r)

    # --- the decoding batch -----------------------------------------------------------

    def start_decode(self, r: SimRequest, step: int) -> None:
        """r decodes from `step` on, one token a step, untouched until it leaves."""
        r.phase = _DECODE
        # the prompt and every token sampled (prefill_target + 1 right after a prefill;
        # SGLang's decoders also restart here after a prefill-only step)
        r.decode_start_tokens = r.prompt_tokens + r.generated
        r.decode_start_step = step
        self.policy.decode_started(r)
        self.context_offset += r.decode_start_tokens - step
        self.n_decoding += 1
        r.version += 1
        last = step + r.output_tokens - r.generated - 1
        heapq.heappush(self.finish_events, (last, r.send_id, r.version, r))

    def stop_decode(self, r: SimRequest, step: int) -> int:
        """r leaves the decoding batch before `step`: its lazy state is written back.
        Returns its tokens in KV (the last one sampled is not yet)."""
        self.context_offset -= r.decode_start_tokens - r.decode_start_step
        self.n_decoding -= 1
        r.version += 1
        start = r.decode_start_step
        if step > start:
            r.record_tokens(start, step)
        r.generated += step - start
        kv_tokens = r.decode_start_tokens + step - start - 1
        self.policy.decode_stopped(r, kv_tokens)
        return kv_tokens

    # --- checks and trace -------------------------------------------------------------

    def check_invariants(self) -> None:
        """The seqs cap; the prefill list is exactly the running requests in prefill, in
        running order; the policy's KV accounting. Raises AssertionError."""
        running = self.running
        assert len(running) <= self.max_seqs, "more running than max_num_seqs"
        in_prefill = [r for r in running if r.phase is _PREFILL]
        assert self.prefilling == in_prefill, "the prefill list lost track of the running ones"
        self.policy.check(running, self.step)

    def record_trace(
        self, step: int, n_steps: int, t: float, dt: float, chunks: int, prefill_tokens: int
    ) -> None:
        """One row of TRACE_COLUMNS."""
        running = len(self.running)
        self.stats.trace.append(
            (
                step,
                n_steps,
                float(t),
                float(dt),
                running,
                len(self.waiting),
                running - chunks,
                chunks,
                prefill_tokens,
                self.policy.blocks_used(),
                self.stats.preemptions,
            )
        )
