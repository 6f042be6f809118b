"""The experiment store as bench and simulate write to it while they measure: a run's
records stream in beside the result files, and a store failure never stops the
measurement (docs/store.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

from servetune.errors import InputError
from servetune.results.schema import RunResult
from servetune.status import RunStatus
from servetune.store.meta import RunMeta
from servetune.store.store import Store

# How the one line about a store that stopped storing starts (commands look for it).
STORE_OFF = "warning: experiment store off"


class ResultStore:
    """The experiment store as bench and simulate write to it (docs/store.md).

    Storing comes second to measuring and to the result files: the first store failure
    (unreachable database, full disk, even a bug) is reported in one line and turns the
    store off for the rest of the command, while the run and its files carry on.
    `meta` is what the command knows about every run (engine, hardware, ...); each run
    adds its own id, load and workload."""

    def __init__(
        self,
        store: Store,
        *,
        study: str | None,
        study_kind: str | None,
        tags: Iterable[str],
        files: bool,
        say: Callable[[str], None],
    ) -> None:
        self.store: Store | None = store
        self.where = store.where
        self.meta = RunMeta()
        self.study, self.study_kind, self.tags = study, study_kind, sorted(set(tags))
        self.files, self.say = files, say
        self.saved: list[str] = []
        self._open: list[StoreLog] = []

    @classmethod
    def open(
        cls,
        db: str | None,
        *,
        kind: str,
        study: str | None = None,
        tags: Iterable[str] = (),
        sweep: bool = False,
        files: bool = False,
        say: Callable[[str], None],
    ) -> ResultStore | None:
        """The store for one bench/simulate command, or None (said in one line) when it
        cannot be opened. A sweep without --study gets a study of its own."""
        try:
            store = Store.open(db)
        except Exception as exc:  # noqa: BLE001 - any store failure: say it, keep measuring
            say(_store_off(exc, files))
            return None
        if study is None and sweep:
            study = f"{kind}-sweep-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
        kind_ = "sweep" if sweep else None
        return cls(store, study=study, study_kind=kind_, tags=tags, files=files, say=say)

    def run_meta(self, **fields: Any) -> RunMeta:
        """The command's meta with this run's fields and the study/tags."""
        update = {"study": self.study, "study_kind": self.study_kind, "tags": self.tags}
        return self.meta.model_copy(update={**update, **fields})

    def fail(self, exc: BaseException) -> None:
        """Report the first failure, then store nothing more (result files continue)."""
        if self.store is not None:
            self.store = None
            self.say(_store_off(exc, self.files))

    def begin(self, run_id: str, *, keep_text: bool = False, **fields: Any) -> StoreLog | None:
        """Start a run that streams its records in as they are measured (bench)."""
        if self.store is None:
            return None
        try:
            self.store.begin_run(self.run_meta(id=run_id, **fields))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return None
        log = StoreLog(self, run_id, keep_text=keep_text)
        self._open.append(log)
        return log

    def save(self, result: RunResult, **fields: Any) -> str | None:
        """Store a finished result in one go (simulate)."""
        if self.store is None:
            return None
        try:
            run_id = self.store.save_result(result, self.run_meta(**fields))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return None
        self.saved.append(run_id)
        return run_id

    def close(self, exc: BaseException | None = None) -> None:
        """End the command: runs still open (an error or Ctrl-C outside a measured point)
        keep what was streamed and are marked interrupted/failed; then say where the
        runs went."""
        for log in list(self._open):
            stopped = isinstance(exc, KeyboardInterrupt)
            status = RunStatus.INTERRUPTED if stopped else RunStatus.FAILED
            log.finish(None, status=status, reason=_first_line(exc) if exc else None)
        if self.store is not None:
            self.store.close()
            if self.saved:
                what = f"{len(self.saved)} runs" if len(self.saved) > 1 else self.saved[0]
                study = f", study {self.study}" if self.study else ""
                self.say(f"stored {what} in {self.where}{study} (servetune runs list)")


class StoreLog:
    """One run's records streamed into the store beside the JSONL log. `write` only
    queues: the collector runs on the measuring event loop and a commit takes
    milliseconds. A thread commits a chunk every `batch` records or `every_s` seconds
    (a crash loses at most that), then the final result; `finish` waits at most `wait_s`
    for it, so a hung database cannot hold back the result files."""

    def __init__(
        self,
        owner: ResultStore,
        run_id: str,
        *,
        keep_text: bool = False,
        batch: int = 100,
        every_s: float = 1.0,
        wait_s: float = 60.0,
    ) -> None:
        self.owner, self.run_id, self.keep_text = owner, run_id, keep_text
        self.batch, self.every_s, self.wait_s = batch, every_s, wait_s
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._end: tuple[RunResult | None, str, str | None] | None = None
        self._thread = threading.Thread(target=self._loop, name="servetune-store", daemon=True)
        self._thread.start()

    def write(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            self._pending.extend(batch)
            due = len(self._pending) >= self.batch
        if due:
            self._wake.set()

    def finish(
        self,
        result: RunResult | None,
        *,
        status: RunStatus = RunStatus.FAILED,
        reason: str | None = None,
    ) -> None:
        """Commit what is queued, then the final result (None: mark the run `status`)."""
        if self in self.owner._open:
            self.owner._open.remove(self)
        self._end = (result, status, reason)
        self._closing = True
        self._wake.set()
        self._thread.join(self.wait_s)
        if self._thread.is_alive():
            self.owner.fail(TimeoutError(f"no answer within {self.wait_s:g} s"))

    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.every_s)
            self._wake.clear()
            self._flush()
        self._flush()
        store = self.owner.store
        if store is None or self._end is None:
            return
        result, status, reason = self._end
        try:
            if result is None:
                store.abandon_run(self.run_id, status, reason)
            else:
                store.finish_run(self.run_id, result if self.keep_text else _without_text(result))
                self.owner.saved.append(self.run_id)
        except Exception as exc:  # noqa: BLE001
            self.owner.fail(exc)

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        store = self.owner.store
        if not batch or store is None:
            return
        if not self.keep_text:
            batch = [{k: v for k, v in d.items() if k != "output_text"} for d in batch]
        try:
            store.append_records(self.run_id, batch)
        except Exception as exc:  # noqa: BLE001
            self.owner.fail(exc)


def _without_text(result: RunResult) -> RunResult:
    """The result without generated text (kept only with --save-text, as in -o files)."""
    if not any(r.output_text is not None for r in result.records):
        return result
    records = [r.model_copy(update={"output_text": None}) for r in result.records]
    return result.model_copy(update={"records": records})


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, InputError):
        return exc.one_line()
    orig = getattr(exc, "orig", None) or exc
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    return f"{type(orig).__name__}: {lines[0]}" if lines else type(orig).__name__


def _store_off(exc: BaseException, files: bool) -> str:
    kept = (
        "the result files are still written (`servetune runs import FILE` adds them later)"
        if files
        else "nothing is recorded (pass -o FILE to keep results)"
    )
    return f"{STORE_OFF}: {_first_line(exc)}; {kept}"
