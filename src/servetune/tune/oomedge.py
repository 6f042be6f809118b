"""The OOM edge along one memory knob and the safe step back from it (seed 003 §15:
"上线配置比OOM边界至少回退一个安全档位" — ship at least one safe step below the OOM edge).

`runs(value)` says whether the engine starts and survives load with that value (the
planner for the simulator, launches for a real engine). The search assumes memory use
grows with the value: above the winner, values run up to an edge and fail beyond it, so
bisection finds the edge in O(log n) probes. Pure: `runs` does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OOMEdge:
    knob: str
    values: list[Any]  # ascending
    largest_ok: Any = None  # the edge: the largest value that runs
    first_fail: Any = None  # the smallest value above it that does not
    safe: Any = None  # what to ship: one step below the edge when the edge was found
    probed: dict[str, bool] = field(default_factory=dict)  # str(value) -> runs
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "values": self.values,
            "largest_ok": self.largest_ok,
            "first_fail": self.first_fail,
            "safe": self.safe,
            "probed": self.probed,
            "note": self.note,
        }


def find_edge(knob: str, values: Sequence[Any], start: Any, runs: Callable[[Any], bool]) -> OOMEdge:
    """Edge above `start` (a value known to run) among `values`, and one step back."""
    vals = sorted(set(values) | {start})
    edge = OOMEdge(knob, vals)
    memo: dict[Any, bool] = {start: True}

    def ok(v: Any) -> bool:
        if v not in memo:
            memo[v] = bool(runs(v))
        edge.probed[str(v)] = memo[v]
        return memo[v]

    lo = vals.index(start)
    hi = len(vals) - 1
    if ok(vals[hi]):
        edge.largest_ok = vals[hi]
        edge.safe = start
        edge.note = f"no OOM up to {knob}={vals[hi]} (the largest value in the space)"
        return edge
    # invariant: vals[lo] runs, vals[hi] fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(vals[mid]):
            lo = mid
        else:
            hi = mid
    edge.largest_ok, edge.first_fail = vals[lo], vals[hi]
    edge.safe = vals[lo - 1] if lo > 0 else None
    if edge.safe is None:
        edge.note = f"{knob}={vals[lo]} runs but is the edge and nothing smaller was given"
    else:
        edge.note = (
            f"{knob}={vals[hi]} does not run; the edge is {vals[lo]}, one step back is {edge.safe}"
        )
    return edge


def step_back(edge: OOMEdge, value: Any) -> Any:
    """The value to ship instead of `value`: one step below the edge when `value` sits on
    it, else `value` itself (already at least one step back)."""
    if edge.first_fail is not None and value == edge.largest_ok and edge.safe is not None:
        return edge.safe
    return value
