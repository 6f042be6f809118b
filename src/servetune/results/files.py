"""A run on disk: the RunResult JSON (`bench -o run.json`, read back by `runs import`,
`simulate calibrate` and the tests) and the JSONL record log flushed while a run is
measured (what Ctrl-C or a crash keeps). The per-request CSV needs the metric maths, so
it lives with it (`metrics.table`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.outfile import replaced
from servetune.results.schema import RunResult
from servetune.yamlfile import read_text


class RecordLog:
    """Append-only JSONL of raw records, flushed per batch: what Ctrl-C or a crash keeps."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def header(self, obj: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"run": obj}, default=str) + "\n")
            self._fh.flush()

    def write(self, batch: list[dict[str, Any]]) -> None:
        if self._fh is None:
            return
        for rec in batch:
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
    if not path.parent.is_dir():
        raise InputError(field, f"folder {path.parent} does not exist", "create it first")
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        return  # a pipe or a device: written in place (`outfile.replaced`)
    if not os.access(target.parent, os.W_OK | os.X_OK):  # the file is renamed into it
        raise InputError(field, f"folder {target.parent} is not writable", "give another path")


def check_folder(path: Path, field: str) -> None:
    """The same check for an output folder: an existing file there, or a missing parent
    (a typo would otherwise create folders far from where the user looks), is refused
    before anything runs; the folder itself is made when written."""
    if path.exists() and not path.is_dir():
        raise InputError(field, f"{path} is a file, not a folder", "give a folder name")
    if not path.parent.is_dir():
        raise InputError(field, f"folder {path.parent} does not exist", "create it first")


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
