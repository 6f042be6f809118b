"""A run on disk: the RunResult JSON (`bench -o run.json`, read back by `runs import`,
`simulate calibrate` and the tests) and the JSONL record log flushed while a run is
measured (what Ctrl-C or a crash keeps). The per-request CSV needs the metric maths, so
it lives with it (`metrics.table`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.outfile import probe_writable, refused_in, replaced
from servetune.results.schema import RunResult
from servetune.yamlfile import read_text


class RecordLog:
    """JSONL of one run's raw records, flushed per batch: what Ctrl-C or a crash keeps.

    The log is started afresh (truncated) when the run starts: it belongs to the run's
    result file beside it, which a new run with the same `-o` replaces too. Appending made
    a second run's header and records follow the first's, a file `runs import` cannot read
    as one run. The sweep refuses, before it measures, a path that holds anything but an
    earlier record log (`check_replaceable`)."""

    def __init__(self, path: Path | None, save_text: bool = False) -> None:
        self.path = path
        # the answers' text only when the run keeps it (--save-text), as its -o file and
        # the store do: the log had held every answer, and `runs import` stored them
        self.save_text = save_text
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("w", encoding="utf-8")

    def header(self, obj: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"run": obj}, default=str) + "\n")
            self._fh.flush()

    def write(self, batch: list[dict[str, Any]]) -> None:
        if self._fh is None:
            return
        for rec in batch:
            if not self.save_text and rec.get("output_text") is not None:
                rec = {**rec, "output_text": None}
            self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def write_result(result: RunResult, path: Path, save_text: bool = False) -> None:
    """The whole run (raw records + metrics) as one JSON file, written atomically."""
    exclude: dict[str, Any] | None = (
        None if save_text else {"records": {"__all__": {"output_text"}}}
    )
    data = result.model_dump_json(exclude=exclude)
    with replaced(path) as tmp:
        tmp.write_text(data)


def check_writable(path: Path, field: str) -> None:
    """Refuse, before anything runs, an output path whose folder does not exist or that
    is a folder itself: a result computed and then lost to a typo costs the whole run."""
    if path.is_dir():
        raise InputError(field, f"{path} is a folder", "give a file name")
    _check_parent(path, field)
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        return  # a pipe or a device: written in place (`outfile.replaced`)
    if not os.access(target.parent, os.W_OK | os.X_OK):  # the file is renamed into it
        raise InputError(field, f"folder {target.parent} is not writable", "give another path")
    probe_writable(path, field)  # what root's access() cannot tell: /proc, read-only mounts


def sqlite_file(store: Any) -> str | None:
    """The SQLite file of a store (a `Store`, or its URL), or None for a server database
    (nothing on disk to overwrite) or an in-memory one."""
    from sqlalchemy.engine import make_url

    url = make_url(store) if isinstance(store, str) else store.engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return url.database


def _is_html(head: bytes) -> bool:
    return head.lower().startswith((b"<!doctype html", b"<html"))


def _is_record_log(head: bytes) -> bool:
    return head.startswith(b'{"run"')


def _is_json(head: bytes) -> bool:
    """JSON (a result, an export), but not a record log: that is a killed run's records."""
    return head[:1] in (b"{", b"[") and not _is_record_log(head)


def _is_csv(head: bytes) -> bool:
    """Text whose first line has a comma: a table's header, not a database, JSON or HTML."""
    line = head.split(b"\n", 1)[0]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in head and "," in text and text[:1] not in ("{", "[", "<")


def _is_parquet(head: bytes) -> bool:
    return head.startswith(b"PAR1")


# What each kind of output file is, and how an earlier one is known by its first bytes:
# an output may replace an earlier file of its own kind (or an empty file), never another.
OUTPUT_KINDS: dict[str, tuple[str, Callable[[bytes], bool]]] = {
    "html": ("an HTML report", _is_html),
    "json": ("a JSON result or export", _is_json),
    "jsonl": ("a bench record log", _is_record_log),
    "csv": ("a CSV table", _is_csv),
    "parquet": ("a Parquet file", _is_parquet),
}
_STORE_FILES = ("", "-wal", "-shm", "-journal")


def _head(path: Path) -> bytes | None:
    """The file's first bytes, byte-order mark and leading blanks dropped; None when it
    cannot be read (then it is not known to be replaceable, so it is kept)."""
    try:
        with path.open("rb") as fh:
            return fh.read(512).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return None


def check_replaceable(
    out: Path, db_file: str | None, flag: str = "--output", kind: str = "html"
) -> None:
    """Refuse an output that would overwrite measured data: the store's own SQLite file
    (`db_file`; its WAL, shared-memory and journal files count as the database), or an
    existing file that is not an earlier output of the same `kind` (`OUTPUT_KINDS`). An
    earlier output of that kind, or an empty file, may be replaced; a pipe or a device is
    written in place. Every command that writes a file the user named checks it here, so
    `report -o`, `runs export -o`, `bench -o/--csv` and `simulate -o/--trace` agree;
    `flag` is the option that gave `out`."""
    what, looks_like = OUTPUT_KINDS[kind]
    target = Path(os.path.realpath(out))
    if db_file:
        db = Path(os.path.realpath(db_file))
        if target in {db.with_name(db.name + s) for s in _STORE_FILES}:
            raise InputError(flag, f"{out} is the store's database", "give another file name")
    if target.is_file() and target.stat().st_size:
        head = _head(target)
        if head is None or not looks_like(head):
            raise InputError(
                flag,
                f"{out} exists and is not {what}",
                "give a new file name, or remove it first",
            )
    suffix = Path(out).suffix
    if kind == "html" and suffix.lower() not in ("", ".html", ".htm"):
        # `report -o r.md` wrote HTML into it, nothing said
        raise InputError(
            flag, f"{out}: the {suffix} name says another format than HTML", "name it .html"
        )


def _check_parent(path: Path, field: str) -> None:
    """The folder `path` goes in exists and is one (a file there read "folder ... does
    not exist")."""
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise InputError(field, f"{parent} is a file, not a folder", "give a path in a folder")
    if not parent.is_dir():
        raise InputError(field, f"folder {parent} does not exist", "create it first")


def check_folder(path: Path, field: str) -> None:
    """The same check for an output folder: an existing file there, or a missing parent
    (a typo would otherwise create folders far from where the user looks), is refused
    before anything runs; the folder itself is made when written."""
    if path.exists() and not path.is_dir():
        raise InputError(field, f"{path} is a file, not a folder", "give a folder name")
    _check_parent(path, field)
    # the folder takes files, or its parent takes the folder: /proc/x passed the checks
    # above, and `calibrate --runs-dir /proc/x` lost the sweep's first measured run
    where = path if path.is_dir() else path.parent
    reason = refused_in(where, f".servetune-probe{os.getpid()}")
    if reason is not None:
        problem = f"cannot {'write in' if where == path else 'create'} folder {path}"
        raise InputError(field, f"{problem} ({reason})", "give a folder you can write")


def check_outputs(files: dict[str, Path | str | None], folders: dict[str, Path | None]) -> None:
    """Every output path a command was given, checked before it measures anything
    (`{flag: path}`; None: not given)."""
    for field, path in files.items():
        if path is not None:
            check_writable(Path(path), field)
    for field, folder in folders.items():
        if folder is not None:
            check_folder(folder, field)


def load_result(path: str | Path, field: str = "FILE") -> RunResult:
    """A result file read back; an unreadable or foreign file is one InputError naming
    `field` (the option that gave the path)."""
    p = Path(path)
    text = read_text(p, field)  # unreadable or binary: one line
    try:
        return RunResult.model_validate_json(text)
    except ValidationError as exc:
        err = from_validation_error(exc)  # where in the file, and what is wrong there
        raise InputError(field, f"{p} is not a RunResult: {err.field}: {err.problem}") from None
