"""The built-in accelerator catalog, plus user entries from a `--hardware-file`.

Why: every plan starts from per-device memory, bandwidth and peak FLOP/s. The packaged
`data/hardware.yaml` covers common accelerators with datasheet figures; a user file (YAML or
JSON, same fields) adds new devices or corrects built-ins without waiting for a release.
Every entry is validated into a `HardwareSpec`; anything wrong becomes a one-line `InputError`
naming the entry and the field.

File layout (the packaged catalog uses the second form)::

    my-gpu: {display_name: ..., vendor: ..., memory_gib: ..., ...}      # entries at top level
    # or
    hardware: {my-gpu: {...}}
    aliases: {mygpu: my-gpu}

An entry whose key matches a built-in overrides only the fields it gives; a new key must give
every required field. The entry's `name` always comes from its key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import ValidationError

from servetune.errors import InputError, closest, from_validation_error
from servetune.hardware.local import LOCAL_NAMES, local_hardware
from servetune.hardware.spec import HardwareSpec
from servetune.yamlfile import parse_yaml

_NAME_FIELD = "hardware"
_FILE_FIELD = "hardware-file"
_BUILTIN_WHERE = "hardware catalog"
_SPEC_FIELDS = tuple(f for f in HardwareSpec.model_fields if f != "name")
_FILE_FIX = "use a YAML or JSON file mapping entry names to HardwareSpec fields"


@dataclass(frozen=True)
class _Catalog:
    """Validated entries and aliases (alias -> entry name), both keyed by normalized name."""

    entries: Mapping[str, HardwareSpec]
    aliases: Mapping[str, str]


def normalize_name(name: object) -> str:
    """Lower-case, with spaces/underscores as dashes, so `H100_SXM` finds `h100-sxm`."""
    return re.sub(r"[\s_]+", "-", str(name).strip().lower())


def hardware_names(extra_file: str | Path | None = None) -> list[str]:
    """Sorted entry names (built-ins, plus those of `extra_file` if given); aliases left out."""
    return sorted(_catalog(extra_file).entries)


def hardware_aliases(extra_file: str | Path | None = None) -> dict[str, str]:
    """Alias -> entry name, e.g. `{"h100": "h100-sxm", ...}`."""
    return dict(_catalog(extra_file).aliases)


def get_hardware(
    name: str, extra_file: str | Path | None = None, *, file_hint: bool = True
) -> HardwareSpec:
    """The spec for `name` (case-insensitive, aliases allowed); user entries take precedence.
    `file_hint=False`: the command has no --hardware-file, so an unknown name's fix does not
    send the user to one (calibrate's profile names hardware the simulator looks up)."""
    if name is None or not str(name).strip():
        raise InputError(_NAME_FIELD, "no accelerator given", "pass a name such as h100-sxm")
    catalog = _catalog(extra_file)
    key = normalize_name(name)
    if key in catalog.entries:
        return catalog.entries[key]
    if key in catalog.aliases:
        return catalog.entries[catalog.aliases[key]]
    if key in LOCAL_NAMES:
        return _local()
    suggestions = closest(key, [*catalog.entries, *catalog.aliases])
    if suggestions:
        hint = "did you mean " + ", ".join(suggestions) + "?"
    else:
        hint = "known: " + ", ".join(sorted(catalog.entries)) + "."
    if file_hint:
        fix = f"{hint} Or describe it in a --hardware-file (YAML/JSON, same fields as the catalog)"
    else:
        fix = f"{hint} `servetune gpus` lists them all" if suggestions else hint.rstrip(".")
    raise InputError(_NAME_FIELD, f"unknown accelerator {str(name)!r}", fix)


@lru_cache(maxsize=1)
def _local() -> HardwareSpec:
    return local_hardware()


def load_hardware_file(path: str | Path) -> dict[str, HardwareSpec]:
    """The entries a user file defines, validated; overrides come back merged over built-ins."""
    return dict(_user_catalog(path).entries)


# --------------------------------------------------------------------------- internals


def _catalog(extra_file: str | Path | None) -> _Catalog:
    """Built-ins, with the user file's entries and aliases laid over them."""
    builtin = _builtin_catalog()
    if extra_file is None:
        return builtin
    user = _user_catalog(extra_file)
    entries = {**builtin.entries, **user.entries}
    # A user entry named like a built-in alias shadows that alias.
    aliases = {a: t for a, t in builtin.aliases.items() if a not in user.entries}
    aliases.update(user.aliases)
    return _Catalog(MappingProxyType(entries), MappingProxyType(aliases))


@lru_cache(maxsize=1)
def _builtin_catalog() -> _Catalog:
    """Parse and validate the packaged YAML once per process."""
    text = (resources.files("servetune") / "data" / "hardware.yaml").read_text("utf-8")
    return _parse_document(parse_yaml(text), where=_BUILTIN_WHERE, origin="hardware.yaml")


def _user_catalog(path: str | Path) -> _Catalog:
    """Read, parse and validate a user hardware file; re-read whenever the file changes."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError:
        st = None
    if st is None or not p.is_file():
        return _parse_user_file(p)  # raises the right one-line error
    return _cached_user_file(p, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _cached_user_file(p: Path, _mtime_ns: int, _size: int) -> _Catalog:
    """Planners look hardware up per candidate; parse each version of a file once."""
    return _parse_user_file(p)


def _parse_user_file(p: Path) -> _Catalog:
    data = _read_document(p)
    return _parse_document(data, where=_FILE_FIELD, origin=str(p), base=_builtin_catalog())


def _read_document(p: Path) -> Any:
    """Load YAML or JSON (by suffix; YAML otherwise, which also reads JSON)."""
    if not p.exists():
        raise InputError(_FILE_FIELD, f"{p} does not exist", _FILE_FIX)
    if p.is_dir():
        raise InputError(_FILE_FIELD, f"{p} is a directory", _FILE_FIX)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(_FILE_FIELD, f"{p} is not a text file", _FILE_FIX) from None
    except OSError as exc:
        raise InputError(_FILE_FIELD, f"cannot read {p}: {exc.strerror or exc}") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            problem = f"{p} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            raise InputError(_FILE_FIELD, problem, _FILE_FIX) from None
    else:
        try:
            data = parse_yaml(text)
        except yaml.YAMLError as exc:
            raise InputError(_FILE_FIELD, _yaml_problem(p, exc), _FILE_FIX) from None
    if data is None:
        raise InputError(_FILE_FIELD, f"{p} is empty", _FILE_FIX)
    if not isinstance(data, dict):
        raise InputError(
            _FILE_FIELD,
            f"{p} must map entry names to fields, not be a {type(data).__name__}",
            _FILE_FIX,
        )
    return data


def _yaml_problem(p: Path, exc: yaml.YAMLError) -> str:
    """One readable line from a PyYAML error (its str() spans several lines)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return f"{p} is not valid YAML or JSON: {problem}{where}"


def _parse_document(
    data: Any,
    *,
    where: str,
    origin: str,
    base: _Catalog | None = None,
) -> _Catalog:
    """Validate every entry and alias of one document; `base` holds the entries to override."""
    fix = f"fix it in {origin}"
    if not isinstance(data, dict):
        raise InputError(where, f"{origin} must map entry names to fields", _FILE_FIX)
    if "hardware" in data and isinstance(data["hardware"], dict):
        unknown = [k for k in data if k not in ("hardware", "aliases")]
        if unknown:
            raise InputError(
                f"{where} {unknown[0]}",
                "unknown top-level key beside 'hardware'",
                "only 'hardware' and 'aliases' may sit at the top level",
            )
        raw_entries: dict[Any, Any] = data["hardware"]
    else:
        raw_entries = {k: v for k, v in data.items() if k != "aliases"}
    raw_aliases = data.get("aliases") or {}

    entries: dict[str, HardwareSpec] = {}
    for key, raw in raw_entries.items():
        name = normalize_name(key)
        if not name:
            raise InputError(where, "an entry has an empty name", fix)
        if name in entries:
            raise InputError(f"{where} {name}", "is defined twice", fix)
        builtin = base.entries.get(name) if base is not None else None
        entries[name] = _parse_entry(name, raw, where=where, origin=origin, builtin=builtin)
    if not entries and base is None:
        raise InputError(where, f"{origin} defines no entries", fix)

    known = set(entries) | (set(base.entries) if base is not None else set())
    aliases = _parse_aliases(raw_aliases, known, where=where, fix=fix)
    return _Catalog(MappingProxyType(entries), MappingProxyType(aliases))


def _parse_entry(
    name: str,
    raw: Any,
    *,
    where: str,
    origin: str,
    builtin: HardwareSpec | None,
) -> HardwareSpec:
    """One entry -> HardwareSpec; over a built-in, only the given fields change."""
    prefix = f"{where} {name}"
    fix = f"fix it in {origin}"
    if not isinstance(raw, dict):
        raise InputError(prefix, f"must be a mapping of fields, not a {type(raw).__name__}", fix)
    fields = {str(k): v for k, v in raw.items() if str(k) != "name"}
    for key in fields:
        if key not in _SPEC_FIELDS:
            near = closest(key, _SPEC_FIELDS, n=1)
            hint = f"did you mean {near[0]}?" if near else "fields: " + ", ".join(_SPEC_FIELDS)
            raise InputError(f"{prefix}.{key}", "unknown field", f"{hint} {fix}")
    if builtin is not None:
        merged = builtin.model_dump(exclude={"name"})
        merged.update(fields)
        if "source" not in fields:
            changed = ", ".join(sorted(fields)) or "nothing"
            merged["source"] = f"{builtin.source} (overridden in {origin}: {changed})"
        fields = merged
    try:
        spec = HardwareSpec.model_validate({**fields, "name": name})
    except ValidationError as exc:
        err = from_validation_error(exc, prefix=prefix)
        # A bad dict key is reported at "<field>.<key>.[key]"; the key alone reads better.
        raise InputError(err.field.replace(".[key]", ""), err.problem, fix) from None
    if not spec.tflops:
        raise InputError(f"{prefix}.tflops", "needs at least one dtype", fix)
    return spec


def _parse_aliases(raw: Any, known: set[str], *, where: str, fix: str) -> dict[str, str]:
    """Alias -> entry name; every target must exist, and an alias may not hide an entry."""
    if not isinstance(raw, dict):
        raise InputError(f"{where} aliases", "must map alias names to entry names", fix)
    aliases: dict[str, str] = {}
    for alias_key, target_key in raw.items():
        alias, target = normalize_name(alias_key), normalize_name(target_key)
        if alias in known:
            raise InputError(f"{where} aliases.{alias}", "is already an entry name", fix)
        if target not in known:
            near = closest(target, known)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise InputError(
                f"{where} aliases.{alias}", f"points at unknown entry {target!r}", hint + fix
            )
        aliases[alias] = target
    return aliases
