"""User-facing errors: one line, naming the field and the fix, exit code 2.

Every module raises `InputError` for bad input; the CLI turns it into a single
line on stderr (never a traceback).
"""

from __future__ import annotations

from collections.abc import Iterable


class InputError(Exception):
    """Bad user input. `field` names what is wrong, `fix` says what to do."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        msg = f"{self.field}: {self.problem}"
        if self.fix:
            msg += f" ({self.fix})"
        return " ".join(msg.split())


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The names nearest to `name`, for "did you mean" suggestions."""
    import difflib

    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.4)
    substr = [c for c in choices if name.lower() in c.lower() and c not in hits]
    return ([lowered[h] for h in hits] + substr)[:n]


def from_validation_error(exc: Exception, prefix: str = "") -> InputError:
    """Turn a pydantic ValidationError into a one-line InputError naming the field."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return InputError(prefix or "input", str(exc).splitlines()[0])
    first = errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "input")
    value = first.get("input")
    shown = f" (got {value!r})" if value is not None and not isinstance(value, dict) else ""
    return InputError(field, f"{first.get('msg', 'invalid value')}{shown}")
