"""The session driver: bench's sender for multi-turn conversations and agent loops.

A real chat client re-sends the whole conversation each turn, built from the answers it
actually received, and sends the next turn only when the previous answer has completed
and the user (or the tools) took their time. So the turns' bodies cannot be serialised
before the run as single requests are: the driver builds each from the session's history
when it is due. It is bench's `Worker` (connection pool, per-chunk timing, records,
stop and drain) with sessions in place of the request schedule:

- open loop, sessions start at their planned offsets (`start_s`, their first turn's
  send lag is measured as for any schedule); closed loop, `users` run sessions back to
  back until the count is done or `duration_s` has passed (no new session after it);
- a turn that fails ends its session (there is no answer to build on);
- an agent's tool results go back as user messages (every chat template accepts them).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servetune.bench.client import RequestState, spec_body
from servetune.bench.http import Target
from servetune.bench.worker import Item, Worker, WorkerConfig
from servetune.status import RequestStatus
from servetune.workload.materialize import Request
from servetune.workload.session_plan import PlannedSession, SessionPlan
from servetune.workload.spec import WorkloadSpec

_now_ns = time.monotonic_ns

# payload(messages, max_tokens) -> the request's bytes (headers and body)
Payload = Callable[[list[dict[str, Any]], int], bytes]


@dataclass
class SessionConfig(WorkerConfig):
    """A worker config whose items are the sessions of `plan` (texts from `requests`)."""

    plan: SessionPlan | None = None
    texts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # by request index
    payload: Payload | None = None


def session_config(
    base: WorkerConfig, plan: SessionPlan, requests: list[Request], payload: Payload
) -> SessionConfig:
    """`base` (url, timeouts, users, duration, drain ...) driving `plan`'s sessions; the
    answers' text is kept, since the next turn's prompt holds it."""
    args = {k: getattr(base, k) for k in base.__dataclass_fields__}
    args |= {"items": [], "closed_loop": False, "keep_text": True, "flush_s": 0.0}
    texts = {r.index: list(r.messages or []) for r in requests}
    return SessionConfig(**args, plan=plan, texts=texts, payload=payload)


@dataclass(eq=False)  # compared and hashed by identity: kept in a set while it waits
class _Live:
    """A session in progress: its plan, the turn in flight, the exchanges so far."""

    plan: PlannedSession
    turn: int = 0
    history: list[tuple[list[dict[str, Any]], str]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    due_ns: int = 0  # when its next turn may be sent


class SessionWorker(Worker):
    """`Worker` sending sessions: `_pace` starts them, `_done` chains their turns."""

    def __init__(self, cfg: SessionConfig, sink: Callable[[list[dict[str, Any]]], None]) -> None:
        super().__init__(cfg, sink)
        assert cfg.plan is not None and cfg.payload is not None
        self.scfg = cfg
        self.live: dict[int, _Live] = {}  # by the index of its turn in flight
        self.waiting_turns: set[_Live] = set()  # in think time / tool latency
        self.queue: deque[PlannedSession] = deque(cfg.plan.sessions)
        self.active = 0
        self.pacing = True
        self.all_done: asyncio.Event | None = None

    async def _pace(self) -> None:
        self.all_done = asyncio.Event()
        cfg, plan = self.scfg, self.scfg.plan
        assert plan is not None
        if plan.closed:
            for _ in range(min(cfg.users, len(self.queue))):
                self._begin(self.queue.popleft())
        else:
            for s in sorted(plan.sessions, key=lambda x: x.start_s or 0.0):
                target = self.anchor_ns + int((s.start_s or 0.0) * 1e9)
                while (wait_ns := target - _now_ns()) > 20_000:  # never early (`Worker._pace`)
                    await asyncio.sleep(wait_ns / 1e9)
                if not self.issuing:
                    break
                self._begin(s)
            self.queue.clear()
        self.pacing = False
        self._check_done()
        await self.all_done.wait()

    def _begin(self, s: PlannedSession) -> None:
        self.active += 1
        self._send(_Live(s))

    def _when_due(self, live: _Live) -> None:
        """Send the next turn at `due_ns`, never early: the loop's timers round to ~1 ms,
        so a timer that fires before the time is set again for the rest."""
        left_ns = live.due_ns - _now_ns()
        if left_ns > 0:
            live.timer = asyncio.get_running_loop().call_later(left_ns / 1e9, self._when_due, live)
            return
        self._send(live)

    def _send(self, live: _Live) -> None:
        live.timer = None
        self.waiting_turns.discard(live)
        if not self.issuing:
            self._end(live)
            return
        s, j = live.plan, live.turn
        turn = s.turns[j]
        index = s.first_request + j
        new = self.scfg.texts.get(index, [])
        system = [m for m in self.scfg.texts.get(s.first_request, []) if m["role"] == "system"]
        msgs = list(system)
        for k in range(turn.keep_from, j):
            added, answer = live.history[k]
            msgs += [m for m in added if m["role"] != "system"]
            msgs.append({"role": "assistant", "content": answer})
        msgs += [m for m in new if m["role"] != "system"]
        assert self.scfg.payload is not None
        sched = int(s.start_s * 1e9) if j == 0 and s.start_s is not None else None
        item: Item = (index, self.scfg.payload(msgs, turn.output_tokens), sched, None)
        self._items_by_index[index] = item
        self.live[index] = live
        cap = self.cfg.cap
        if cap is not None and len(self.in_flight) >= cap:  # waits in the client's queue
            self.waiting.append((item, _now_ns()))
        else:
            self._start(item)

    def _done(self, st: RequestState) -> None:
        super()._done(st)
        if any(x.index == st.index for x in self.in_flight):
            return  # retried on a fresh connection (`Worker._done`)
        live = self.live.pop(st.index, None)
        if live is None:
            return
        s = live.plan
        if st.status != RequestStatus.OK or not self.issuing or live.turn + 1 >= len(s.turns):
            self._end(live)
            return
        new = [m for m in self.scfg.texts.get(st.index, []) if m["role"] != "system"]
        live.history.append((new, "".join(st.texts or [])))
        live.turn += 1
        live.due_ns = st.end_ns + int(s.turns[live.turn].delay_s * 1e9)
        self.waiting_turns.add(live)
        self._when_due(live)

    def _end(self, live: _Live) -> None:
        self.active -= 1
        cfg = self.scfg
        over = cfg.duration_s is not None and _now_ns() >= self.anchor_ns + cfg.duration_s * 1e9
        if self.issuing and self.queue and cfg.plan is not None and cfg.plan.closed and not over:
            self._begin(self.queue.popleft())
        self._check_done()

    def _check_done(self) -> None:
        if not self.pacing and self.active == 0 and self.all_done is not None:
            self.all_done.set()

    def stop(self, reason: str) -> None:
        """Stop as `Worker.stop`, and drop the turns waiting on think time."""
        for live in list(self.waiting_turns):
            if live.timer is not None:
                live.timer.cancel()
            self.waiting_turns.discard(live)
            self.active -= 1
        super().stop(reason)
        if self.all_done is not None:
            self.all_done.set()


def session_payload(
    spec: WorkloadSpec, model: str | None, path: str, headers: dict[str, str], url: str
) -> Payload:
    """How a turn's messages become request bytes: the workload's API and sampling, as
    `runner.build_items` sends single requests."""
    target = Target(url)

    def payload(messages: list[dict[str, Any]], max_tokens: int) -> bytes:
        body = spec_body(spec, model=model, prompt=None, messages=messages, max_tokens=max_tokens)
        return target.request_bytes(path, body, headers)

    return payload
