"""Sessions in the simulator: turns chained through the client, history reused through
the engine's prefix cache.

- Chaining: a session's next turn is sent when the previous answer reaches the client,
  plus its delay (think time, tool latency); closed loop, a user starts the next session
  when one ends; a turn the engine refuses ends its session (a client has no answer to
  build on).
- Prefix reuse (vLLM, paged): the history only grows, so block i of every turn of a
  session holds the same tokens, and its hash is the session's (`shared_hash(group, i)`,
  as vLLM's hash chain makes equal prefixes equal); blocks wholly inside the system
  prompt carry the system prompt group's hash, shared by every session that opens with
  it. A turn's full prompt blocks are cached once computed, so the next turn hits them
  while they survive: think time keeps them as evictable cached blocks (vLLM frees a
  finished request's blocks into the LRU free queue), and pressure from other sessions
  evicts them, turning hits into misses. Blocks filled by decoding are not cached (the
  next prompt re-tokenises the answer inside the chat template, so its tokens seldom
  match the generated ones). A context cap that dropped history starts a new group: the
  prompt no longer extends the cached one.
- llama.cpp (slots): a slot keeps its last prompt (cache_prompt); a turn that gets the
  slot its session last used reuses the previous prompt, else it recomputes all
  (`SlotPolicy`: a free slot that last held the same group, else the least recently
  freed one). Reuse across sessions through a shared system prompt in a slot is not
  modelled.
"""

from __future__ import annotations

import heapq
from collections import deque

from servetune.sim.clients import Clients
from servetune.sim.kvcache import shared_hash
from servetune.sim.request import Phase, SimRequest
from servetune.sim.steptime import StepModel
from servetune.workload.session_plan import SessionPlan


class TurnRequest(SimRequest):
    """One turn: its next turn and the delay before it, and the system prompt's blocks."""

    __slots__ = ("next_turn", "delay_s", "system_group", "system_tokens", "through_front")

    def block_hash(self, i: int, block_size: int) -> int:
        if self.system_group >= 0 and (i + 1) * block_size <= self.system_tokens:
            return shared_hash(self.system_group, i)
        return shared_hash(self.prefix_group, i)


def session_requests(
    plan: SessionPlan, paged: bool, prompts: dict[int, int] | None = None
) -> list[list[TurnRequest]]:
    """Every session's turns as scheduler requests, linked in order. `send_id` is the
    turn's Request index. `prompts`: prompt tokens by that index where known better than
    the plan's count (a real run's, counted by the server: template and BOS included).
    Group ids: system prompts first, then one per session and history cut (`keep_from`)."""
    known = prompts or {}
    n_sys = 1 + max((s.system_group for s in plan.sessions), default=-1)
    groups: dict[tuple[int, int], int] = {}
    out = []
    for s in plan.sessions:
        turns: list[TurnRequest] = []
        for j, t in enumerate(s.turns):
            group = groups.setdefault((s.index, t.keep_from), n_sys + len(groups))
            index = s.first_request + j
            prompt = known.get(index, s.prompt_tokens(j))
            # paged: every full prompt block is the session's content, cached for the next
            # turn; slots: what the slot still holds from the previous turn
            reused = s.reused_tokens(j)
            if j and reused == s.prompt_tokens(j - 1):  # the history is intact
                reused = known.get(index - 1, reused)
            shared = prompt if paged else min(reused, prompt)
            first = j == 0
            r = TurnRequest(
                index,
                index,
                prompt,
                t.output_tokens,
                s.start_s if first and s.start_s is not None else 0.0,
                0,
                group,
                shared,
                s.start_s if first else None,
            )
            r.delay_s = t.delay_s
            r.next_turn = None
            r.system_group = s.system_group
            r.system_tokens = s.system_tokens
            r.through_front = False
            if turns:
                turns[-1].next_turn = r
            turns.append(r)
        out.append(turns)
    return out


class SessionClients(Clients):
    """`Clients` for sessions: open loop, each session's first turn at its start time;
    closed loop, `users` run the sessions in order, back to back; every follow-up turn is
    sent when the previous answer arrived plus its delay. An open loop's cap (the
    arrival's `concurrency`) holds turns client-side past it, as bench's worker does.

    The engine's serial front end (`Clients.send`) is applied when a send comes up in time
    order (`accept`), not when it is scheduled: a follow-up planned seconds ahead must not
    hold the front end against the sends before it."""

    __slots__ = ("queue",)

    def __init__(
        self,
        model: StepModel,
        sessions: list[list[TurnRequest]],
        users: int | None,
        stop_issuing_s: float | None,
        cap: int | None = None,
    ) -> None:
        super().__init__(model, [], None, None, None if users is not None else cap, stop_issuing_s)
        self.queue: deque[TurnRequest] = deque(s[0] for s in sessions if s)
        if users is None:
            for r in sorted(self.queue, key=lambda x: (x.arrival_s, x.send_id)):
                self.send(r.arrival_s, r)
            self.queue.clear()
        else:
            for _ in range(min(users, len(self.queue))):
                self.start_session(0.0)

    def send(self, t: float, r: SimRequest) -> None:
        heapq.heappush(self.arrivals, (t, r.send_id, r))

    def accept(self, r: SimRequest) -> bool:
        """r reaches the engine once the front end had its turn (re-queued until then)."""
        if not isinstance(r, TurnRequest):
            return self.take_place(r)
        if r.through_front:
            return True  # its place was taken when it was sent
        if not self.take_place(r):
            return False  # an open loop's cap holds it in the client
        r.through_front = True
        ing0, ing1 = self.ingress_s, self.ingress_per_token_s
        if ing0 > 0 or ing1 > 0:
            t = max(r.arrival_s, self.front_end_free_s) + ing0 + ing1 * r.prompt_tokens
            self.front_end_free_s = t
            heapq.heappush(self.arrivals, (t, r.send_id, r))
            return False
        return True

    def start_session(self, t: float) -> None:
        r = self.queue.popleft()
        r.arrival_s = t
        self.send(t, r)

    def finished(self, t: float, r: SimRequest | None = None) -> None:
        self.in_flight -= 1
        nxt = r.next_turn if isinstance(r, TurnRequest) else None
        if nxt is not None and r is not None and r.phase is not Phase.REJECTED:
            nxt.arrival_s = t + nxt.delay_s
            self.send(nxt.arrival_s, nxt)
        elif self.queue and (self.stop_issuing_s is None or t < self.stop_issuing_s):
            self.start_session(t)
        self.free_place(t)
