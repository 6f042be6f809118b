"""Load points: the workload at each load of a sweep (`bench`/`simulate` --rate and
--concurrency) and at each load a tuner probes."""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    # --input-len / --output-len: every class of traffic at these fixed lengths
    input_len: int | None = None
    output_len: int | None = None

    def __post_init__(self) -> None:
        if self.count is not None and self.duration_s is not None:
            # a workload's count ends its run before its duration (materialize), so one of
            # the two flags would be dropped without a word
            raise InputError(
                "--duration", "--count and --duration both size the run", "give one of them"
            )

    @property
    def swept(self) -> bool:
        """The command line sets the load, so the workload file need not."""
        return bool(self.rates or self.users)

    @property
    def lengths(self) -> bool:
        """The command line fixes the prompt or reply length (`workload.spec.with_lengths`)."""
        return self.input_len is not None or self.output_len is not None

    @property
    def sized(self) -> bool:
        """The command line sizes the run (--count/--duration), so the file need not."""
        return self.count is not None or self.duration_s is not None

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
    if loads.count is not None and spec.trace is not None:
        from servetune.workload.sources import read_trace

        lines = len(read_trace(spec.trace.path))
        if loads.count > lines:  # it sent the lines and said nothing
            raise InputError(
                "--count",
                f"{loads.count:,} is more than the trace's {lines:,} requests",
                f"give at most {lines:,}: a trace sends its own lines, --count cuts them short",
            )
    points = []
    for label, kw in kws:
        if loads.duration_s is not None and spec.arrival.kind == "trace" and "rate" not in kw:
            # the flag typed, not the file's `duration_s` the check would name
            raise InputError(
                "--duration", "a trace replays its own span", "drop it; --count cuts it short"
            )
        try:
            pspec = spec.with_load(count=loads.count, duration_s=loads.duration_s, **kw)
        except ValidationError as exc:  # a value the command line gave: name its flag
            raise from_validation_error(exc, "workload", _FLAGS) from None
        except ValueError as exc:
            raise InputError("--concurrency", str(exc), None) from None
        points.append(Point(label, pspec))
    return points if max_concurrency is None else capped(points, max_concurrency)


def capped(points: list[Point], max_concurrency: int) -> list[Point]:
    """Open-loop points with at most `max_concurrency` requests in flight (the rest wait in
    the client, reported as client queue time); a closed loop keeps its own users, which
    already are its cap. A cap with no open loop to apply to is refused: it used to be
    dropped silently, and it turned an open-loop workload without --rate into a closed
    loop of that many users."""
    if not any(p.spec.arrival.open_loop for p in points):
        raise InputError(
            "--max-concurrency",
            "caps an open loop's requests in flight; a closed loop's users already are its cap",
            "drop it, or give --rate for an open loop",
        )
    return [
        replace(p, spec=p.spec.model_copy(update={"arrival": p.spec.arrival.model_copy(
            update={"concurrency": max_concurrency})}))
        if p.spec.arrival.open_loop
        else p
        for p in points
    ]  # fmt: skip


def load_spec(
    workload: WorkloadSpec, kind: str, load: float, per_user: int, steady: SteadyRule
) -> WorkloadSpec:
    """The workload at one load point. Closed loop: `per_user` requests per user at least,
    so a high concurrency is not measured on a handful of requests; a workload sized by its
    duration alone keeps it (a count would end the run first: materialize counts first, so
    a 300 s workload at 4 users became 4 x `per_user` requests). Open loop: sized by
    `steady` - the arrivals span its warm-up and window, so the count grows with the rate
    and a high rate is not "held" only because the run ends before the queue builds."""
    if kind == "concurrency":
        c = int(load)
        timed = workload.duration_s is not None and workload.count is None
        count = None if timed else max(workload.count or 0, per_user * c) or None
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
