"""The load side of a simulated run: when each request reaches the engine.

Open loop: requests carry their send times; with a concurrency cap (the workload's
`concurrency` on an open-loop arrival), a send beyond the cap waits client-side until a
request ends. Closed loop: `closed_users` clients each send their next request when the
previous one ends, cycling through a pool with fresh ids until `stop_issuing_s`. In the gpu
tier (`StepModel.spread_closed_loop`) every user's second request waits a phase of its own
(`sim.phases`): the first round is the client's burst, the rounds after it are
de-synchronised, as vLLM on a GPU is measured.

The engine's front end (HTTP, tokenise, hand-off: `StepModel.ingress_s`) serves one request
at a time, so a request is seen by the scheduler only after the front end's turn.
"""

from __future__ import annotations

import heapq
from collections import deque

from servetune.sim.phases import phase_offsets_s
from servetune.sim.request import Phase, SimRequest
from servetune.sim.steptime import StepModel


class Clients:
    """Sends requests and hands the engine each one when its front end is done with it.
    `arrivals` is a heap of (time the engine sees it, send id, request)."""

    __slots__ = (
        "arrivals",
        "feed",
        "cycle",
        "next_send_id",
        "in_flight",
        "cap",
        "held_back",
        "freeing",
        "reserved",
        "stop_issuing_s",
        "ingress_s",
        "ingress_per_token_s",
        "stream_s",
        "front_end_free_s",
        "refused_in_row",
        "phases",
        "deferred",
    )

    def __init__(
        self,
        model: StepModel,
        requests: list[SimRequest],
        pool: list[SimRequest] | None,
        closed_users: int | None,
        client_cap: int | None,
        stop_issuing_s: float | None,
    ) -> None:
        closed = closed_users is not None
        self.arrivals: list[tuple[float, int, SimRequest]] = []
        # Closed loop: the sends still to make, in order; `cycle` re-queues each with a
        # fresh id (a pool replayed for a duration).
        self.feed: deque[SimRequest] = deque(
            (pool if pool is not None else requests) if closed else ()
        )
        self.cycle = closed and pool is not None
        self.next_send_id = len(requests)
        self.in_flight = 0
        self.cap = None if closed else client_cap
        self.held_back: deque[SimRequest] = deque()  # open loop, over the cap
        # Open loop under a cap: the client times at which ended requests free their place
        # (a heap), and the sends given a place before the engine sees them. The scheduler
        # can book an end ahead of sends it has not taken yet; a send before that end must
        # still find the place taken (the cap held 2 in flight at a cap of 1 without).
        self.freeing: list[float] = []
        self.reserved: set[int] = set()
        self.stop_issuing_s = stop_issuing_s
        self.ingress_s = model.ingress_s
        self.ingress_per_token_s = model.ingress_per_token_s
        self.stream_s = model.stream_s
        self.front_end_free_s = 0.0  # the serial front end is busy until then
        # Closed-loop sends refused in a row: a whole pool refused means every request
        # is (all longer than the context), and resending them would loop at one instant.
        self.refused_in_row = 0
        # Closed loop, gpu tier: each user's wait before its second send (sim.phases), and
        # the sends made ahead of their time, not yet through the front end (`due`).
        self.phases: deque[float] = deque()
        self.deferred: set[int] = set()
        if closed:
            first = [self.feed.popleft() for _ in range(min(closed_users or 0, len(self.feed)))]
            # users that send more than once leave the burst at phases of their own
            if model.spread_closed_loop and (self.cycle or bool(self.feed)):
                self.phases.extend(phase_offsets_s(model, first, len(first)))
            for r in first:
                r.arrival_s = 0.0
                self.send(0.0, r)
        elif self.stream_s > 0:
            # the front end's streams accrue as the engine runs (`streamed`), so each send
            # goes through it when its time comes (`due`), not all of them up front
            self.deferred.update(r.send_id for r in requests)
            self.arrivals = [(r.arrival_s, r.send_id, r) for r in requests]
        elif self.ingress_s > 0 or self.ingress_per_token_s > 0:
            for r in sorted(requests, key=lambda x: (x.arrival_s, x.send_id)):
                self.send(r.arrival_s, r)
        else:
            self.arrivals = [(r.arrival_s, r.send_id, r) for r in requests]
        heapq.heapify(self.arrivals)

    def send(self, t: float, r: SimRequest) -> None:
        """A client sends r at t; the engine sees it after the front end's turn (its own
        ingress, after any backlog of streamed tokens, `streamed`)."""
        ing0, ing1 = self.ingress_s, self.ingress_per_token_s
        if ing0 > 0 or ing1 > 0:
            t = max(t, self.front_end_free_s) + ing0 + ing1 * r.prompt_tokens
            self.front_end_free_s = t
        heapq.heappush(self.arrivals, (t, r.send_id, r))

    def streamed(self, t: float, tokens: int) -> None:
        """The engine's steps from t on sent `tokens` tokens to their clients: the front
        end owes StepModel.stream_s for each, after what it owed already. Booked as the
        tokens come out, not when a request is sent: a burst of c users is tokenised back
        to back, not one whole reply apart (c = 4, 8,192-token replies: 0.8 s each at
        100 us a token). A send finds the front end free unless its streams outrun it
        (stream_s x tokens per second > 1): then new requests wait, as vLLM's single API
        server paces them at high concurrency."""
        if self.stream_s > 0 and tokens:
            self.front_end_free_s = max(self.front_end_free_s, t) + self.stream_s * tokens

    def due(self, t: float, r: SimRequest) -> bool:
        """A deferred send's time has come (True): it goes through the front end now, and
        reaches the engine after its turn there."""
        if r.send_id not in self.deferred:
            return False
        self.deferred.discard(r.send_id)
        self.send(t, r)
        return True

    def accept(self, r: SimRequest) -> bool:
        """r reaches the engine now (True), or waits client-side under the cap (False)."""
        return self.take_place(r)

    def take_place(self, r: SimRequest) -> bool:
        """r has a place under the cap and is sent now (True), or waits in the client
        (False): until a request ends (`held_back`), or, if one has ended later in client
        time than r was sent, until then."""
        if r.send_id in self.reserved:
            self.reserved.discard(r.send_id)
            return True
        cap = self.cap
        if cap is not None:
            freeing = self.freeing
            while freeing and freeing[0] <= r.arrival_s:
                heapq.heappop(freeing)
            if self.in_flight >= cap:
                self.held_back.append(r)
                return False
            if self.in_flight + len(freeing) >= cap:
                self._place(heapq.heappop(freeing), r)
                return False
        self.in_flight += 1
        return True

    def _place(self, t: float, r: SimRequest) -> None:
        """r waited in the client for a place under the cap, and is sent at t in it."""
        self.in_flight += 1
        self.reserved.add(r.send_id)
        r.arrival_s = t
        self.send(t, r)

    def free_place(self, t: float) -> None:
        """A request ended for its client at t: the oldest held-back send takes its place
        under the cap, or the place is free from t on."""
        if self.held_back:
            self._place(t, self.held_back.popleft())
        elif self.cap is not None:
            heapq.heappush(self.freeing, t)

    def finished(self, t: float, r: SimRequest | None = None) -> None:
        """Request `r` ended for its client at t: a closed-loop client sends its next one,
        an open loop releases a held-back send (`sim.sessions` chains a session's turns)."""
        self.in_flight -= 1
        feed = self.feed
        if self.cycle and r is not None:
            refused = r.phase is Phase.REJECTED
            self.refused_in_row = self.refused_in_row + 1 if refused else 0
            if self.refused_in_row >= len(feed):
                feed.clear()  # the run ends with every request refused, said in its result
        if feed:
            # the user's second send waits its phase (sim.phases); past the stop, none
            phase = self.phases.popleft() if self.phases else None
            t += phase or 0.0
            if self.stop_issuing_s is None or t < self.stop_issuing_s:
                nxt = feed.popleft()
                if self.cycle:
                    feed.append(nxt.resend(self.next_send_id))
                    self.next_send_id += 1
                nxt.arrival_s = t
                if phase is None:
                    self.send(t, nxt)
                else:  # sent later: it reaches the front end when its time comes (`due`)
                    self.deferred.add(nxt.send_id)
                    heapq.heappush(self.arrivals, (t, nxt.send_id, nxt))
        else:
            self.free_place(t)
