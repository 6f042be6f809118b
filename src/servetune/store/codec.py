"""Compact, lossless storage of raw request records (any metric can be recomputed later).

A batch of `RequestRecord`s becomes one blob: columns instead of rows, timestamps as
deltas (per-request times relative to `send_ns`, `send_ns` relative to the previous
record, chunk arrivals as gaps), each integer column in the narrowest dtype that holds
it, then zlib. Columns are derived from `RequestRecord`'s fields, so a field added to the
schema is stored without touching this module (unknown shapes go to a JSON column).

Layout: b"STRC" + version byte + zlib(uint32 header length + JSON header + arrays).
"""

from __future__ import annotations

import itertools
import json
import struct
import types
import typing
import zlib
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from servetune.errors import InputError
from servetune.results.schema import RequestRecord

MAGIC = b"STRC"
VERSION = 1
CODEC = "strc1"  # the name stored beside each blob
_NULL = np.iinfo(np.int64).min
# Per-request instants stored relative to the request's own send time (small numbers).
_RELATIVE = ("scheduled_ns", "first_event_ns", "first_answer_ns", "end_ns")
_NARROW = (np.int8, np.int16, np.int32, np.int64)
# The magnitude an integer field must stay under: instants are stored as differences of
# two of them, which then fit int64 (and never meet the _NULL sentinel).
INT_LIMIT = 2**62


@lru_cache(maxsize=1)
def field_kinds() -> dict[str, str]:
    """Field -> "int" (int or int|None), "ints" (list[int]) or "json" (anything else)."""
    kinds: dict[str, str] = {}
    for name, info in RequestRecord.model_fields.items():
        ann = info.annotation
        args = set(typing.get_args(ann)) if _is_union(ann) else {ann}
        args.discard(type(None))
        if args == {int}:
            kinds[name] = "int"
        elif len(args) == 1 and typing.get_origin(next(iter(args))) is list:
            inner = typing.get_args(next(iter(args)))
            kinds[name] = "ints" if inner == (int,) else "json"
        else:
            kinds[name] = "json"
    return kinds


def _is_union(ann: Any) -> bool:
    return typing.get_origin(ann) in (typing.Union, types.UnionType)


def _row(r: RequestRecord | Mapping[str, Any]) -> Mapping[str, Any]:
    # pydantic keeps field values in __dict__; reading it avoids per-field attribute calls.
    return r if isinstance(r, Mapping) else r.__dict__


def out_of_range(record: RequestRecord | Mapping[str, Any]) -> tuple[str, int] | None:
    """The first integer field of `record` (and its value) that this codec cannot store
    (see INT_LIMIT); None when all fit. Import files are checked with it before a run is
    written."""
    row = _row(record)
    for name, kind in field_kinds().items():
        value = row.get(name)
        if kind == "int" and value is not None:
            values = (value,)
        elif kind == "ints" and value:
            values = (min(value), max(value))
        else:
            continue
        for v in values:
            if not -INT_LIMIT < v < INT_LIMIT:
                return name, v
    return None


def _narrow(a: np.ndarray) -> np.ndarray:
    if a.size == 0:
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for dt in _NARROW:
        info = np.iinfo(dt)
        if info.min < lo and hi <= info.max:  # strict: keep the sentinel distinguishable
            return a.astype(dt)
    return a


def encode_records(records: Sequence[RequestRecord | Mapping[str, Any]]) -> bytes:
    """Records (models or the plain dicts bench workers send) -> one compressed blob."""
    rows = [_row(r) for r in records]
    n = len(rows)
    kinds = field_kinds()
    header: dict[str, Any] = {"n": n, "cols": []}
    parts: list[bytes] = []

    def put(name: str, kind: str, arr: np.ndarray, **extra: Any) -> None:
        a = _narrow(arr)
        header["cols"].append({"name": name, "kind": kind, "dtype": a.dtype.str, **extra})
        parts.append(a.tobytes())

    send = np.array([row.get("send_ns") or 0 for row in rows], dtype=np.int64)
    # send_ns first: the relative columns are decoded against it.
    for name in sorted(kinds, key=lambda k: k != "send_ns"):
        kind = kinds[name]
        # Plain dicts may leave fields out: store the model's default, as validation would.
        dflt = RequestRecord.model_fields[name].get_default(call_default_factory=True)
        vals = [row.get(name, dflt) for row in rows]
        if kind == "int":
            a = np.array([_NULL if v is None else v for v in vals], dtype=np.int64)
            if name in _RELATIVE:
                a = np.where(a == _NULL, _NULL, a - send)
            elif name == "send_ns":
                a = np.diff(a, prepend=np.int64(0))
            put(name, kind, a)
        elif kind == "ints":
            lists = [v or () for v in vals]
            lens = np.fromiter(map(len, lists), dtype=np.int64, count=n)
            total = int(lens.sum())
            flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=total)
            if name == "chunk_ns" and total:
                starts = np.cumsum(lens) - lens
                has = lens > 0
                d = np.diff(flat, prepend=np.int64(0))
                d[starts[has]] = flat[starts[has]] - send[has]
                flat = d
            put(name + "#len", "len", lens)
            put(name, kind, flat, total=total)
        else:
            first = vals[0] if vals else None
            if all(v == first for v in vals):
                header["cols"].append({"name": name, "kind": "const", "value": first})
            else:
                header["cols"].append({"name": name, "kind": "json", "values": vals})
    head = json.dumps(header, separators=(",", ":"), default=_json_default).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(parts)
    return MAGIC + bytes([VERSION]) + zlib.compress(payload, 6)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot store {type(obj).__name__} in a request record")


def decode_rows(blob: bytes) -> list[dict[str, Any]]:
    """A blob -> plain dicts with every stored field (for export and model building)."""
    if blob[:4] != MAGIC:
        raise InputError("store", "a record blob is not in servetune's format (corrupt row?)")
    if blob[4] > VERSION:
        raise InputError(
            "store",
            f"record blob format {blob[4]} is newer than this servetune reads ({VERSION})",
            "upgrade servetune",
        )
    payload = zlib.decompress(blob[5:])
    (hlen,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4 : 4 + hlen])
    n = header["n"]
    pos = 4 + hlen
    cols: dict[str, Any] = {}
    lens: dict[str, np.ndarray] = {}
    send = np.zeros(n, dtype=np.int64)
    for col in header["cols"]:
        name, kind = col["name"], col["kind"]
        if kind == "const":
            cols[name] = [col["value"]] * n
            continue
        if kind == "json":
            cols[name] = col["values"]
            continue
        dt = np.dtype(col["dtype"])
        count = col.get("total", n)
        a = np.frombuffer(payload, dtype=dt, count=count, offset=pos).astype(np.int64)
        pos += count * dt.itemsize
        if kind == "len":
            lens[name[: -len("#len")]] = a
            continue
        if kind == "int":
            if name == "send_ns":
                a = np.cumsum(a)
                send = a
            elif name in _RELATIVE:
                a = np.where(a == _NULL, _NULL, a + send)
            cols[name] = [None if v == _NULL else v for v in a.tolist()]
        else:  # ints
            ln = lens[name]
            if name == "chunk_ns" and count:
                starts = np.cumsum(ln) - ln
                has = ln > 0
                a = a.copy()
                a[starts[has]] += send[has]
                # cumulative sum restarting at each request's first chunk
                c = np.cumsum(a)
                a = c - np.repeat(c[starts[has]] - a[starts[has]], ln[has])
            flat = a.tolist()
            bounds = np.concatenate(([0], np.cumsum(ln))).tolist()
            cols[name] = [flat[bounds[i] : bounds[i + 1]] for i in range(n)]
    names = list(cols)
    return [{k: cols[k][i] for k in names} for i in range(n)]


def decode_records(blob: bytes) -> list[RequestRecord]:
    """A blob -> RequestRecords (built without re-validation: the data is our own)."""
    known = RequestRecord.model_fields
    return [
        RequestRecord.model_construct(**{k: v for k, v in row.items() if k in known})
        for row in decode_rows(blob)
    ]


def records_from_dicts(rows: Iterable[Mapping[str, Any]]) -> list[RequestRecord]:
    """Plain dicts (JSONL logs, imports) -> validated RequestRecords."""
    return [RequestRecord.model_validate(r) for r in rows]
