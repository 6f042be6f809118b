"""The waiting queue of vLLM v1's two scheduling policies, and whom each preempts.

vllm/v1/core/sched/request_queue.py: FCFS is a deque in arrival order; priority is a heap
on (priority, arrival time), lower first. A preempted request goes back to the front of the
FCFS queue, and into the heap under its own key. When the KV pool runs dry, FCFS preempts
the tail of the running list, priority the running request that sorts last.

Both subclass the builtin container they are, so `len()` and the FCFS operations stay C
calls: the scheduler asks for them every step.
"""

from __future__ import annotations

import heapq
from collections import deque

from servetune.sim.request import SimRequest


class FcfsQueue(deque):
    """Waiting requests in arrival order."""

    push = deque.append
    requeue = deque.appendleft  # a preempted request is served first again
    pop_head = deque.popleft

    def head(self) -> SimRequest:
        return self[0]

    @staticmethod
    def victim(running: list[SimRequest]) -> SimRequest:
        """The request preemption takes first: the last one scheduled."""
        return running[-1]


def _priority_key(r: SimRequest) -> tuple[int, float, int]:
    return (r.priority, r.arrival_s, r.send_id)


class PriorityQueue(list):
    """Waiting requests as a heap on (priority, arrival, send id)."""

    def push(self, r: SimRequest) -> None:
        heapq.heappush(self, (r.priority, r.arrival_s, r.send_id, r))

    requeue = push  # a preempted request keeps its key

    def head(self) -> SimRequest:
        return self[0][3]

    def pop_head(self) -> SimRequest:
        return heapq.heappop(self)[3]

    @staticmethod
    def victim(running: list[SimRequest]) -> SimRequest:
        """The request preemption takes first: the one the policy ranks last."""
        return max(running, key=_priority_key)


WaitingQueue = FcfsQueue | PriorityQueue


def waiting_queue(policy: str) -> WaitingQueue:
    """An empty queue for vLLM's `--scheduling-policy` (fcfs | priority)."""
    return PriorityQueue() if policy == "priority" else FcfsQueue()
