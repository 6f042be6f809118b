"""The experiment store: every bench/simulate/tune run, written as it goes.

Writers (bench, simulate, tune):

    store = Store.open(db)                       # --db URL, $SERVETUNE_DB, ./servetune.db
    run_id = store.begin_run(RunMeta(...))       # row marked "running", writer pid noted
    store.append_records(run_id, batch)          # one committed chunk per call
    store.finish_run(run_id, result)             # final RunResult: status, metrics, ...
    store.save_result(result, meta, study=...)   # all three in one, for finished results

A writer that dies leaves its run "running" with a dead pid (or a stale heartbeat on
another host): readers show it as "incomplete" (`liveness`), and the records appended
so far are there, so its metrics can still be computed. Readers: `list_runs`, `get`, `resolve`,
`records`, `load_result`. Edits: `tag`, `conclude`, `set_quality`, `delete`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from servetune.errors import InputError, closest, from_validation_error
from servetune.results.schema import (
    Load,
    Metrics,
    RequestRecord,
    RunResult,
    ServerSeries,
    TelemetrySeries,
)
from servetune.slo import SLO
from servetune.status import RunStatus
from servetune.store import codec
from servetune.store.db import display_url, open_engine, resolve_url
from servetune.store.liveness import effective_status, writer_token
from servetune.store.meta import (
    VERDICTS,
    RunMeta,
    records_metrics,
    request_distribution,
    server_summary,
    stability,
)
from servetune.store.models import (
    Blob,
    RecordChunk,
    Run,
    RunBlob,
    RunTag,
    Study,
    check_length,
    check_row,
)
from servetune.store.runinfo import RunInfo, run_info
from servetune.store.timestamps import day_end, utc_now, utc_text
from servetune.store.transfer import UNMEASURED, WARNED, ImportItem, read_import
from servetune.telemetry import summarize
from servetune.workload.materialize import Request

CHUNK_RECORDS = 5000  # records per stored chunk when a finished run is compacted
_RESULT_BULK = {"records", "requests", "metrics", "server", "telemetry"}


def _load_columns(load: Load) -> dict[str, Any]:
    return {"load_kind": load.kind, "rate": load.rate, "concurrency": load.concurrency}


def _dump_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, default=str).encode()


class Store:
    """A handle on one database. Each method is its own transaction."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, db: str | None = None, *, create: bool = True) -> Store:
        """Open `db` (URL or path; default `$SERVETUNE_DB` or ./servetune.db). Writers
        pass create=True (the file and schema are made); readers create=False."""
        url = resolve_url(db)
        return cls(open_engine(url, create=create), url)

    @property
    def where(self) -> str:
        return display_url(self.url)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # -- studies ------------------------------------------------------------------------

    def ensure_study(self, name: str, kind: str | None = None, note: str | None = None) -> str:
        """The id of study `name`, created on first use (a sweep or tuning session)."""
        with self._session() as s, s.begin():
            return self._study_id(s, name, kind, note)

    def _study_id(self, s: Session, name: str, kind: str | None, note: str | None) -> str:
        found = s.scalar(select(Study.id).where(Study.name == name))
        if found:
            return found
        check_length("study", name, Study.name)
        check_length("study kind", kind, Study.kind)
        sid = f"study-{secrets.token_hex(4)}"
        row = {"id": sid, "name": name, "kind": kind, "created_utc": utc_now(), "note": note}
        if _insert_new(s, Study, row):
            return sid
        found = s.scalar(select(Study.id).where(Study.name == name))  # another writer's
        if found is None:
            raise InputError("study", f"could not create study {name!r}", "try again")
        return found

    def study_meta(self, name: str) -> dict[str, Any] | None:
        """Study `name`'s free-form meta (a tuner keeps its settings and summary there);
        None when there is no such study."""
        with self._session() as s:
            row = s.scalar(select(Study).where(Study.name == name))
            return None if row is None else dict(row.meta or {})

    def update_study_meta(self, name: str, meta: dict[str, Any], kind: str | None = None) -> None:
        """Merge `meta` into study `name`'s meta (the study is created on first use)."""
        with self._session() as s, s.begin():
            self._study_id(s, name, kind, None)
            row = s.scalar(select(Study).where(Study.name == name))
            row.meta = {**(row.meta or {}), **meta}

    def studies(self) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.execute(
                select(Study, func.count(Run.id))
                .outerjoin(Run, Run.study_id == Study.id)
                .group_by(Study.id)
                .order_by(Study.created_utc)
            ).all()
        return [
            {
                "id": st.id,
                "name": st.name,
                "kind": st.kind,
                "created_utc": st.created_utc,
                "runs": n,
                "note": st.note,
            }
            for st, n in rows
        ]

    # -- writing ------------------------------------------------------------------------

    def begin_run(self, meta: RunMeta | Mapping[str, Any] | None = None) -> str:
        """Record that a run started; returns its id. Marks runs of dead writers
        incomplete on the way (so `runs list` agrees with what readers compute)."""
        m = _as_meta(meta).filled()
        try:
            with self._session() as s, s.begin():
                run_id = self._begin(s, m)
            self.reap()
        except SQLAlchemyError as exc:
            raise _db_error(self, exc) from exc
        return run_id

    def _begin(self, s: Session, m: RunMeta) -> str:
        """begin_run's row (and tags, and the study on first use) in session `s`."""
        run_id = m.id or f"{'sim' if m.backend == 'sim' else 'run'}-{secrets.token_hex(5)}"
        now = utc_now()
        if s.get(Run, run_id) is not None:
            raise InputError("run id", f"{run_id} is already in {self.where}")
        study_id = self._study_id(s, m.study, m.study_kind, None) if m.study else None
        cfg = m.engine_config or {}
        run = Run(
            id=run_id,
            study_id=study_id,
            created_utc=utc_text(m.created_utc) if m.created_utc else now,
            # after every run stored so far, in one statement (see models.Run.seq)
            seq=select(func.coalesce(func.max(Run.seq), 0) + 1).scalar_subquery(),
            updated_utc=now,
            backend=m.backend,
            status=RunStatus.RUNNING,
            writer=writer_token(),
            model=m.model or m.target.model,
            engine=m.engine(),
            engine_version=m.software.get("engine_version"),
            hardware=m.hardware.get("gpu") or m.hardware.get("cpu"),
            gpu_count=m.hardware.get("gpu_count")
            or (_world(cfg) if m.hardware.get("gpu") else None),
            n_records=0,
            meta=m.model_dump(mode="json", exclude={"id", "tags", "study"}),
            result={},
            **_load_columns(m.load),
        )
        check_row(run, _RUN_FIELDS)
        s.add(run)
        s.flush()
        for t in sorted(set(m.tags)):
            s.add(_tag_row(run_id, t))
        return run_id

    def append_records(
        self, run_id: str, records: Sequence[RequestRecord | Mapping[str, Any]]
    ) -> int:
        """Commit one batch of raw records (and a heartbeat). Returns the stored count."""
        if not records:
            self.heartbeat(run_id)
            return 0
        blob = codec.encode_records(records)
        with self._session() as s, s.begin():
            run = self._run(s, run_id)
            seq = s.scalar(
                select(func.coalesce(func.max(RecordChunk.seq), -1)).where(
                    RecordChunk.run_id == run_id
                )
            )
            s.add(
                RecordChunk(
                    run_id=run_id, seq=seq + 1, n=len(records), codec=codec.CODEC, data=blob
                )
            )
            run.n_records += len(records)
            run.updated_utc = utc_now()
            return run.n_records

    def heartbeat(self, run_id: str) -> None:
        with self._session() as s, s.begin():
            s.execute(update(Run).where(Run.id == run_id).values(updated_utc=utc_now()))

    def finish_run(self, run_id: str, result: RunResult) -> None:
        """Store the final result: status, metrics, derived §16 fields. When the result
        carries records they replace the streamed chunks (compacted, with the fields the
        runner filled in at the end); otherwise the streamed chunks stay."""
        with self._session() as s, s.begin():
            self._finish(s, run_id, result)

    def _finish(self, s: Session, run_id: str, result: RunResult) -> None:
        """finish_run in session `s`."""
        run = self._run(s, run_id)
        records = list(result.records)
        if records:
            s.execute(delete(RecordChunk).where(RecordChunk.run_id == run_id))
            for seq, i in enumerate(range(0, len(records), CHUNK_RECORDS)):
                part = records[i : i + CHUNK_RECORDS]
                s.add(
                    RecordChunk(
                        run_id=run_id,
                        seq=seq,
                        n=len(part),
                        codec=codec.CODEC,
                        data=codec.encode_records(part),
                    )
                )
            run.n_records = len(records)
        else:
            records = self._records(s, run_id)
        if result.requests:
            self._put_blob(
                s,
                run_id,
                "requests",
                [r.model_dump(mode="json", exclude_none=True) for r in result.requests],
            )
        if result.server is not None:
            self._put_blob(s, run_id, "server", result.server.model_dump(mode="json"))
        if result.telemetry is not None:
            tel = result.telemetry.model_dump(mode="json")
            self._put_blob(s, run_id, "telemetry", tel)
        unset = UNMEASURED - result.model_fields_set  # never measured: not 0.0
        small = result.model_dump(mode="json", exclude=_RESULT_BULK | unset)
        small["id"] = run_id
        small["server_summary"] = server_summary(result.server, result.telemetry)
        if result.telemetry is not None:
            small["telemetry_summary"] = summarize(result.telemetry)
        run.result = small
        run.status = result.status
        run.stop_reason = result.stop_reason
        run.metrics = result.metrics.model_dump(mode="json")
        run.request_dist = request_distribution(records, result.metrics, result.load)
        run.stability = stability(records, result.metrics, result.cancellation)
        run.updated_utc = utc_now()
        run.model = run.model or result.target.model
        if result.load:
            for k, v in _load_columns(result.load).items():
                setattr(run, k, v)

    def abandon_run(
        self, run_id: str, status: RunStatus = RunStatus.FAILED, reason: str | None = None
    ) -> None:
        """A writer that knows it cannot finish (engine crashed, Ctrl-C before a result)."""
        with self._session() as s, s.begin():
            run = self._run(s, run_id)
            run.status, run.stop_reason, run.updated_utc = status, reason, utc_now()

    def save_result(
        self,
        result: RunResult,
        meta: RunMeta | Mapping[str, Any] | None = None,
        *,
        study: str | None = None,
        tags: Iterable[str] = (),
    ) -> str:
        """Store a finished RunResult in one go (begin + finish, one transaction: a result
        that cannot be stored leaves no run behind). Returns the run id."""
        m = _as_meta(meta)
        try:
            with self._session() as s, s.begin():
                run_id = self._save(s, result, m, study=study, tags=tags)
            self.reap()
        except SQLAlchemyError as exc:
            raise _db_error(self, exc) from exc
        return run_id

    def _save(
        self,
        s: Session,
        result: RunResult,
        m: RunMeta,
        *,
        study: str | None = None,
        tags: Iterable[str] = (),
    ) -> str:
        """save_result in session `s`: the meta completed from the result, begin, finish."""
        update_: dict[str, Any] = {
            "id": m.id or result.id,
            "created_utc": m.created_utc or result.created_utc,
            "backend": result.backend,
            "tags": sorted(set(m.tags) | set(tags)),
            "target": m.target or result.target,
            "workload": m.workload or result.workload,
            "load": m.load or result.load,
            "slo": m.slo or (result.slo.model_dump(mode="json") if result.slo else None),
        }
        if study:
            update_["study"] = study
        run_id = self._begin(s, m.model_copy(update=update_).filled())
        self._finish(s, run_id, result)
        return run_id

    def reap(self) -> int:
        """Persist "incomplete" for running runs whose writer is gone. Returns how many."""
        now = datetime.now(timezone.utc)
        with self._session() as s, s.begin():
            rows = s.execute(
                select(Run.id, Run.writer, Run.updated_utc).where(Run.status == RunStatus.RUNNING)
            ).all()
            running = RunStatus.RUNNING
            dead = [rid for rid, w, u in rows if effective_status(running, w, u, now) != running]
            if dead:
                s.execute(
                    update(Run)
                    .where(Run.id.in_(dead))
                    .values(
                        status=RunStatus.INCOMPLETE,
                        stop_reason="the writer stopped before finishing",
                    )
                )
        return len(dead)

    # -- blobs --------------------------------------------------------------------------

    def _put_blob(self, s: Session, run_id: str, kind: str, obj: Any) -> None:
        raw = _dump_json(obj)
        h = hashlib.sha256(raw).hexdigest()
        if s.get(Blob, h) is None:  # else stored once already; a concurrent writer's is kept
            row = {"hash": h, "codec": "zjson1", "size": len(raw), "data": zlib.compress(raw, 6)}
            _insert_new(s, Blob, row)
        s.merge(RunBlob(run_id=run_id, kind=kind, hash=h))

    def _get_blob(self, s: Session, run_id: str, kind: str) -> Any:
        row = s.execute(
            select(Blob.data)
            .join(RunBlob, RunBlob.hash == Blob.hash)
            .where(RunBlob.run_id == run_id, RunBlob.kind == kind)
        ).scalar_one_or_none()
        return None if row is None else json.loads(zlib.decompress(row))

    # -- reading ------------------------------------------------------------------------

    def _run(self, s: Session, run_id: str) -> Run:
        run = s.get(Run, run_id)
        if run is None:
            raise self._unknown(s, run_id)
        return run

    def _unknown(self, s: Session, ref: str) -> InputError:
        ids = list(s.scalars(select(Run.id).order_by(Run.created_utc.desc()).limit(2000)))
        names = list(s.scalars(select(Study.name)))
        near = closest(ref, ids + names)
        fix = f"did you mean {', '.join(near)}?" if near else "`servetune runs list` shows the ids"
        return InputError("run", f"no run or study {ref!r} in {self.where}", fix)

    def get(self, run_id: str) -> RunInfo:
        """The run as readers see it. A run that never finished (killed, still running)
        has its measured request distribution and stability computed from the records
        that reached the store, as `finish_run` computes them for a finished one (and
        `runs import` for the same run exported), so its record reads the same anywhere."""
        with self._session() as s:
            run = self._run(s, run_id)
            info = run_info(run, datetime.now(timezone.utc))
            if run.metrics is None:
                records = self._records(s, run_id)
                m = self._unfinished_metrics(info, records)
                info.request_dist = request_distribution(records, m, info.load)
                info.stability = stability(records, m)
            return info

    def list_runs(
        self,
        *,
        model: str | None = None,
        engine: str | None = None,
        study: str | None = None,
        tag: str | None = None,
        since: str | None = None,
        until: str | None = None,
        status: str | None = None,
        backend: str | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """Runs oldest first (the last `limit` when given). `model` matches a substring and
        `engine` a name, both in any case; `since`/`until` take ISO dates or date-times
        (UTC), an `until` to the minute or hour taking in all of it (`day_end`). A study
        or engine the store has no run of lists nothing: `require_study` and `engines` let
        a command tell a typo from an empty result."""
        q = select(Run)
        if model:  # the same on every database: no case, and `_`/`%` are plain characters
            q = q.where(Run.model.icontains(model, autoescape=True))
        if engine:  # `vLLM` is vllm: an engine name has no case
            q = q.where(func.lower(Run.engine) == engine.lower())
        if study:
            q = q.join(Study, Run.study_id == Study.id).where(
                (Study.name == study) | (Study.id == study)
            )
        if tag:
            q = q.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
        lo = utc_text(since, "--since") if since else None
        hi = day_end(until, "--until") if until else None
        if lo is not None and hi is not None and lo > hi:  # no run can be in it: a swap
            raise InputError("--until", f"{until} is before --since {since}", "swap the two")
        if lo is not None:
            q = q.where(Run.created_utc >= lo)
        if hi is not None:
            q = q.where(Run.created_utc <= hi)
        if backend:
            q = q.where(Run.backend == backend)
        if status:  # a `running` row whose writer is gone reads `incomplete` (liveness)
            live = (RunStatus.RUNNING, RunStatus.INCOMPLETE)
            q = q.where(Run.status.in_(live if status in live else (status,)))
        newest_in_sql = bool(limit) and not status  # else: the status first, then the last N
        if newest_in_sql:
            q = q.order_by(*(c.desc() for c in _ORDER)).limit(limit)
        else:
            q = q.order_by(*_ORDER)
        now = datetime.now(timezone.utc)
        with self._session() as s:
            infos = [run_info(r, now) for r in s.scalars(q).unique()]
        if newest_in_sql:
            infos.reverse()
        if status:
            infos = [i for i in infos if i.status == status]
            if limit:
                infos = infos[-limit:]
        return infos

    def require_study(self, ref: str, field: str = "--study") -> None:
        """Refuse a study name or id the store does not have, naming the closest ones (as
        an unknown run is refused): a filter on a typo would list nothing and read as a
        study without runs."""
        with self._session() as s:
            if s.scalar(select(Study.id).where((Study.name == ref) | (Study.id == ref))):
                return
            near = closest(ref, s.scalars(select(Study.name)))
        fix = f"did you mean {', '.join(near)}?" if near else "`servetune runs list --studies`"
        raise InputError(field, f"no study {ref!r} in {self.where}", fix)

    def engines(self) -> list[str]:
        """The engine names the store's runs were measured with."""
        with self._session() as s:
            return sorted(e for e in s.scalars(select(Run.engine).distinct()) if e)

    def resolve(self, refs: Iterable[str], *, allow_empty: bool = True) -> list[str]:
        """Run ids for references: a run id, a unique id prefix, a study name or id,
        `last`, or comma-separated lists of these. Order kept, duplicates dropped.
        `allow_empty=False`: a study of no runs is an InputError (a command that edits or
        exports runs would otherwise report success doing nothing)."""
        out: list[str] = []
        with self._session() as s:
            for ref in _split(refs):
                ids = self._resolve_one(s, ref)
                if not ids and not allow_empty:
                    raise InputError(
                        "run",
                        f"study {ref!r} has no runs",
                        "`servetune runs list --studies` counts each study's runs; "
                        f"`servetune runs delete {ref} --yes` removes it",
                    )
                out.extend(ids)
        return list(dict.fromkeys(out))

    def studies_named(self, refs: Iterable[str]) -> list[str]:
        """The names of the studies among `refs` (read as `resolve` reads them)."""
        with self._session() as s:
            found = (self._study_ref(s, ref) for ref in _split(refs))
            return list(dict.fromkeys(st.name for st in found if st is not None))

    def _study_ref(self, s: Session, ref: str) -> Study | None:
        """The study `ref` names, when it names no run first (a run id, `last`)."""
        if s.get(Run, ref) is not None or (ref == "last" and s.scalar(select(Run.id))):
            return None
        return s.scalar(select(Study).where((Study.name == ref) | (Study.id == ref)))

    def _resolve_one(self, s: Session, ref: str) -> list[str]:
        if s.get(Run, ref) is not None:
            return [ref]
        if ref == "last":
            rid = s.scalar(select(Run.id).order_by(*(c.desc() for c in _ORDER)))
            if rid:
                return [rid]
        st = self._study_ref(s, ref)
        if st is not None:
            return list(s.scalars(select(Run.id).where(Run.study_id == st.id).order_by(*_ORDER)))
        if len(ref) >= 4:
            hits = list(s.scalars(select(Run.id).where(Run.id.startswith(ref)).limit(3)))
            if len(hits) == 1:
                return hits
            if len(hits) > 1:
                raise InputError(
                    "run",
                    f"{ref!r} matches several runs ({', '.join(hits)}, ...)",
                    "give more of the id",
                )
        raise self._unknown(s, ref)

    def _records(self, s: Session, run_id: str) -> list[RequestRecord]:
        out: list[RequestRecord] = []
        for data, name in s.execute(
            select(RecordChunk.data, RecordChunk.codec)
            .where(RecordChunk.run_id == run_id)
            .order_by(RecordChunk.seq)
        ):
            if name != codec.CODEC:
                raise InputError(
                    "store", f"run {run_id} uses record codec {name!r}", "upgrade servetune"
                )
            out.extend(codec.decode_records(data))
        return out

    def records(self, run_id: str) -> list[RequestRecord]:
        """The raw per-request records, in the order stored."""
        with self._session() as s:
            self._run(s, run_id)
            return self._records(s, run_id)

    def load_result(self, run_id: str) -> RunResult:
        """The run as a RunResult. For a run that never finished, the result is built from
        what was stored and its metrics computed from the records that reached the store."""
        with self._session() as s:
            run = self._run(s, run_id)
            info = run_info(run, datetime.now(timezone.utc))
            records = self._records(s, run_id)
            requests = self._get_blob(s, run_id, "requests")
            server = self._get_blob(s, run_id, "server")
            telemetry = self._get_blob(s, run_id, "telemetry")
        base = dict(info.result) or {
            "id": run_id,
            "created_utc": info.created_utc,
            "backend": info.backend,
            "workload": info.meta.get("workload") or {},
            "load": info.meta.get("load") or {},
            "slo": info.meta.get("slo"),
            "status": RunStatus.INTERRUPTED,
            "stop_reason": info.stop_reason or f"run {info.status}: no final result stored",
        }
        res = RunResult.model_validate(base)
        res.target = info.target  # with what begin_run was told (tune's tag)
        res.records = records
        res.requests = [Request.model_validate(r) for r in requests or []]
        res.server = ServerSeries.model_validate(server) if server is not None else None
        if telemetry is not None:
            res.telemetry = TelemetrySeries.model_validate(telemetry)
        if info.metrics is not None:
            res.metrics = Metrics.model_validate(info.metrics)
        else:
            res.metrics = records_metrics(records, res.workload, res.slo)
        return res

    def metrics(self, info: RunInfo) -> dict[str, Any]:
        """The run's metrics: the final result's, or for a run that never finished (killed,
        still running) computed from the records that reached the store, as `load_result`
        computes them, so `runs list`, `show`, exports, diagnose and quality agree."""
        if info.metrics is not None:
            return info.metrics
        return self._unfinished_metrics(info, self.records(info.id)).model_dump(mode="json")

    @staticmethod
    def _unfinished_metrics(info: RunInfo, records: Sequence[RequestRecord]) -> Metrics:
        """`records_metrics` with the run's stored workload and SLO."""
        slo = info.part("slo")
        return records_metrics(
            records, info.part("workload") or {}, SLO.model_validate(slo) if slo else None
        )

    # -- editing ------------------------------------------------------------------------

    def tag(
        self, run_ids: Sequence[str], add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> int:
        """Add and remove tags. Returns how many runs changed (a run that already had the
        tags to add and none of those to remove is not counted)."""
        add, remove = set(add), set(remove)
        changed = 0
        try:
            with self._session() as s, s.begin():
                for rid in run_ids:
                    run = self._run(s, rid)
                    have = {t.tag for t in run.tags}
                    for t in sorted(add - have):
                        run.tags.append(_tag_row(rid, t))
                    run.tags = [t for t in run.tags if t.tag not in remove]
                    changed += bool(add - have or remove & have)
        except SQLAlchemyError as exc:
            raise _db_error(self, exc) from exc
        return changed

    def conclude(
        self, run_id: str, verdict: str, note: str | None = None, when: str | None = None
    ) -> None:
        """Seed 003 §16 conclusion: keep, drop, or take into the next round. `when` (an
        import) keeps the date it was concluded; otherwise it is now."""
        if verdict not in VERDICTS:
            raise InputError("verdict", f"{verdict!r} is not one of {', '.join(VERDICTS)}")
        try:
            with self._session() as s, s.begin():
                _set_conclusion(self._run(s, run_id), verdict, note, when)
        except SQLAlchemyError as exc:
            raise _db_error(self, exc) from exc

    def set_quality(self, run_id: str, table: Mapping[str, Any]) -> None:
        """Seed 003 §16 quality results (task accuracy, structured-output success, ...)."""
        with self._session() as s, s.begin():
            run = self._run(s, run_id)
            run.quality = {**(run.quality or {}), **dict(table)}

    def delete(self, run_ids: Sequence[str], *, studies: Iterable[str] = ()) -> int:
        """Delete runs with their records; blobs no other run uses go too. `studies`
        (names or ids: the studies the user named) are deleted with their meta once they
        have no runs left. Returns how many runs were deleted."""
        with self._session() as s, s.begin():
            for rid in run_ids:
                self._run(s, rid)
            for model in (RunBlob, RecordChunk, RunTag):
                s.execute(delete(model).where(model.run_id.in_(run_ids)))
            s.execute(delete(Run).where(Run.id.in_(run_ids)))
            s.execute(delete(Blob).where(Blob.hash.not_in(select(RunBlob.hash))))
            names = list(studies)
            if names:
                used = select(Run.study_id).where(Run.study_id.is_not(None))
                s.execute(
                    delete(Study)
                    .where(Study.name.in_(names) | Study.id.in_(names))
                    .where(Study.id.not_in(used))
                )
        return len(run_ids)

    # -- import -------------------------------------------------------------------------

    def import_file(
        self, path: str | Path, *, study: str | None = None, tags: Iterable[str] = ()
    ) -> list[tuple[str, str]]:
        """Import a RunResult JSON (bench's output), a list of them, a `runs export
        --format json` file, or a bench JSONL record log. Returns (run id, what happened);
        runs already in the store are skipped, never duplicated. A record log's cut-off last
        line (a killed bench) is skipped, with a warning in what happened."""
        return self.import_items(read_import(Path(path)), Path(path).name, study=study, tags=tags)

    def import_items(
        self,
        items: Iterable[ImportItem],
        name: str,
        *,
        study: str | None = None,
        tags: Iterable[str] = (),
    ) -> list[tuple[str, str]]:
        """`import_file` on items already read (`read_import`): `runs import` reads every
        file before it opens the store, so a bad second file neither leaves the first
        imported alone nor an empty store behind. Each run is one transaction (its row,
        records, status, conclusion, quality and its study's record): a run is imported
        whole or not at all. A run the store has but never finished (its writer died, or
        the store failed mid-run) is finished with the file's final result."""
        out: list[tuple[str, str]] = []
        for item in items:
            rid = item.meta.id or item.result.id
            try:
                with self._session() as s, s.begin():
                    out.append((rid, self._import_one(s, item, study, tags)))
            except ValidationError as exc:
                raise from_validation_error(exc, name) from exc
            except (SQLAlchemyError, OverflowError) as exc:
                first = str(getattr(exc, "orig", exc)).splitlines()[0]
                raise InputError(
                    "--db",
                    f"writing run {rid} of {name} to {self.where} failed: {first}",
                    "nothing of that run was written; import the file again once the cause "
                    "is fixed (runs already imported are skipped)",
                ) from exc
        self.reap()
        return out

    def _import_one(
        self, s: Session, item: ImportItem, study: str | None, tags: Iterable[str]
    ) -> str:
        """One run of an import file in session `s`; returns what happened."""
        rid = item.meta.id or item.result.id
        into = study or item.meta.study
        record = item.study_record
        if record is not None and record["name"] == into:  # not carried to another study
            self._merge_study(s, record)
        run = s.get(Run, rid)
        if item.from_log:
            item = _with_plan(item, run)
        what = f"imported{WARNED}{item.warning}" if item.warning else "imported"
        if run is None:
            self._save(s, item.result, item.meta, study=into, tags=tags)
            run = self._run(s, rid)
        else:
            kept = _kept_over(run, item)
            if kept is not None:
                return f"skipped: already in the store{kept}"
            before = f"the store's {run_info(run, datetime.now(timezone.utc)).status} run"
            before += f" ({run.n_records} records)"
            self._finish(s, rid, item.result)
            if study or (run.study_id is None and into):
                run.study_id = self._study_id(s, into, item.meta.study_kind, None)
            have = {t.tag for t in run.tags}
            for t in sorted((set(item.meta.tags) | set(tags)) - have):
                run.tags.append(_tag_row(rid, t))
            what = f"imported: finished {before} with the file's result" + what[len("imported") :]
        if item.status is not None and item.status != item.result.status:
            run.status, run.stop_reason = item.status, item.stop_reason  # `incomplete`, say
        if item.conclusion:
            _set_conclusion(run, item.conclusion, item.conclusion_note, item.concluded_utc)
        if item.quality:
            run.quality = {**(run.quality or {}), **item.quality}
        return what

    def _merge_study(self, s: Session, record: Mapping[str, Any]) -> None:
        """An exported study's own record (kind, note, date, meta: a tuner's settings and
        summary) into the study of that name: a study this import creates gets it all;
        one the store has keeps what it holds and gains only what it lacks."""
        name = record["name"]
        row = s.scalar(select(Study).where(Study.name == name))
        if row is None:
            row = s.get(Study, self._study_id(s, name, record.get("kind"), record.get("note")))
            if record.get("created_utc"):
                row.created_utc = utc_text(record["created_utc"])
        row.kind = row.kind or record.get("kind")
        row.note = row.note or record.get("note")
        row.meta = {**(record.get("meta") or {}), **(row.meta or {})}

    def study_record(self, name: str) -> dict[str, Any] | None:
        """Study `name` as `runs export --format json` writes it (None: no such study)."""
        with self._session() as s:
            row = s.scalar(select(Study).where(Study.name == name))
            if row is None:
                return None
            return {
                "name": row.name,
                "kind": row.kind,
                "note": row.note,
                "created_utc": row.created_utc,
                "meta": dict(row.meta or {}),
            }


# Readers list runs oldest first; runs created in the same second (created_utc keeps
# seconds) in the order they were stored, then by id (concurrent writers may share a seq).
_ORDER = (Run.created_utc, Run.seq, Run.id)

# Where a stored run stands when an import may still finish it: its writer died, the store
# failed mid-run, or it was abandoned before a result.
_UNFINISHED = (RunStatus.RUNNING, RunStatus.INCOMPLETE, RunStatus.FAILED)


def _kept_over(run: Run, item: ImportItem) -> str | None:
    """Why the stored `run` stays as it is rather than be finished with an import file's
    item ("" or a reason; None: finish it with the item). Only a run that never finished
    takes a final result, and never one with fewer records than the store holds (nothing
    measured is lost); an export of the same unfinished run changes nothing."""
    status = run_info(run, datetime.now(timezone.utc)).status
    final = item.status or item.result.status
    if status not in _UNFINISHED or final in (RunStatus.RUNNING, RunStatus.INCOMPLETE):
        return ""
    if run.result and final == status:  # the same final result, stored before
        return ""
    got = len(item.result.records)
    if got and got < run.n_records:
        return f", with more records ({run.n_records}) than the file ({got})"
    return None


def _with_plan(item: ImportItem, run: Run | None) -> ImportItem:
    """A record log's item with its metrics computed with the run's workload (warm-up,
    cool-down, streaming) and SLO: the log header's, else those the store kept for the
    run when it began (a killed bench recovered into its own store). Without either, the
    metrics count every request and judge no SLO, and the run's stop reason says so."""
    res = item.result
    stored = (run.meta or {}) if run is not None else {}
    workload = res.workload or stored.get("workload") or {}
    slo = res.slo or (SLO.model_validate(stored["slo"]) if stored.get("slo") else None)
    update: dict[str, Any] = {"workload": workload, "slo": slo}
    update["metrics"] = records_metrics(res.records, workload, slo)
    if not workload:
        update["stop_reason"] = f"{res.stop_reason}; {_NO_PLAN}"
    return replace(item, result=res.model_copy(update=update))


# A record log imported without its workload or SLO (neither in its header nor the store).
_NO_PLAN = "no workload or SLO recorded: no warm-up left out, no SLO judged"


def _insert_new(s: Session, model: type[Study] | type[Blob], row: dict[str, Any]) -> bool:
    """Insert `row` unless a row with the same key or name exists (a concurrent writer's),
    in the session's own transaction; returns whether it was inserted. This replaces a
    SAVEPOINT (`begin_nested`) around a plain insert: pysqlite starts no transaction
    before a SAVEPOINT, so its RELEASE committed the row for good, and a study made by a
    run that then failed outlived the rollback."""
    dialect = s.get_bind().dialect.name
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:  # another database: its savepoints are real ones
        try:
            with s.begin_nested():
                s.add(model(**row))
        except IntegrityError:
            return False
        return True
    done = s.execute(insert(model).values(**row).on_conflict_do_nothing())
    return bool(done.rowcount)  # type: ignore[attr-defined]


# What the user calls the run's text columns, in a `check_row` refusal.
_RUN_FIELDS = {"id": "run id", "engine_version": "engine version", "load_kind": "load kind"}


def _tag_row(run_id: str, tag: str) -> RunTag:
    """A tag of a run, refused in one line when longer than the store keeps."""
    check_length("tag", tag, RunTag.tag)
    return RunTag(run_id=run_id, tag=tag)


def _split(refs: Iterable[str]) -> Iterator[str]:
    """References as given: comma-separated lists split, blanks dropped."""
    return (p.strip() for r in refs for p in r.split(",") if p.strip())


def _set_conclusion(run: Run, verdict: str, note: str | None, when: str | None) -> None:
    run.conclusion, run.conclusion_note = verdict, note
    run.concluded_utc = utc_text(when) if when else utc_now()


def _world(cfg: Mapping[str, Any]) -> int:
    """GPUs a stored config occupies when the host did not say: TP x PP x DP, as
    `tune.objective.gpus_of` counts an EngineConfig (DP was left out: a DP=2 run read 1)."""
    return (
        int(cfg.get("tensor_parallel_size") or 1)
        * int(cfg.get("pipeline_parallel_size") or 1)
        * int(cfg.get("data_parallel_size") or 1)
    )


def _as_meta(meta: RunMeta | Mapping[str, Any] | None) -> RunMeta:
    if meta is None:
        return RunMeta()
    if isinstance(meta, RunMeta):
        return meta
    try:
        return RunMeta.model_validate(dict(meta))
    except ValidationError as exc:
        raise from_validation_error(exc, "run meta") from exc


def _db_error(store: Store, exc: SQLAlchemyError) -> InputError:
    first = str(getattr(exc, "orig", exc)).splitlines()[0]
    return InputError("--db", f"writing to {store.where} failed: {first}")
