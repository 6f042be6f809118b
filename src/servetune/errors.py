"""User-facing errors: one line, naming the field and the fix, exit code 2.

Every module raises `InputError` for bad input; the CLI turns it into a single
line on stderr (never a traceback).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


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


_NOT_GIVEN: Any = object()


def from_validation_error(
    exc: Exception,
    prefix: str = "",
    flags: Mapping[str, str] | None = None,
    data: Any = _NOT_GIVEN,
    model: Any = None,
) -> InputError:
    """Turn a pydantic ValidationError into a one-line InputError naming the field: the
    first error's location under `prefix`, or the command-line flag `flags` maps that
    location to (`{"count": "--count"}`), so the user reads the name they typed. Given the
    validated `data`, the location is the path the user wrote (`written_path`). Pydantic's
    own framing (error counts, type codes, URLs) is dropped, and the value shown is cut
    short: a YAML alias can make it megabytes. A missing field names the keys beside it
    that the model has no field for (`fixed` given `mean` instead of `value`); given the
    `model` validated, an unknown key names the keys its place has (`known_keys`)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return InputError(prefix or "input", str(exc).splitlines()[0])
    every = errors()
    first = every[0]
    path = tuple(first.get("loc", ()))
    if data is not _NOT_GIVEN:
        path = written_path(path, data, missing=first.get("type") == "missing")
    loc = ".".join(str(p) for p in path if p != "__root__")
    flag = (flags or {}).get(loc)
    sep = " " if prefix.startswith("--") else "."  # `--set max_num_seqs`, `workload.count`
    field = flag or (f"{prefix}{sep}{loc}" if prefix and loc else (prefix or loc or "input"))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    msg = _ENUM_REPR.sub(r"\1", msg)  # allowed values as the user writes them
    if first.get("type") == "missing":
        return _missing(field, first, every)
    if first.get("type") == "extra_forbidden" and model is not None:
        known = known_keys(model, tuple(first.get("loc", ()))[:-1])
        if known:  # `p42` under ttft_ms: the keys that are there, not pydantic's words
            name = str(tuple(first.get("loc", ("key",)))[-1])
            near = closest(name, known)
            fix = f"did you mean {', '.join(near)}?" if near else f"known: {', '.join(known)}"
            return InputError(field, f"unknown key {name!r}", fix)
    value = first.get("input")
    shown = "" if value is None or isinstance(value, dict) else f" (got {_short(value)})"
    return InputError(field, f"{msg}{shown}")


def known_keys(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found at `loc` under `model` (a pydantic model class),
    following each field's type through Optional and lists; [] when the path leaves the
    models (a dict, a union of several models)."""
    from pydantic import BaseModel

    node = model
    for part in loc:
        field = node.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            if isinstance(part, int):
                continue  # a list's index: the item's model is already `node`
            return []
        inner = [a for a in _type_args(field.annotation) if _is_model(a, BaseModel)]
        if len(inner) != 1:
            return []
        node = inner[0]
    return list(node.model_fields)


def _type_args(tp: Any) -> list[Any]:
    """`tp` and, through Optional/Union/list, the types inside it."""
    from typing import get_args

    out = [tp]
    for arg in get_args(tp):
        out += _type_args(arg)
    return out


def _is_model(tp: Any, base: type) -> bool:
    return isinstance(tp, type) and issubclass(tp, base)


def _missing(field: str, first: Mapping[str, Any], every: list[Any]) -> InputError:
    """A required field not given, with the keys given beside it that are no field of that
    model: most often the same number under another distribution's name."""
    parent = tuple(first.get("loc", ()))[:-1]
    stray = [
        str(e["loc"][-1])
        for e in every
        if e.get("type") == "extra_forbidden" and tuple(e.get("loc", ()))[:-1] == parent
    ]
    name = str(tuple(first.get("loc", ("field",)))[-1])
    beside = f", and it has no field {', '.join(stray)}" if stray else ""
    return InputError(field, f"is missing{beside}", f"give {name}")


def written_path(loc: tuple[Any, ...], data: Any, missing: bool = False) -> tuple[Any, ...]:
    """The part of a pydantic error location that the user wrote in `data`. A
    discriminated union's tag (`fixed` in `input_tokens.fixed.value`) and the wrappers a
    before-validator adds (the workload's one-entry `mix` around its top-level
    input_tokens) are not in the file, so naming them sends the user looking for keys that
    are not there. For a `missing` error the last part stays, absent as it is: it names the
    field to give."""
    out: list[Any] = []
    node = data
    for k, part in enumerate(loc):
        keyed = isinstance(node, Mapping) and part in node
        listed = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if keyed or listed:
            node = node[part]
        elif not (missing and k == len(loc) - 1):
            continue  # a tag or a wrapper: not written
        out.append(part)
    return tuple(out)


# pydantic names a Literal of enum members by their reprs: `<RunStatus.COMPLETED: 'completed'>`
_ENUM_REPR = re.compile(r"<\w+\.\w+: ('[^']*')>")


def _short(value: object, limit: int = 60) -> str:
    """`repr(value)`, at most `limit` characters (long ones end in `...`). A nested value
    is described, not printed: its repr could be as big as an alias-expanded YAML."""
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse_bool(fields: Mapping[str, Any], data: object) -> object:
    """A pydantic model's before-validator body: YAML's `true`/`false` given for a number
    field (`int`, `float`, or either or None) of the model (`fields`: its model_fields).
    Pydantic reads them as 1 and 0, so `count: true` would run one request."""
    import typing

    if not isinstance(data, dict):
        return data
    for name, value in data.items():
        info = fields.get(name)
        if info is None or not isinstance(value, bool):
            continue
        kinds = {
            typing.get_args(k)[0] if typing.get_origin(k) is typing.Annotated else k
            for k in typing.get_args(info.annotation) or (info.annotation,)
        }
        if bool not in kinds and kinds & {int, float}:
            raise ValueError(f"{name} must be a number, not {str(value).lower()}")
    return data
