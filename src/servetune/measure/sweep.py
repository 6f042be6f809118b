"""The one loop over load points (`bench` and `simulate` sweeps): each point is measured
in the session, streamed or saved into the experiment store, written to its result
files, and shown; a point that did not complete (circuit breaker, Ctrl-C) ends the
sweep, and everything measured until then is kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servetune.measure.session import Interrupted, Point, Session, Sinks
from servetune.metrics.table import write_csv
from servetune.outfile import point_file
from servetune.results.files import check_replaceable, check_writable, write_result
from servetune.results.schema import RunResult
from servetune.status import RunStatus
from servetune.store import RunMeta
from servetune.store.db import store_file
from servetune.store.writer import ResultStore


@dataclass(frozen=True)
class ResultFiles:
    """The files a sweep writes: each point's RunResult JSON (`output`, with the JSONL
    of raw records flushed beside it while a server is measured) and per-step trace CSV
    (`trace`, simulator), and one per-request CSV of the whole sweep (`csv`). Generated
    text stays out of the JSON unless `save_text`."""

    output: Path | None = None
    csv: Path | None = None
    trace: Path | None = None
    save_text: bool = False

    def output_for(self, label: str, many: bool) -> Path | None:
        return point_file(self.output, label, many) if self.output else None

    def trace_for(self, label: str, many: bool) -> Path | None:
        return point_file(self.trace, label, many, ".csv") if self.trace else None


@dataclass(frozen=True)
class StoreSettings:
    """The experiment store a sweep records into (docs/store.md). `kind` (bench, sim)
    names the study a sweep gets when none is given; `meta` builds what the command
    knows about every run, once the store is open (it may ask the server)."""

    db: str | None
    kind: str
    study: str | None = None
    tags: tuple[str, ...] = ()
    meta: Callable[[], RunMeta] | None = None


class Live(Protocol):
    """A running point's figures (bench's LiveProgress): called as they change, closed
    when the point ends."""

    def __call__(self, figures: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _quiet(*_: Any) -> None:
    return None


@dataclass
class Hooks:
    """What a command shows while it measures; every hook is optional. `ready` is called
    by the entry points (`run_bench`, `run_simulate`) once their inputs are resolved."""

    ready: Callable[[Session], None] = _quiet  # nothing measured yet
    point: Callable[[Point, RunResult], None] = _quiet  # each point as it ends
    say: Callable[[str], None] = _quiet  # one line about the store
    live: Live | None = None


def sweep(
    session: Session,
    points: Sequence[Point],
    *,
    files: ResultFiles | None = None,
    store: StoreSettings | None = None,
    hooks: Hooks | None = None,
) -> list[RunResult]:
    """Measure `points` in order; returns every point measured, the last one partial
    (status interrupted or circuit_breaker) when it ended the sweep. Runs go into the
    store as they are measured and their files are written as each point ends; on an
    error or Ctrl-C between points the store's open runs are closed as such."""
    files = files or ResultFiles()
    hooks = hooks or Hooks()
    many = len(points) > 1
    check_files(files, [p.label for p in points], store)  # before anything is measured
    writer = _open_store(store, many, files, hooks.say) if store is not None else None
    results: list[RunResult] = []
    written: list[Path] = []
    try:
        for point in points:
            out = files.output_for(point.label, many)
            sinks = Sinks(
                store=writer,
                records=records_file(out) if out else None,
                trace=files.trace_for(point.label, many),
                live=hooks.live,
            )
            try:
                res = session.measure(point, sinks)
            except Interrupted as exc:
                res = exc.result
            finally:
                if hooks.live is not None:
                    hooks.live.close()
            results.append(res)
            if out is not None:
                write_result(res, out, files.save_text)
                written.append(out)
            hooks.point(point, res)
            if res.status != RunStatus.COMPLETED:
                break
        if many and written:  # -o run.json named none of them: say what it became
            hooks.say(f"wrote {len(written)} result files, one per point: " + _names(written))
    finally:
        if files.csv and results:
            write_csv(results, files.csv)
        if writer is not None:
            writer.close(sys.exc_info()[1])  # the error or Ctrl-C under way, if any
    return results


def _names(paths: list[Path]) -> str:
    """`run-conc1.json, run-conc4.json in /tmp/x`: the names, their folder once (none for
    the working folder)."""
    folders = {p.parent for p in paths}
    if len(folders) > 1:
        return ", ".join(str(p) for p in paths)
    folder = folders.pop()
    return ", ".join(p.name for p in paths) + ("" if folder == Path() else f" in {folder}")


def records_file(out: Path) -> Path:
    """The JSONL record log flushed beside a point's result file while it is measured."""
    return out.with_suffix(".records.jsonl")


def check_files(files: ResultFiles, labels: Sequence[str], store: StoreSettings | None) -> None:
    """Refuse, before the first point is measured, any file the sweep would write over
    measured data (`check_replaceable`): the store's database, or an existing file that is
    not an earlier output of the same kind. A sweep's point files are named after their
    labels, so they are checked here, where the labels are known. The default store file
    is guarded under --no-store too: `-o servetune.db` would still replace it."""
    db_file = store_file(store.db if store is not None else None)
    many = len(labels) > 1
    wanted: list[tuple[Path | None, str, str]] = [(files.csv, "--csv", "csv")]
    for label in labels:
        out = files.output_for(label, many)
        wanted += [(out, "--output", "json"), (out and records_file(out), "--output", "jsonl")]
        wanted.append((files.trace_for(label, many), "--trace", "csv"))
    for path, flag, kind in wanted:
        if path is not None:
            check_replaceable(path, db_file, flag, kind)
            check_writable(path, flag)  # a record log's name a folder holds, /proc/x


def _open_store(
    s: StoreSettings, many: bool, files: ResultFiles, say: Callable[[str], None]
) -> ResultStore | None:
    writer = ResultStore.open(
        s.db, kind=s.kind, study=s.study, tags=s.tags, sweep=many, files=bool(files.output),
        say=say,
    )  # fmt: skip
    if writer is not None and s.meta is not None:
        writer.meta = s.meta()
    return writer
