"""Load points: the workload at each load of a sweep (`bench`/`simulate` --rate and
--concurrency) and at each load a tuner probes."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.measure.session import Point
from servetune.measure.steady import SteadyRule
from servetune.workload.spec import TRACE_USERS, WorkloadSpec

# The workload fields a sweep's flags set (`WorkloadSpec.with_load`), for error messages.
_FLAGS = {
    "count": "--count",
    "duration_s": "--duration",
    "arrival.rate": "--rate",
    "arrival.concurrency": "--concurrency",
}


@dataclass(frozen=True)
class SweepLoads:
    """The loads a sweep measures (--rate / --concurrency lists; neither: the workload's
    own) and what every point overrides in the workload (--count / --duration)."""

    rates: tuple[float, ...] = ()
    users: tuple[int, ...] = ()
    count: int | None = None
    duration_s: float | None = None

    @property
    def swept(self) -> bool:
        """The command line sets the load, so the workload file need not."""
        return bool(self.rates or self.users)

    @property
    def many(self) -> bool:
        """More than one point: a sweep (its files and runs are per point)."""
        return len(self.rates) + len(self.users) > 1


def sweep_points(
    spec: WorkloadSpec, loads: SweepLoads, max_concurrency: int | None = None
) -> list[Point]:
    """One point per open-loop rate (`rate4`), then per closed-loop user count (`conc8`);
    the workload's own load (`point`) when neither is given. `max_concurrency` caps the
    open-loop points' in-flight requests. Every point is checked before any is measured."""
    kws: list[tuple[str, dict]] = [(f"rate{r:g}", {"rate": r}) for r in loads.rates]
    kws += [(f"conc{u}", {"concurrency": u}) for u in loads.users]
    if not kws:
        kws = [("point", {})]
    if max_concurrency is not None:
        kws = [(lbl, {"concurrency": max_concurrency, **kw}) for lbl, kw in kws]
    points = []
    for label, kw in kws:
        try:
            pspec = spec.with_load(count=loads.count, duration_s=loads.duration_s, **kw)
        except ValidationError as exc:  # a value the command line gave: name its flag
            raise from_validation_error(exc, "workload", _FLAGS) from None
        except ValueError as exc:
            raise InputError("--concurrency", str(exc), None) from None
        points.append(Point(label, pspec))
    return points


def load_spec(
    workload: WorkloadSpec, kind: str, load: float, per_user: int, steady: SteadyRule
) -> WorkloadSpec:
    """The workload at one load point. Closed loop: `per_user` requests per user at least,
    so a high concurrency is not measured on a handful of requests. Open loop: sized by
    `steady` - the arrivals span its warm-up and window, so the count grows with the rate
    and a high rate is not "held" only because the run ends before the queue builds."""
    if kind == "concurrency":
        c = int(load)
        count = max(workload.count or 0, per_user * c) or None
        try:
            return workload.with_load(concurrency=c, count=count)
        except ValueError:  # a trace: the tuner's users cannot set its send times
            raise InputError(
                "--workload", TRACE_USERS, "give a generated arrival: poisson, gamma or closed"
            ) from None
    return steady.sized(workload, load)


def probe_point(
    workload: WorkloadSpec, kind: str, load: float, per_user: int, steady: SteadyRule
) -> Point:
    """A tuner probe as a point, labelled `concurrency=8` / `rate=2.5`."""
    return Point(f"{kind}={load:g}", load_spec(workload, kind, load, per_user, steady))
