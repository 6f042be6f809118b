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
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from servetune.errors import InputError, closest, from_validation_error
from servetune.metrics.compute import compute_metrics
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
    request_distribution,
    server_summary,
    stability,
)
from servetune.store.models import Blob, RecordChunk, Run, RunBlob, RunTag, Study
from servetune.store.runinfo import RunInfo, run_info
from servetune.store.timestamps import day_end, utc_now, utc_text
from servetune.store.transfer import WARNED, ImportItem, read_import
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
        sid = f"study-{secrets.token_hex(4)}"
        try:
            with s.begin_nested():
                s.add(Study(id=sid, name=name, kind=kind, created_utc=utc_now(), note=note))
        except IntegrityError:  # another writer created it first
            found = s.scalar(select(Study.id).where(Study.name == name))
            if found is None:
                raise
            return found
        return sid

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
        run_id = m.id or f"{'sim' if m.backend == 'sim' else 'run'}-{secrets.token_hex(5)}"
        now = utc_now()
        try:
            with self._session() as s, s.begin():
                if s.get(Run, run_id) is not None:
                    raise InputError("run id", f"{run_id} is already in {self.where}")
                study_id = self._study_id(s, m.study, m.study_kind, None) if m.study else None
                cfg = m.engine_config or {}
                run = Run(
                    id=run_id,
                    study_id=study_id,
                    created_utc=utc_text(m.created_utc) if m.created_utc else now,
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
                s.add(run)
                s.flush()
                for t in sorted(set(m.tags)):
                    s.add(RunTag(run_id=run_id, tag=t))
            self.reap()
        except SQLAlchemyError as exc:
            raise _db_error(self, exc) from exc
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
            small = result.model_dump(mode="json", exclude=_RESULT_BULK)
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
        """Store a finished RunResult in one go (begin + finish). Returns the run id."""
        m = _as_meta(meta)
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
        run_id = self.begin_run(m.model_copy(update=update_))
        self.finish_run(run_id, result)
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
        if s.get(Blob, h) is None:
            try:
                with s.begin_nested():
                    s.add(Blob(hash=h, codec="zjson1", size=len(raw), data=zlib.compress(raw, 6)))
            except IntegrityError:
                pass  # a concurrent writer stored the same content
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
        with self._session() as s:
            return run_info(self._run(s, run_id), datetime.now(timezone.utc))

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
        """Runs oldest first (the last `limit` when given). `model` matches a substring;
        `since`/`until` take ISO dates or date-times (UTC)."""
        q = select(Run)
        if model:
            q = q.where(Run.model.contains(model))
        if engine:
            q = q.where(Run.engine == engine)
        if study:
            q = q.join(Study, Run.study_id == Study.id).where(
                (Study.name == study) | (Study.id == study)
            )
        if tag:
            q = q.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
        if since:
            q = q.where(Run.created_utc >= utc_text(since, "--since"))
        if until:
            q = q.where(Run.created_utc <= day_end(until, "--until"))
        if backend:
            q = q.where(Run.backend == backend)
        if limit:
            q = q.order_by(Run.created_utc.desc(), Run.id.desc()).limit(limit)
        else:
            q = q.order_by(Run.created_utc, Run.id)
        now = datetime.now(timezone.utc)
        with self._session() as s:
            infos = [run_info(r, now) for r in s.scalars(q).unique()]
        if limit:
            infos.reverse()
        if status:
            infos = [i for i in infos if i.status == status]
        return infos

    def resolve(self, refs: Iterable[str]) -> list[str]:
        """Run ids for references: a run id, a unique id prefix, a study name or id,
        `last`, or comma-separated lists of these. Order kept, duplicates dropped."""
        out: list[str] = []
        with self._session() as s:
            for ref in (p.strip() for r in refs for p in r.split(",") if p.strip()):
                out.extend(self._resolve_one(s, ref))
        return list(dict.fromkeys(out))

    def _resolve_one(self, s: Session, ref: str) -> list[str]:
        if s.get(Run, ref) is not None:
            return [ref]
        if ref == "last":
            rid = s.scalar(select(Run.id).order_by(Run.created_utc.desc(), Run.id.desc()))
            if rid:
                return [rid]
        st = s.scalar(select(Study.id).where((Study.name == ref) | (Study.id == ref)))
        if st is not None:
            return list(
                s.scalars(
                    select(Run.id).where(Run.study_id == st).order_by(Run.created_utc, Run.id)
                )
            )
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
        slo = info.part("slo")
        m = records_metrics(
            self.records(info.id),
            info.part("workload") or {},
            SLO.model_validate(slo) if slo else None,
        )
        return m.model_dump(mode="json")

    # -- editing ------------------------------------------------------------------------

    def tag(
        self, run_ids: Sequence[str], add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> int:
        """Add and remove tags. Returns how many runs changed (a run that already had the
        tags to add and none of those to remove is not counted)."""
        add, remove = set(add), set(remove)
        changed = 0
        with self._session() as s, s.begin():
            for rid in run_ids:
                run = self._run(s, rid)
                have = {t.tag for t in run.tags}
                for t in sorted(add - have):
                    run.tags.append(RunTag(run_id=rid, tag=t))
                run.tags = [t for t in run.tags if t.tag not in remove]
                changed += bool(add - have or remove & have)
        return changed

    def conclude(
        self, run_id: str, verdict: str, note: str | None = None, when: str | None = None
    ) -> None:
        """Seed 003 §16 conclusion: keep, drop, or take into the next round. `when` (an
        import) keeps the date it was concluded; otherwise it is now."""
        if verdict not in VERDICTS:
            raise InputError("verdict", f"{verdict!r} is not one of {', '.join(VERDICTS)}")
        with self._session() as s, s.begin():
            run = self._run(s, run_id)
            run.conclusion, run.conclusion_note = verdict, note
            run.concluded_utc = utc_text(when) if when else utc_now()

    def set_quality(self, run_id: str, table: Mapping[str, Any]) -> None:
        """Seed 003 §16 quality results (task accuracy, structured-output success, ...)."""
        with self._session() as s, s.begin():
            run = self._run(s, run_id)
            run.quality = {**(run.quality or {}), **dict(table)}

    def delete(self, run_ids: Sequence[str]) -> int:
        """Delete runs with their records; blobs no other run uses go too."""
        with self._session() as s, s.begin():
            for rid in run_ids:
                self._run(s, rid)
            for model in (RunBlob, RecordChunk, RunTag):
                s.execute(delete(model).where(model.run_id.in_(run_ids)))
            s.execute(delete(Run).where(Run.id.in_(run_ids)))
            s.execute(delete(Blob).where(Blob.hash.not_in(select(RunBlob.hash))))
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
        imported alone nor an empty store behind."""
        out: list[tuple[str, str]] = []
        for item in items:
            rid = item.meta.id or item.result.id
            if self._exists(rid):
                out.append((rid, "skipped: already in the store"))
                continue
            try:
                rid = self.save_result(
                    item.result, item.meta, study=study or item.meta.study, tags=tags
                )
            except ValidationError as exc:
                raise from_validation_error(exc, name) from exc
            if item.status is not None and item.status != item.result.status:
                self._set_status(rid, item.status, item.stop_reason)  # `incomplete`, say
            if item.conclusion:
                self.conclude(rid, item.conclusion, item.conclusion_note, item.concluded_utc)
            if item.quality:
                self.set_quality(rid, item.quality)
            out.append((rid, f"imported{WARNED}{item.warning}" if item.warning else "imported"))
        return out

    def _set_status(self, run_id: str, status: RunStatus, reason: str | None) -> None:
        """An imported run's status and stop reason as its export says (a run that never
        finished stays `incomplete`, not its rebuilt result's `interrupted`)."""
        with self._session() as s, s.begin():
            run = self._run(s, run_id)
            run.status, run.stop_reason = status, reason

    def _exists(self, run_id: str) -> bool:
        with self._session() as s:
            return s.get(Run, run_id) is not None


def records_metrics(
    records: Sequence[RequestRecord], workload: Mapping[str, Any], slo: SLO | None
) -> Metrics:
    """The metrics of a run that never finished, from the records that reached the store,
    with its workload's warm-up, cool-down and streaming and its SLO: the one place they
    are computed, so every reader shows the same figures."""
    return compute_metrics(
        records,
        warmup_s=float(workload.get("warmup_s") or 0.0),
        cooldown_s=float(workload.get("cooldown_s") or 0.0),
        slo=slo if isinstance(slo, SLO) else None,
        stream=bool(workload.get("stream", True)),
    )


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
