"""Dates as the store keeps them: ISO-8601 UTC text with a Z, second precision, so they
sort as text on every database and compare across hosts."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone

from servetune.errors import InputError


def utc_now() -> str:
    return utc_text(datetime.now(timezone.utc))


def utc_text(value: datetime | str | None, field: str = "date") -> str:
    """ISO-8601 UTC with a Z, second precision: sortable as text on every database. A
    string that is no date, or a value that is neither text nor a datetime (a number in
    a hand-edited file), is an InputError under `field` (the flag or field the user gave)."""
    if value is None:
        return utc_now()
    if not isinstance(value, (str, datetime)):
        kind = "a number" if isinstance(value, (int, float)) else type(value).__name__
        raise InputError(field, f"is {kind}, not an ISO date/time", "e.g. 2026-01-10T12:00:00Z")
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise InputError(
                field, f"not an ISO date/time: {value!r}", "e.g. 2026-01-10 or 2026-01-10T12:00"
            ) from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def day_end(value: str, field: str = "date") -> str:
    """`value` as an inclusive upper bound, to the precision it was given: a bare date
    takes in that whole day (UTC), an hour (`T19`) that whole hour, a minute (`T19:24`)
    that whole minute (runs at 19:24:xx included); seconds are the store's precision.
    Read to the second, `--until 19:24` left out the runs of the minute the user named."""
    try:
        day = date.fromisoformat(value)
    except ValueError:
        start = utc_text(value, field)
        span = _SPANS.get(_time_parts(value), timedelta(0))
        if not span:
            return start
        bound = datetime.fromisoformat(start.replace("Z", "+00:00")) + span
        return utc_text(bound - timedelta(seconds=1))
    return utc_text(datetime.combine(day, time(23, 59, 59), tzinfo=timezone.utc), field)


# How long a time given to the hour or to the minute lasts (by its number of parts).
_SPANS = {1: timedelta(hours=1), 2: timedelta(minutes=1)}


def _time_parts(value: str) -> int:
    """How many of hours, minutes, seconds the time of an ISO date-time gives (`19:24`,
    `19:24+02:00` and the basic format's `1924` give 2)."""
    clock = value.strip().replace(" ", "T").partition("T")[2]
    clock = re.split(r"[Zz+-]", clock, maxsplit=1)[0].split(".")[0].split(",")[0]
    return len(clock.split(":")) if ":" in clock else len(clock) // 2
