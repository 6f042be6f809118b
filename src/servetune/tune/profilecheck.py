"""Does a cached calibration still describe this host? Checked on this study's baseline
before the profile ranks anything.

Why: a profile is cached per engine, model file and host CPU, but not per host load. One
fitted in a quiet hour and reused on a busy host ranked with 3.58 req/s where the engine
served 0.57; the check after the verify trials then marks it stale, but only after it has
ranked a whole study. So a cached profile is first held to runs measured now: the first
block of the calibration sweep (each sweep case once, at the space's baseline, on the
real engine) is replayed through the simulator with the profile (the runs' exact
requests on one simulated engine, as the fit replays them,
`sim.calibrate.replay_on_one_engine`), and the judged figures of `tune.simvsreal`
(throughput, P50 TTFT, P50 TPOT) are compared, each as the median |sim - real| / real
over the cases. Within the profile's tolerance (its stated error, at most the 25% target,
`calibration.tolerance`) on every figure it is reused and the sweep stops there; beyond
it the sweep runs on (its second block), and the profile is fitted again on both. So a
reuse costs one block of the sweep, a refusal nothing more than calibrating did before.
Pure apart from the simulation: the caller measures the runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from servetune.engines.config import EngineConfig
from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.results.schema import RunResult
from servetune.sim.calibrate import replay_inputs, replay_on_one_engine, served_order
from servetune.sim.profile import Profile
from servetune.tune import simvsreal


def replay_errors(
    runs: list[RunResult], profile: Profile, model: ModelSpec, hw: HardwareSpec, cfg: EngineConfig
) -> dict[str, float]:
    """Per judged figure (`simvsreal.JUDGED`), the median over `runs` of |sim - real| /
    real, the runs replayed through the simulator at `cfg` with `profile` as the replay
    fit replays them (`calibrate.replay_on_one_engine`: one engine's step-size history,
    in the order the engine served them). A figure no run has is left out."""
    per: dict[str, list[float]] = {k: [] for k in simvsreal.JUDGED}
    runs = served_order(runs)
    sims = replay_on_one_engine(map(replay_inputs, runs), model, hw, cfg, profile)
    for run, sim in zip(runs, sims, strict=True):
        got, want = simvsreal.run_figures(sim), simvsreal.run_figures(run)
        for k in per:
            e = simvsreal.rel_error(got[k], want[k])
            if e is not None:
                per[k].append(abs(e))
    return {k: statistics.median(v) for k, v in per.items() if v}


@dataclass(frozen=True)
class BaselineCheck:
    """How a cached profile predicts this study's baseline measured now."""

    errors: dict[str, float]  # judged figure -> median |error| over the cases
    tolerance: float  # the most any figure may miss by (`calibration.tolerance`)
    cases: tuple[str, ...]  # the sweep cases measured

    @property
    def misses(self) -> list[str]:
        """The figures beyond the tolerance; a check with no figure at all misses."""
        if not self.errors:
            return ["no figure"]
        return [k for k, e in self.errors.items() if e > self.tolerance]

    @property
    def holds(self) -> bool:
        return not self.misses

    def figures_text(self) -> str:
        """`throughput 8%, P50 TTFT 31%, P50 TPOT 5%`."""
        return ", ".join(f"{simvsreal.JUDGED[k]} {e:.0%}" for k, e in self.errors.items())

    def line(self) -> str:
        """One line for the output: what was measured, how far off, the decision."""
        head = (
            f"calibration check on this study's baseline ({', '.join(self.cases)}, one run "
            f"each, now): the cached profile is off by {self.figures_text() or 'n/a'} "
            "(median |sim - real| / real)"
        )
        if self.holds:
            return f"{head}, within its {self.tolerance:.0%}: reused"
        return f"{head}, beyond its {self.tolerance:.0%}: refused, calibrating again"

    def reason(self) -> str:
        """Why the profile is fitted again (the calibration's `why`)."""
        off = ", ".join(
            f"{simvsreal.JUDGED.get(k, k)} {self.errors[k]:.0%}"
            for k in self.misses
            if k in self.errors
        )
        return (
            f"the cached profile missed this study's baseline measured now ({off or 'no figure'} "
            f"> its {self.tolerance:.0%})"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "errors": self.errors,
            "tolerance": self.tolerance,
            "cases": list(self.cases),
            "holds": self.holds,
        }
