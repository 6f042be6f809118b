"""Which configs to try next: grid, random, Bayesian (Optuna TPE with constraints) and
one-at-a-time from the baseline (seed 000 §8: "每次只动一个" — change one knob per step,
keep what helps).

A strategy hands out points (knob -> value) with `ask(n)` and learns from `tell(point,
score)`; `score` None means infeasible or SLO missed. Strategies never see a point twice:
repeats are answered from what they were told. Every strategy is deterministic for a seed
and a sequence of tells, which is what makes a killed study replay to the same place.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from servetune.errors import InputError
from servetune.tune.space import SearchSpace

STRATEGIES: tuple[str, ...] = ("grid", "random", "bayes", "one-at-a-time")
Point = dict[str, Any]


def _k(point: Mapping[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, default=str)


class Strategy:
    """Base: bookkeeping of what was asked and told."""

    name = "base"

    def __init__(self, space: SearchSpace, budget: int | None, seed: int) -> None:
        self.space = space
        self.budget = budget
        self.seed = seed
        self.told: dict[str, float | None] = {}
        self.asked: set[str] = set()

    def ask(self, n: int) -> list[Point]:
        raise NotImplementedError

    def tell(self, point: Point, score: float | None) -> None:
        self.told[_k(point)] = score

    def _room(self, n: int) -> int:
        if self.budget is None:
            return n
        return max(0, min(n, self.budget - len(self.asked)))

    def _take(self, point: Point) -> bool:
        k = _k(point)
        if k in self.asked:
            return False
        self.asked.add(k)
        return True


class ListStrategy(Strategy):
    """Grid (in order) and random (a seeded shuffle, without replacement)."""

    def __init__(self, space: SearchSpace, budget: int | None, seed: int, order: str) -> None:
        super().__init__(space, budget, seed)
        self.name = order
        self.todo = space.valid_points()
        if order == "random":
            random.Random(seed).shuffle(self.todo)

    def ask(self, n: int) -> list[Point]:
        out: list[Point] = []
        while self.todo and len(out) < self._room(n):
            p = self.todo.pop(0)
            if self._take(p):
                out.append(p)
        return out


class OneAtATime(Strategy):
    """Start from the baseline; for each knob in turn, try its other values with every
    other knob held, keep the best if it beats the current one by `min_gain` (noise guard),
    then go on to the next knob. Repeats the sweep while something changed."""

    name = "one-at-a-time"

    def __init__(
        self,
        space: SearchSpace,
        budget: int | None,
        seed: int,
        start: Point,
        min_gain: float = 0.02,
        max_sweeps: int = 2,
    ) -> None:
        # `start` (the baseline, trial 1 under every strategy) is not one of the budget's
        # trials: counted in, `--trials 1` ran the baseline alone, where grid, random
        # and bayes ran it and one more
        super().__init__(space, None if budget is None else budget + 1, seed)
        self.current = dict(start)
        self.min_gain = min_gain
        self.max_sweeps = max_sweeps
        self.knobs = list(space.knobs)
        self.knob_i = -1  # -1: the baseline itself first
        self.sweep = 0
        self.changed = False
        self.pending: list[Point] = []
        self.steps: list[dict[str, Any]] = []  # what each knob step kept, for the explanation

    def _score(self, p: Point) -> float | None:
        return self.told.get(_k(p))

    def _advance(self) -> None:
        """Close the current knob's step (keep the best) and open the next one."""
        if self.knob_i >= 0:
            knob = self.knobs[self.knob_i]
            base = self._score(self.current)
            cands = [{**self.current, knob: v} for v in self.space.knobs[knob]]
            scored = [(self._score(c), c) for c in cands if _k(c) in self.told]
            scored = [(s, c) for s, c in scored if s is not None]
            kept = self.current[knob]
            if scored:
                s, c = max(scored, key=lambda sc: sc[0])
                better = base is None or (s > base and s - base > self.min_gain * abs(base))
                if better and c[knob] != self.current[knob]:
                    self.current, kept, self.changed = c, c[knob], True
            self.steps.append({"knob": knob, "kept": kept, "sweep": self.sweep})
        self.knob_i += 1
        if self.knob_i >= len(self.knobs):
            self.sweep += 1
            if not self.changed or self.sweep >= self.max_sweeps:
                self.pending = []
                self.knob_i = len(self.knobs)
                return
            self.changed, self.knob_i = False, 0
        knob = self.knobs[self.knob_i]
        self.pending = [
            {**self.current, knob: v}
            for v in self.space.knobs[knob]
            if self.space.why_invalid({**self.current, knob: v}) is None
        ]

    def ask(self, n: int) -> list[Point]:
        if self.knob_i == -1 and not self.asked:
            self.pending = [dict(self.current)]
        while True:
            fresh = [p for p in self.pending if _k(p) not in self.asked]
            if fresh:
                out = [p for p in fresh[: self._room(n)] if self._take(p)]
                return out
            if any(_k(p) not in self.told for p in self.pending):
                return []  # wait for the tells of this step
            if self.knob_i >= len(self.knobs):
                return []
            self._advance()
            if self.knob_i >= len(self.knobs):
                return []


class Bayes(Strategy):
    """Optuna's TPE sampler (multivariate, seeded). Numeric knobs are searched over the
    index of their sorted values (so TPE sees the order), others as categories. A point
    the space refuses, or that turns out infeasible / misses the SLO, is told with a
    violated constraint (Optuna's constraints_func), so TPE learns to avoid the region."""

    name = "bayes"

    def __init__(self, space: SearchSpace, budget: int | None, seed: int, start: Point) -> None:
        super().__init__(space, budget, seed)
        try:
            import optuna
        except ImportError:  # pragma: no cover - optuna is a core dependency
            raise InputError("--strategy", "bayes needs optuna", "pip install optuna") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.values: dict[str, list[Any]] = {}
        self.dists: dict[str, Any] = {}
        for name, vals in space.knobs.items():
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
            ordered = sorted(vals) if numeric else list(vals)
            self.values[name] = ordered
            if numeric and len(ordered) > 2:
                self.dists[name] = optuna.distributions.IntDistribution(0, len(ordered) - 1)
            else:
                self.dists[name] = optuna.distributions.CategoricalDistribution(
                    list(range(len(ordered)))
                )
        n_valid = len(space.valid_points())
        startup = max(3, min(10, (budget or n_valid) // 3))
        # Optuna >= 5 takes constraints on the trial (set_constraint); older ones through
        # the sampler's constraints_func reading a user attribute.
        self.native = hasattr(optuna.trial.Trial, "set_constraint")
        kw: dict[str, Any] = {}
        if not self.native:
            kw["constraints_func"] = lambda t: t.user_attrs.get("constraint", [1.0])
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup, multivariate=True, **kw
        )
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.n_valid = n_valid
        self.open: dict[str, list[Any]] = {}  # point key -> optuna trials waiting for it
        if start and space.why_invalid(start) is None:
            self.study.enqueue_trial(self._encode(start))
        self.worst = 0.0

    def _encode(self, point: Point) -> dict[str, int]:
        return {k: self.values[k].index(v) for k, v in point.items() if v in self.values[k]}

    def _decode(self, params: Mapping[str, int]) -> Point:
        return {k: self.values[k][params[k]] for k in self.space.knobs}

    def _finish(self, trial: Any, score: float | None) -> None:
        ok = score is not None
        if self.native:
            trial.set_constraint("feasible", 0.0 if ok else 1.0)
        else:
            trial.set_user_attr("constraint", [0.0 if ok else 1.0])
        self.study.tell(trial, score if ok else self.worst)

    def ask(self, n: int) -> list[Point]:
        out: list[Point] = []
        attempts = 0
        while len(out) < self._room(n) and len(self.asked) < self.n_valid:
            attempts += 1
            if attempts > 50 * max(1, n) + 200:
                break
            trial = self.study.ask(self.dists)
            point = self._decode(trial.params)
            k = _k(point)
            if self.space.why_invalid(point) is not None:
                self._finish(trial, None)
                continue
            if k in self.told:
                self._finish(trial, self.told[k])
                continue
            if k in self.asked:  # asked in this batch, not told yet: wait for it
                self.open.setdefault(k, []).append(trial)
                continue
            self._take(point)
            self.open.setdefault(k, []).append(trial)
            out.append(point)
        return out

    def tell(self, point: Point, score: float | None) -> None:
        super().tell(point, score)
        if score is not None:
            self.worst = min(self.worst, score - abs(score))
        for trial in self.open.pop(_k(point), []):
            self._finish(trial, score)


def make_strategy(
    name: str, space: SearchSpace, budget: int | None, seed: int, start: Point
) -> Strategy:
    if name == "grid":
        return ListStrategy(space, budget, seed, "grid")
    if name == "random":
        return ListStrategy(space, budget or space.size, seed, "random")
    if name == "bayes":
        return Bayes(space, budget, seed, start)
    if name in ("one-at-a-time", "oat"):
        return OneAtATime(space, budget, seed, start)
    raise InputError("--strategy", f"unknown strategy {name!r}", ", ".join(STRATEGIES))
