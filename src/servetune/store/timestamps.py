"""Dates as the store keeps them: ISO-8601 UTC text with a Z, second precision, so they
sort as text on every database and compare across hosts."""

from __future__ import annotations

from datetime import datetime, timezone

from servetune.errors import InputError


def utc_now() -> str:
    return utc_text(datetime.now(timezone.utc))


def utc_text(value: datetime | str | None) -> str:
    """ISO-8601 UTC with a Z, second precision: sortable as text on every database."""
    if value is None:
        return utc_now()
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise InputError("date", f"not an ISO date/time: {value!r}") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
