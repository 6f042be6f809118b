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
the generating slots' tokens, and a slot keeps its last prompt for reuse (cache_prompt).

Speed (issue 5): a decoding request is not touched per step. It advances one token per
step by construction (vLLM requires max_num_batched_tokens >= max_num_seqs, so the budget
always covers every decode), so its state is a function of the global step index; its
finish is a heap event, and the blocks the decoding batch needs at step s are a count per
residue class s mod block_size. Stretches of decode-only steps with an unchanged batch are
priced in one vectorised call and advanced in one jump.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from servetune.sim.kvcache import PagedKV, private_hash, shared_hash
from servetune.sim.steptime import StepModel, chunk_attn_pairs

WAITING, PREFILL, DECODE, DONE, REJECTED = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class SchedConfig:
    """What the scheduler needs, already resolved from EngineConfig + the plan."""

    mode: str  # "paged" (vLLM v1) | "slots" (llama.cpp)
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int = 16
    kv_blocks: int = 0  # paged: usable blocks
    chunked_prefill: bool = True
    prefix_caching: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority"
    slot_ctx: int = 0  # slots: tokens per slot (or the shared pool with kv_unified)
    kv_unified: bool = False
    # slots: a prompt's processing stops, within one step, this many tokens before its end
    # (llama-server's context checkpoints for SWA/recurrent models, `prompt_breaks`)
    prompt_breaks: tuple[int, ...] = ()


class SimRequest:
    """Mutable per-request state; decoding state is lazy (see module docstring)."""

    __slots__ = (
        "idx",
        "rid",
        "prompt",
        "out",
        "arrival",
        "scheduled",
        "priority",
        "group",
        "shared",
        "phase",
        "gen",
        "target",
        "computed",
        "held",
        "hashes",
        "reg_done",
        "s0",
        "t0",
        "version",
        "segs",
        "preemptions",
        "cached_tokens",
        "reason",
        "slot",
    )

    def __init__(
        self,
        idx: int,
        rid: int,
        prompt: int,
        out: int,
        arrival: float,
        priority: int,
        group: int,
        shared: int,
        scheduled: float | None = None,
    ) -> None:
        self.idx = idx  # position in the materialised request list
        self.rid = rid  # unique id of this send (closed loops may resend a pool entry)
        self.prompt = prompt
        self.out = out
        self.arrival = arrival
        self.scheduled = scheduled
        self.priority = priority
        self.group = group
        self.shared = shared
        self.phase = WAITING
        self.gen = 0
        self.target = prompt
        self.computed = 0
        self.held = 0
        self.hashes: list[int] = []
        self.reg_done = False
        self.s0 = 0
        self.t0 = 0
        self.version = 0
        self.segs: list[int] = []  # flat [a0, b0, a1, b1, ...]: tokens at steps a..b-1
        self.preemptions = 0
        self.cached_tokens = 0
        self.reason: str | None = None
        self.slot = -1

    def block_hash(self, i: int, bs: int) -> int:
        if self.group >= 0 and (i + 1) * bs <= self.shared:
            return shared_hash(self.group, i)
        return private_hash(self.rid, i)

    def add_tokens(self, a: int, b: int) -> None:
        segs = self.segs
        if segs and segs[-1] == a:
            segs[-1] = b
        else:
            segs.extend((a, b))


@dataclass
class SimStats:
    steps: int = 0
    jumps: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefill_tokens: int = 0
    rejected: int = 0
    evictions: int = 0
    max_blocks_used: int = 0
    trace: list[tuple] = field(default_factory=list)


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
    """Runs the loop; `run()` fills each request's token segments and `step_end_s`."""

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
    ) -> None:
        self.check = check  # verify KV accounting every step (tests)
        # Step sizes (tokens) this engine has run: the first of each pays
        # StepModel.new_shape_cost_s. Shared by the caller to chain runs on one engine.
        self.shapes: set[int] = set() if shapes is None else shapes
        self.cfg = cfg
        self.model = model
        self.paged = cfg.mode == "paged"
        self.bs = cfg.block_size if self.paged else 1 << 30
        self.pool = PagedKV(cfg.kv_blocks if self.paged else 0, cfg.prefix_caching)
        self.closed_users = closed_users
        self.client_cap = client_cap
        self.stop_issuing_s = stop_issuing_s
        self.want_trace = trace
        self.stats = SimStats()
        self.step_end_s: list[float] = []
        self.done: list[SimRequest] = []
        # slots
        n_slots = cfg.max_num_seqs
        self.slot_group = [-2] * n_slots  # prefix group each slot last held
        self.slot_used = [0.0] * n_slots
        self.free_slots = list(range(n_slots))
        self.unified_used = 0

    # --- admission-time checks ------------------------------------------------------

    def reject_reason(self, r: SimRequest) -> str | None:
        """Why the engine would refuse this request outright, or None."""
        cfg = self.cfg
        total = r.prompt + r.out
        if total > cfg.max_model_len:
            # vLLM's OpenAI server answers 400: prompt + max_tokens > max_model_len.
            return (
                f"prompt {r.prompt} + output {r.out} = {total} tokens exceeds "
                f"max_model_len {cfg.max_model_len}"
            )
        if self.paged and math.ceil(total / cfg.block_size) > cfg.kv_blocks:
            return f"needs {math.ceil(total / cfg.block_size)} KV blocks, pool has {cfg.kv_blocks}"
        if not self.paged and total > cfg.slot_ctx:
            # llama-server: the request exceeds the slot's context size.
            return f"{total} tokens exceed the slot context of {cfg.slot_ctx}"
        return None

    # --- the loop -----------------------------------------------------------------

    def run(self, requests: list[SimRequest], pool: list[SimRequest] | None = None) -> None:
        """Simulate. Open loop: `requests` carry arrival times. Closed loop: `requests`
        are the first sends in order; `pool` (cycled) supplies the next ones."""
        cfg, model, pool_kv, bs = self.cfg, self.model, self.pool, self.bs
        paged = self.paged
        stats = self.stats
        times = self.step_end_s
        budget_max = cfg.max_num_batched_tokens
        max_seqs = cfg.max_num_seqs
        priority = cfg.policy == "priority"
        caching = cfg.prefix_caching
        chunked = cfg.chunked_prefill
        api = model.api_overhead_s
        shapes, shape_cost = self.shapes, model.has_shape_cost
        breaks = cfg.prompt_breaks

        arrivals: list[tuple[float, int, SimRequest]] = []
        closed = self.closed_users is not None
        feed = deque(pool if pool is not None else requests) if closed else deque()
        next_rid = [len(requests)]
        in_flight = [0]
        client_q: deque[SimRequest] = deque()
        ing0, ing1 = model.ingress_s, model.ingress_per_token_s
        ingress = ing0 > 0 or ing1 > 0
        fe_free = [0.0]  # the serial front end is busy until then

        def enter(t: float, r: SimRequest) -> None:
            """A client sends r at t; the engine sees it after the front end's turn."""
            if ingress:
                t = max(t, fe_free[0]) + ing0 + ing1 * r.prompt
                fe_free[0] = t
            heapq.heappush(arrivals, (t, r.rid, r))

        if closed:
            for _ in range(min(self.closed_users or 0, len(feed))):
                r = feed.popleft()
                r.arrival = 0.0
                enter(0.0, r)
        elif ingress:
            for r in sorted(requests, key=lambda x: (x.arrival, x.rid)):
                enter(r.arrival, r)
        else:
            arrivals = [(r.arrival, r.rid, r) for r in requests]
        heapq.heapify(arrivals)

        waiting: deque[SimRequest] = deque()
        wheap: list[tuple[int, float, int, SimRequest]] = []
        running: list[SimRequest] = []
        prefilling: list[SimRequest] = []  # the running ones in prefill, in running order
        finish: list[tuple[int, int, int, SimRequest]] = []  # (step, rid, version, req)
        cnt = [0] * (bs if paged else 1)  # decode requests needing a block at s % bs
        n_decode = 0
        s_off = 0  # sum over decoders of (t0 - s0): context sum at step s = s_off + n_decode*s
        s = 0
        now = 0.0

        def n_waiting() -> int:
            return len(wheap) if priority else len(waiting)

        def push_waiting(r: SimRequest, front: bool) -> None:
            if priority:
                heapq.heappush(wheap, (r.priority, r.arrival, r.rid, r))
            elif front:
                waiting.appendleft(r)
            else:
                waiting.append(r)

        def head() -> SimRequest:
            return wheap[0][3] if priority else waiting[0]

        def pop_head() -> SimRequest:
            return heapq.heappop(wheap)[3] if priority else waiting.popleft()

        def client_done(t: float) -> None:
            """A request ended for the client at t: closed loop sends the next one."""
            in_flight[0] -= 1
            if closed:
                if feed and (self.stop_issuing_s is None or t < self.stop_issuing_s):
                    nxt = feed.popleft()
                    if pool is not None:  # cycle through the pool with fresh ids
                        feed.append(_clone(nxt, next_rid[0]))
                        next_rid[0] += 1
                    nxt.arrival = t
                    enter(t, nxt)
            elif client_q:
                nxt = client_q.popleft()
                nxt.arrival = t
                enter(t, nxt)

        def end_request(r: SimRequest, kv_tokens: int, t_last: float) -> None:
            """Release a finished request's KV. Its private blocks become plain free blocks:
            no other request can hit them (an approximation: vLLM keeps them cached until
            evicted, which only changes the eviction order of shared blocks)."""
            if paged:
                pool_kv.release(r.hashes, r.held - len(r.hashes), [])
            else:
                self._slot_free(r, now)
            r.phase = DONE
            self.done.append(r)
            client_done(t_last + api)

        def release_for_preempt(r: SimRequest, kv_tokens: int) -> None:
            cache = []
            if caching:
                cache = [r.block_hash(i, bs) for i in range(len(r.hashes), kv_tokens // bs)]
            pool_kv.release(r.hashes, r.held - len(r.hashes), cache)
            r.hashes = []
            r.held = 0
            r.reg_done = False

        def to_decode(r: SimRequest, s_next: int) -> None:
            nonlocal n_decode, s_off
            r.phase = DECODE
            r.t0 = r.target + 1
            r.s0 = s_next
            if paged:
                cnt[(s_next - r.t0 + 1) % bs] += 1
            s_off += r.t0 - s_next
            n_decode += 1
            r.version += 1
            heapq.heappush(finish, (s_next + r.out - r.gen - 1, r.rid, r.version, r))

        def leave_decode(r: SimRequest, s_at: int) -> int:
            """Materialise a decoder's lazy state before step s_at; returns KV tokens."""
            nonlocal n_decode, s_off
            if paged:
                cnt[(r.s0 - r.t0 + 1) % bs] -= 1
            s_off -= r.t0 - r.s0
            n_decode -= 1
            r.version += 1
            if s_at > r.s0:
                r.add_tokens(r.s0, s_at)
            r.gen += s_at - r.s0
            tokens = r.t0 + s_at - r.s0  # incl. the last sampled token, not yet in KV
            if paged:
                r.held = -(-(tokens - 1) // bs)
            return tokens - 1

        while True:
            # 1. arrivals up to now join the waiting queue (or are rejected)
            while arrivals and arrivals[0][0] <= now:
                r = heapq.heappop(arrivals)[2]
                cap = self.client_cap
                if not closed and cap is not None and in_flight[0] >= cap:
                    client_q.append(r)
                    continue
                in_flight[0] += 1
                reason = self.reject_reason(r)
                if reason is not None:
                    r.phase, r.reason = REJECTED, reason
                    stats.rejected += 1
                    self.done.append(r)
                    client_done(r.arrival)
                    continue
                push_waiting(r, front=False)
            if not running and not n_waiting():
                if not arrivals:
                    break
                now = max(now, arrivals[0][0])
                continue

            # 2. running requests: decodes (lazy) then prefills in progress
            budget = budget_max - n_decode
            demand = cnt[s % bs] if paged else 0
            sched: list[list] = []  # [req, tokens, new_blocks]
            for r in prefilling:
                if budget <= 0:
                    break
                n = min(r.target - r.computed, budget)
                if breaks:
                    n = _to_break(r.computed, n, r.target, breaks)
                need = (-(-(r.computed + n) // bs) - r.held) if paged else 0
                sched.append([r, n, need])
                budget -= n
                demand += need
            preempted = False
            while paged and demand > pool_kv.available and running:
                victim = (
                    max(running, key=lambda x: (x.priority, x.arrival, x.rid))
                    if priority
                    else running[-1]
                )
                preempted = True
                running.remove(victim)
                if victim.phase != DECODE:
                    prefilling.remove(victim)
                if victim.phase == DECODE:
                    if (victim.s0 - victim.t0 + 1) % bs == s % bs:
                        demand -= 1  # it needed a block this step
                    kv_tokens = leave_decode(victim, s)
                else:
                    for item in sched:
                        if item[0] is victim:
                            sched.remove(item)
                            budget += item[1]
                            demand -= item[2]
                            break
                    kv_tokens = victim.computed
                release_for_preempt(victim, kv_tokens)
                victim.phase = WAITING
                victim.computed = 0
                victim.target = victim.prompt + victim.gen
                victim.preemptions += 1
                stats.preemptions += 1
                push_waiting(victim, front=True)
            if paged:
                if demand:  # the decoders' blocks, then the chunks' (one allocation)
                    pool_kv.take(demand)
                for item in sched:
                    item[0].held += item[2]

            # 3. admission of waiting requests, only in a step without preemption. When it
            # stops (seqs cap, budget, KV), it stays stopped until a finish or an arrival.
            if not preempted:
                while n_waiting() and budget > 0 and len(running) < max_seqs:
                    r = head()
                    got = self._admit(r, budget, chunked, caching)
                    if got is None:
                        break
                    pop_head()
                    n, need = got
                    running.append(r)
                    prefilling.append(r)
                    sched.append([r, n, need])
                    budget -= n

            if not sched and n_decode == 0:
                # Nothing can run: the head needs more than the idle engine has (cannot
                # happen for requests that passed reject_reason; a guard against hangs).
                if n_waiting():
                    r = pop_head()
                    r.phase, r.reason = REJECTED, "does not fit in the idle engine's KV cache"
                    stats.rejected += 1
                    self.done.append(r)
                    client_done(now)
                    continue
                if not arrivals:
                    break
                now = max(now, arrivals[0][0])
                continue

            # 4. price the step; a decode-only step with nothing able to join is a jump
            if not sched:
                if preempted:  # the step after a preemption may admit again
                    ctx0 = float(s_off + n_decode * s)
                    ends = [now + model.decode_time_s(n_decode, ctx0)]
                else:
                    # A full batch cannot take an arrival (it only joins the queue), so
                    # then arrivals do not cut the stretch; they are queued after it with
                    # their own timestamps.
                    joinable = arrivals if len(running) < max_seqs else []
                    ends = self._jump(s, n_decode, finish, joinable, now, cnt, s_off)
                n_steps = len(ends)
                if shape_cost and n_decode not in shapes:
                    shapes.add(n_decode)
                    extra_s = model.new_shape_cost_s(n_decode)
                    ends = [e + extra_s for e in ends]
                if paged and n_steps > 1:
                    cycles, rest = divmod(n_steps - 1, bs)
                    extra = cycles * sum(cnt) + sum(cnt[(s + j) % bs] for j in range(1, rest + 1))
                    pool_kv.take(extra)
                times.extend(ends)
                if self.want_trace:
                    self._trace(
                        s, n_steps, ends[-1], ends[-1] - now, len(running), n_waiting(), 0, 0
                    )
                now = ends[-1]
                s += n_steps
                stats.jumps += 1
            else:
                pf_tokens = 0
                kv_read = s_off + n_decode * s
                pairs = float(kv_read)
                sq = 0.0
                for r, n, _ in sched:
                    pf_tokens += n
                    kv_read += r.computed
                    pairs += chunk_attn_pairs(r.computed, n)
                    sq += n * (n + 1) / 2
                dt = model.time_s(pf_tokens, n_decode, kv_read, pairs, sq)
                if shape_cost and (m := pf_tokens + n_decode) not in shapes:
                    shapes.add(m)
                    dt += model.new_shape_cost_s(m)
                now += dt
                times.append(now)
                stats.prefill_tokens += pf_tokens
                if self.want_trace:
                    self._trace(s, 1, now, dt, len(running), n_waiting(), len(sched), pf_tokens)
                for r, n, _ in sched:
                    r.computed += n
                    if caching and paged and not r.reg_done and r.group >= 0:
                        top = min(r.computed, r.shared) // bs
                        for i in range(len(r.hashes), top):
                            if not pool_kv.register(shared_hash(r.group, i)):
                                r.reg_done = True
                                break
                            r.hashes.append(shared_hash(r.group, i))
                    if r.computed >= r.target:
                        prefilling.remove(r)
                        r.add_tokens(s, s + 1)
                        r.gen += 1
                        if r.gen >= r.out:
                            running.remove(r)
                            end_request(r, r.computed, now)
                        else:
                            to_decode(r, s + 1)
                s += 1
            stats.steps = s
            if self.check:
                self.check_invariants(running, s, prefilling)
            if paged:
                used = pool_kv.total - pool_kv.available
                if used > stats.max_blocks_used:
                    stats.max_blocks_used = used

            # 5. decoders that produced their last token in the steps just run
            while finish and finish[0][0] < s:
                f, _, version, r = heapq.heappop(finish)
                if version != r.version:
                    continue
                running.remove(r)
                end_request(r, leave_decode(r, f + 1), times[f])
        stats.evictions = pool_kv.evictions

    # --- helpers ------------------------------------------------------------------

    def check_invariants(
        self, running: list[SimRequest], s: int, prefilling: list[SimRequest]
    ) -> None:
        """KV conservation (free + cached + referenced + private = total), references
        matching holders, no negative counts; seqs cap; the prefill list is exactly the
        running requests in prefill, in running order. Raises AssertionError."""
        assert len(running) <= self.cfg.max_num_seqs, "more running than max_num_seqs"
        in_prefill = [r for r in running if r.phase == PREFILL]
        assert prefilling == in_prefill, "the prefill list lost track of the running ones"
        if not self.paged:
            return
        pool, bs = self.pool, self.bs
        assert pool.free_plain >= 0, "negative free blocks"
        private = 0
        refs: dict[int, int] = {}
        for r in running:
            held = r.held
            if r.phase == DECODE:
                held = -(-(r.t0 + s - r.s0 - 1) // bs)
            assert held >= len(r.hashes), "a request holds fewer blocks than its hashes"
            private += held - len(r.hashes)
            for h in r.hashes:
                refs[h] = refs.get(h, 0) + 1
        assert refs == pool.refs, "cached-block references do not match their holders"
        used = pool.free_plain + len(pool.lru) + len(pool.refs) + private
        assert used == pool.total, f"KV blocks not conserved: {used} != {pool.total}"

    def _admit(
        self, r: SimRequest, budget: int, chunked: bool, caching: bool
    ) -> tuple[int, int] | None:
        """Try to admit `r` with `budget` tokens left: (tokens this step, new blocks) or
        None when it cannot start now (vLLM breaks out of the waiting loop then)."""
        bs = self.bs
        total = r.target
        if self.paged:
            pool = self.pool
            hits = lru_hits = 0
            if caching:
                limit = (total - 1) // bs
                if not r.preemptions:
                    limit = min(limit, r.shared // bs if r.group >= 0 else 0)
                for i in range(limit):
                    h = r.block_hash(i, bs)
                    if h in pool.refs:
                        hits += 1
                    elif h in pool.lru:
                        hits += 1
                        lru_hits += 1
                    else:
                        break
            cached = hits * bs
            left = total - cached
            if not chunked and left > budget:
                return None
            n = min(left, budget)
            need = -(-(cached + n) // bs) - hits
            if need + lru_hits > pool.available:
                return None
            for i in range(hits):
                h = r.block_hash(i, bs)
                pool.hit(h)
                r.hashes.append(h)
            pool.take(need)
            r.held = hits + need
        else:
            if not self.free_slots:
                return None
            if self.cfg.kv_unified:
                if self.unified_used + r.prompt + r.out > self.cfg.slot_ctx:
                    return None
                self.unified_used += r.prompt + r.out
            cached = self._slot_take(r) if caching else self._slot_take_plain(r)
            left = total - cached
            n = min(left, budget)
            if self.cfg.prompt_breaks:
                n = _to_break(cached, n, total, self.cfg.prompt_breaks)
            need = 0
        r.cached_tokens += cached
        self.stats.prefix_hit_tokens += cached
        r.computed = cached
        r.phase = PREFILL
        return n, need

    def _slot_take(self, r: SimRequest) -> int:
        """llama-server slot choice: a free slot that last held the same prefix (its prompt
        cache is reused), else the least recently used free slot."""
        best = None
        for k in self.free_slots:
            if r.group >= 0 and self.slot_group[k] == r.group:
                best = k
                break
        hit = best is not None
        if best is None:
            best = min(self.free_slots, key=lambda k: self.slot_used[k])
        self.free_slots.remove(best)
        r.slot = best
        self.slot_group[best] = r.group
        return min(r.shared, r.target - 1) if hit else 0

    def _slot_take_plain(self, r: SimRequest) -> int:
        k = min(self.free_slots, key=lambda j: self.slot_used[j])
        self.free_slots.remove(k)
        r.slot = k
        return 0

    def _slot_free(self, r: SimRequest, now: float) -> None:
        if r.slot >= 0:
            self.free_slots.append(r.slot)
            self.slot_used[r.slot] = now
        if self.cfg.kv_unified:
            self.unified_used -= r.prompt + r.out

    def _jump(
        self,
        s: int,
        n_decode: int,
        finish: list,
        arrivals: list,
        now: float,
        cnt: list[int],
        s_off: int,
    ) -> list[float]:
        """End times of the decode-only steps that can run before anything changes: up to
        the next finish, the last step whose blocks the pool can still supply, and the last
        step that starts before the next arrival."""
        n = finish[0][0] - s + 1
        if self.paged and n > 1:
            avail = self.pool.available
            bs = self.bs
            # steps s+1.. need cnt[(s+j) % bs] blocks each; stop before the pool runs dry
            per_cycle = sum(cnt)
            if per_cycle * ((n - 1) // bs + 1) > avail:
                need = 0
                for j in range(1, n):
                    need += cnt[(s + j) % bs]
                    if need > avail:
                        n = j
                        break
        model = self.model
        ctx0 = float(s_off + n_decode * s)
        if arrivals and n > 1:
            t_arr = arrivals[0][0]
            # Steps only get longer in a decode stretch (contexts grow), so the first step's
            # time bounds how many can start before the arrival.
            first = model.decode_time_s(n_decode, ctx0)
            n = min(n, int((t_arr - now) / max(first, 1e-12)) + 2)
            ends = model.decode_ends_s(now, n_decode, ctx0, n)
            # steps starting before the arrival: the first always, then those with end < t
            return ends[: 1 + bisect.bisect_left(ends, t_arr, 0, len(ends) - 1)]
        return model.decode_ends_s(now, n_decode, ctx0, max(n, 1))

    def _trace(
        self,
        s: int,
        n: int,
        t: float,
        dt: float,
        running: int,
        waiting: int,
        pf_seqs: int,
        pf_tok: int,
    ) -> None:
        used = self.pool.total - self.pool.available if self.paged else 0
        self.stats.trace.append(
            (
                s,
                n,
                float(t),
                float(dt),
                running,
                waiting,
                running - pf_seqs,
                pf_seqs,
                pf_tok,
                used,
                self.stats.preemptions,
            )
        )


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


def _to_break(computed: int, n: int, total: int, breaks: tuple[int, ...]) -> int:
    """Shorten a prompt chunk [computed, computed + n) so it ends at the first break point
    (total - off) inside it; a chunk that starts on a break point runs on."""
    end = computed + n
    for off in breaks:
        b = total - off
        if computed < b < end:
            end = b
    return end - computed


def _clone(r: SimRequest, rid: int) -> SimRequest:
    return SimRequest(r.idx, rid, r.prompt, r.out, 0.0, r.priority, r.group, r.shared)
