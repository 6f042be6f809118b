"""Dates as the store keeps them: ISO-8601 UTC text with a Z, second precision, so they
sort as text on every database and compare across hosts."""

from __future__ import annotations

from datetime import date, datetime, time, timezone

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
    """`value` as an upper bound: a bare date includes that whole day (UTC)."""
    try:
        day = date.fromisoformat(value)
    except ValueError:
        return utc_text(value, field)
    return utc_text(datetime.combine(day, time(23, 59, 59), tzinfo=timezone.utc), field)
