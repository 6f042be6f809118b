"""Files in and out of the store: `runs import` (bench's RunResult JSON, lists of them,
bench's JSONL record log, `runs export --format json`) and `runs export` (csv, json,
parquet). Reading and shaping only; the Store does the writing."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.metrics.table import csv_row
from servetune.outfile import replaced
from servetune.results.schema import SCHEMA_VERSION as RESULT_SCHEMA
from servetune.results.schema import RequestRecord, RunResult
from servetune.slo import SLO
from servetune.status import RunStatus
from servetune.store.codec import out_of_range
from servetune.store.meta import VERDICTS, RunMeta, records_metrics
from servetune.store.models import Run, RunTag, Study, check_length
from servetune.store.runinfo import RunInfo
from servetune.store.timestamps import utc_now, utc_text
from servetune.yamlfile import read_text

if TYPE_CHECKING:  # the Store imports this module to read import files
    from servetune.store.store import Store

EXPORT_FORMAT = 1
FORMATS = ("csv", "json", "parquet")
# A distribution's columns in a summary row: its sample size first (a P99 of 14 requests
# is no P99 of 14,000).
_DIST_STATS = ("count", "mean", "p50", "p90", "p95", "p99", "max")
# RunResult fields whose default (0.0) would read as a measurement: a result that never
# set them (a run that never finished, rebuilt from its records) is stored and exported
# without them.
UNMEASURED = frozenset({"started_unix_s", "duration_s"})


@dataclass
class ImportItem:
    result: RunResult
    meta: RunMeta
    conclusion: str | None = None
    conclusion_note: str | None = None
    quality: dict[str, Any] | None = None
    warning: str | None = None  # what was left out, said beside "imported" after WARNED
    status: RunStatus | None = None  # an export's run status (`incomplete` is no result's)
    stop_reason: str | None = None  # ... and why it stopped, as the run's row said it
    concluded_utc: str | None = None
    # the export's record of the run's study (name, kind, note, created_utc, meta)
    study_record: dict[str, Any] | None = None
    # a bench record log: no final result, its metrics computed from its records with the
    # workload and SLO its header gives (the store's own, for a run it already has)
    from_log: bool = False


# Joins a warning to what `Store.import_file` says happened (`imported; warning: ...`): the
# CLI splits on it to send the warning where warnings go.
WARNED = "; warning: "


M = TypeVar("M", bound=BaseModel)


def _validate(model: type[M], obj: Any, where: str) -> M:
    """`model.model_validate(obj)`, its failure one InputError under `where`."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise from_validation_error(exc, where) from exc


def read_import(path: Path) -> Iterator[ImportItem]:
    """Parse an import file into results with their metadata (validated first: a bad
    file raises before anything is written)."""
    if path.is_dir():
        raise InputError("FILE", f"{path} is a folder", "give a result, record log or export file")
    if not path.is_file():
        raise InputError("FILE", f"no such file: {path}")
    text = read_text(path, "FILE")  # unreadable or binary: one line
    first = text.lstrip()[:1]
    if first not in ("{", "["):
        raise InputError("FILE", f"{path.name} is not JSON or JSONL", "give a bench result file")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        items = [_from_jsonl(path, text)]
    else:
        items = [_from_jsonl(path, text)] if _is_log_header(obj) else list(_from_json(path, obj))
    return iter(_not_this_host(item) for item in items)


def _is_log_header(obj: Any) -> bool:
    """A record log with its header line only (a bench killed before its first record)
    parses as one JSON object: `{"run": {"id": ...}}`."""
    return isinstance(obj, dict) and set(obj) == {"run"} and isinstance(obj["run"], dict)


# The versions RunMeta.filled stamps from this host: a file that does not record them
# leaves them unknown, never the importing host's.
_UNKNOWN_SOFTWARE: dict[str, Any] = {"servetune": None, "servetune_build": None, "python": None}


def _not_this_host(item: ImportItem) -> ImportItem:
    """The item with the software versions its file lacks marked unknown."""
    software = _UNKNOWN_SOFTWARE | item.meta.software
    item.meta = item.meta.model_copy(update={"software": software})
    return item


def _kind(value: Any) -> str:
    """What a JSON value is, for an error: `a string`, `null`."""
    kinds = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    kinds |= {list: "a list", dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


_FIX = "give a file `servetune runs export --format json` wrote"


def _from_export(name: str, doc: dict[str, Any]) -> Iterator[ImportItem]:
    """A `runs export --format json` file; each part checked before it is used, so a
    hand-edited or foreign file is one line naming the part, never a traceback."""
    version = doc["servetune_export"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise InputError(
            f"{name}.servetune_export", f"is {_kind(version)}, not a format number", _FIX
        )
    if version > EXPORT_FORMAT:
        raise InputError(
            f"{name}.servetune_export",
            f"is {version}: written by a newer servetune (this one reads format {EXPORT_FORMAT})",
            "upgrade servetune",
        )
    if version < 1:
        raise InputError(
            f"{name}.servetune_export", f"is {version}, not a format number (1 or more)", _FIX
        )
    if "runs" not in doc:
        raise InputError(f"{name}.runs", "is missing", _FIX)
    runs = doc["runs"]
    if not isinstance(runs, list):
        raise InputError(f"{name}.runs", f"is {_kind(runs)}, not a list of runs", _FIX)
    studies = _export_studies(name, doc.get("studies"))
    for i, run in enumerate(runs):
        where = f"{name}.runs[{i}]"
        if not isinstance(run, dict):
            raise InputError(where, f"is {_kind(run)}, not a run", _FIX)
        if "result" not in run:
            raise InputError(f"{where}.result", "is missing", _FIX)
        conclusion, quality = run.get("conclusion"), run.get("quality")
        if conclusion is not None and conclusion not in VERDICTS:
            raise InputError(
                f"{where}.conclusion", f"{conclusion!r} is not one of {', '.join(VERDICTS)}"
            )
        if quality is not None and not isinstance(quality, dict):
            raise InputError(f"{where}.quality", f"is {_kind(quality)}, not an object", _FIX)
        concluded = run.get("concluded_utc")
        when = None if concluded is None else utc_text(concluded, f"{where}.concluded_utc")
        result = _checked(_validate(RunResult, run["result"], f"{where}.result"), f"{where}.result")
        meta = _validate(RunMeta, run.get("meta") or {}, f"{where}.meta")
        _date(meta.created_utc, f"{where}.meta.created_utc")
        if any(not t.strip() for t in meta.tags):
            raise InputError(
                f"{where}.meta.tags", f"has a blank tag ({meta.tags!r})", "remove it or name it"
            )
        _storable(meta, f"{where}.meta")
        yield ImportItem(
            result,
            meta,
            conclusion,
            _text(run.get("conclusion_note"), f"{where}.conclusion_note"),
            quality,
            status=_export_status(run.get("status"), f"{where}.status"),
            # older exports have no stop_reason beside the result's
            stop_reason=_text(run.get("stop_reason", result.stop_reason), f"{where}.stop_reason"),
            concluded_utc=when,
            study_record=studies.get(meta.study) if meta.study else None,
        )


def _storable(meta: RunMeta, where: str) -> None:
    """An export's names the store could not keep (a tag over 100 characters, a study
    over 200, a model over 300), refused while the file is read, before any run is
    written, as the store refuses them on every database."""
    check_length(f"{where}.study", meta.study, Study.name)
    check_length(f"{where}.model", meta.model, Run.model)
    for i, tag in enumerate(meta.tags):
        check_length(f"{where}.tags[{i}]", tag, RunTag.tag)


def _export_studies(name: str, value: Any) -> dict[str, dict[str, Any]]:
    """An export's `studies` (absent in exports written before they were kept), by name."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InputError(f"{name}.studies", f"is {_kind(value)}, not a list of studies", _FIX)
    out: dict[str, dict[str, Any]] = {}
    for i, st in enumerate(value):
        where = f"{name}.studies[{i}]"
        if not isinstance(st, dict):
            raise InputError(where, f"is {_kind(st)}, not a study", _FIX)
        study = st.get("name")
        if not isinstance(study, str) or not study.strip():
            raise InputError(f"{where}.name", f"is {_kind(study)}, not a study name", _FIX)
        meta = st.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise InputError(f"{where}.meta", f"is {_kind(meta)}, not an object", _FIX)
        created = st.get("created_utc")
        out[study] = {
            "name": study,
            "kind": _text(st.get("kind"), f"{where}.kind"),
            "note": _text(st.get("note"), f"{where}.note"),
            "created_utc": None if created is None else utc_text(created, f"{where}.created_utc"),
            "meta": meta or {},
        }
    return out


def _text(value: Any, where: str) -> str | None:
    """A text field of an import file (None when absent)."""
    if value is not None and not isinstance(value, str):
        raise InputError(where, f"is {_kind(value)}, not text", _FIX)
    return value


def _date(value: Any, where: str) -> None:
    """A date of an import file is checked here, not when its run is half written."""
    if value is not None:
        utc_text(value, where)


def _checked(result: RunResult, where: str) -> RunResult:
    """A result the store can keep: from no newer servetune, with a real date, and every
    record's integers within what the codec holds."""
    if result.schema_version > RESULT_SCHEMA:
        raise InputError(
            f"{where}.schema_version",
            f"is {result.schema_version}: written by a newer servetune (this one reads up to "
            f"{RESULT_SCHEMA})",
            "upgrade servetune",
        )
    _date(result.created_utc, f"{where}.created_utc")
    for i, record in enumerate(result.records):
        _fits(record, f"{where}.records[{i}]")
    return result


def _fits(record: RequestRecord, where: str) -> None:
    bad = out_of_range(record)
    if bad is not None:
        field, value = bad
        raise InputError(
            f"{where}.{field}",
            f"is {value}, beyond what the store keeps (magnitude under 2**62)",
            "correct or drop that record (instants are nanoseconds)",
        )


def _export_status(value: Any, where: str) -> RunStatus | None:
    """An exported run's status (None: an older export without one, the result's holds)."""
    if value is None:
        return None
    allowed = [s.value for s in RunStatus]
    if value not in allowed:
        raise InputError(where, f"{value!r} is not one of {', '.join(allowed)}")
    return RunStatus(value)


def _from_json(path: Path, obj: Any) -> Iterator[ImportItem]:
    name = path.name
    if isinstance(obj, dict) and "servetune_export" in obj:
        yield from _from_export(name, obj)
        return
    runs = obj if isinstance(obj, list) else [obj]
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or "id" not in run or "records" not in run:
            raise InputError("FILE", f"{name}: entry {i} is not a servetune run result")
        result = _checked(_validate(RunResult, run, name), f"{name}[{i}]" if obj is runs else name)
        yield ImportItem(result, _result_meta(result))


def _result_meta(result: RunResult) -> RunMeta:
    """The §16 fields a RunResult file records in its target: the engine, its knobs (the
    non-default ones: `{}` is the defaults) and the device."""
    t = result.target
    cfg = None if t.config is None else {**t.config, **({"engine": t.engine} if t.engine else {})}
    return RunMeta(
        backend=result.backend,
        model=t.model,
        engine_config=cfg,
        hardware=_hardware(t.hardware, result.backend),
        software={"engine": t.engine} if t.engine else {},
        load=result.load,
    )


def _hardware(name: str | None, backend: str) -> dict[str, Any]:
    """A device name as the §16 hardware record: a catalog entry under its display name
    (a CPU host as the CPU), any other name as given."""
    from servetune.hardware.catalog import get_hardware, hardware_names, normalize_name

    if not name:
        return {}
    if normalize_name(name) not in hardware_names():  # never `local`: that is this host
        return {"gpu": name}
    hw = get_hardware(name)
    out = {"cpu" if hw.kind == "cpu" else "gpu": hw.display_name, "catalog": hw.name}
    return out | ({"simulated": True} if backend == "sim" else {})


def _jsonl_rows(name: str, text: str) -> tuple[list[tuple[int, Any]], int | None]:
    """The parsed lines of a JSONL file with their line numbers (blank lines skipped), and
    the number of a last line that is cut off (None: none is). A bench killed mid-write
    leaves its last record half-written: the records before it were measured and are
    kept. A bad line anywhere else is an error naming it."""
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    rows: list[tuple[int, Any]] = []
    for n, line in lines:
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            if rows and n == lines[-1][0]:
                return rows, n
            fix = (
                f"only the last line may be cut off, as a killed bench leaves it: "
                f"repair or delete line {n}"
                if rows
                else "give a bench result file or record log"
            )
            problem = f"{name}: line {n} is not JSON ({exc.msg}, column {exc.colno})"
            raise InputError("FILE", problem, fix) from None
    return rows, None


def _from_jsonl(path: Path, text: str) -> ImportItem:
    """bench's record log: a {"run": {...}} header, then one raw record per line. It has
    no final result, so metrics are computed here and the run is marked interrupted."""
    rows, cut = _jsonl_rows(path.name, text)
    head = rows[0][1].get("run") if rows and isinstance(rows[0][1], dict) else None
    if not isinstance(head, dict) or not isinstance(head.get("id"), str):
        raise InputError("FILE", f"{path.name} is not a bench record log (no run header)")
    records = []
    for n, row in rows[1:]:
        _one_run(path.name, n, row)
        records.append(_validate(RequestRecord, row, f"{path.name}:{n}"))
        _fits(records[-1], f"{path.name}:{n}")
    where = f"{path.name}:{rows[0][0]}.run"
    _date(head.get("created_utc"), f"{where}.created_utc")
    workload, slo = _header_plan(head, where)
    records.sort(key=lambda r: (r.send_ns, r.index))
    stop = f"imported from the record log {path.name} (no final result)"
    warning = None
    if cut is not None:
        warning = (
            f"the last line ({cut}) of {path.name} was cut off (a killed bench "
            f"leaves one) and skipped: {len(records)} records imported"
        )
        stop += f"; its cut-off last line {cut} skipped"
    run = {
        "id": head["id"],
        "created_utc": str(head.get("created_utc") or _created_from_id(head["id"])),
        "target": {"url": head["url"]} if head.get("url") else {},
        "load": head.get("load") or {},
        "workload": workload,
        "slo": slo,
        "status": RunStatus.INTERRUPTED,
        "stop_reason": stop,
        "records": records,
        "metrics": records_metrics(records, workload, slo),
    }
    result = _validate(RunResult, run, where)  # the header's values
    return ImportItem(result, RunMeta(load=result.load), warning=warning, from_log=True)


def _one_run(name: str, n: int, row: Any) -> None:
    """A record log holds one run. A second `{"run": ...}` header is a second bench that
    appended to the same log (bench appended until it started each log afresh): named,
    with the fix, rather than read as a bad record."""
    if _is_log_header(row):
        raise InputError(
            f"{name}:{n}",
            "is a second run header: the log holds two bench runs, one appended to the other",
            f"split the file before line {n} and import each part",
        )


def _header_plan(head: dict[str, Any], where: str) -> tuple[dict[str, Any], SLO | None]:
    """The workload (warm-up, cool-down, streaming) and SLO a record log's header gives,
    so its metrics are computed as the run's own were; ({}, None) for a header without
    them (a run the store holds has them there: `Store._import_one` recomputes)."""
    workload = head.get("workload") or {}
    if not isinstance(workload, dict):
        raise InputError(f"{where}.workload", f"is {_kind(workload)}, not an object", _LOG_FIX)
    slo = head.get("slo")
    return workload, None if slo is None else _validate(SLO, slo, f"{where}.slo")


_LOG_FIX = "give the record log bench wrote beside its -o file"


def _created_from_id(run_id: str) -> str:
    """bench ids carry their UTC start: bench-20260101T120000-abcdef."""
    for part in run_id.split("-"):
        try:
            return datetime.strptime(part, "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc).isoformat()
        except ValueError:
            continue
    return datetime.now(timezone.utc).isoformat()


# -- export ---------------------------------------------------------------------------


def summary_row(info: RunInfo, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """One flat row per run: identity, load, every metric (`metrics`: `Store.metrics`, so a
    run that never finished has its figures from its records), every engine knob."""
    row: dict[str, Any] = {
        "run_id": info.id,
        "study": info.study,
        "created_utc": info.created_utc,
        "backend": info.backend,
        "status": info.status,
        "model": info.model,
        "engine": info.engine,
        "engine_version": info.engine_version,
        "hardware": info.hardware,
        "gpu_count": info.gpu_count,
        "load_kind": info.load_kind,
        "rate": info.rate,
        "concurrency": info.concurrency,
        "n_records": info.n_records,
        "conclusion": info.conclusion,
        "conclusion_note": info.conclusion_note,
        "tags": ",".join(info.tags),
    }
    for k, v in (metrics if metrics is not None else info.metrics or {}).items():
        if isinstance(v, dict) and "p50" in v:
            row.update({f"{k}_{s}": v.get(s) for s in _DIST_STATS})
        elif isinstance(v, (int, float, bool)) or v is None:
            row[k] = v
    for k, v in info.engine_config.items():
        row[f"cfg.{k}"] = _scalar(v)
    return row


def _scalar(v: Any) -> Any:
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v)
    return v


def record_rows(store: Store, run_ids: Sequence[str]) -> Iterator[dict[str, Any]]:
    """One row per request, with the per-request latencies (bench's CSV columns)."""
    for rid in run_ids:
        for r in store.records(rid):
            yield {"run_id": rid, **csv_row(r)}


def export_json(store: Store, run_ids: Sequence[str], path: Path) -> None:
    """A file `runs import` reads back into any store (SQLite -> team PostgreSQL)."""
    runs = []
    studies: dict[str, Any] = {}
    for rid in run_ids:
        info = store.get(rid)
        meta = {**info.meta, "id": rid, "study": info.study, "tags": info.tags}
        if info.study and info.study not in studies:
            studies[info.study] = store.study_record(info.study)
        res = store.load_result(rid)
        unset = UNMEASURED - res.model_fields_set  # a run that never finished: not 0.0
        runs.append(
            {
                "meta": meta,
                "result": json.loads(res.model_dump_json(exclude=unset)),
                "status": info.status,
                "stop_reason": info.stop_reason,
                "conclusion": info.conclusion,
                "conclusion_note": info.conclusion_note,
                "concluded_utc": info.concluded_utc,
                "quality": info.quality,
            }
        )
    doc = {
        "servetune_export": EXPORT_FORMAT,
        "exported_utc": utc_now(),
        "studies": [st for st in studies.values() if st is not None],  # their own record
        "runs": runs,
    }
    with replaced(path) as tmp:
        tmp.write_bytes(json.dumps(doc, separators=(",", ":")).encode())


def export_table(rows: list[dict[str, Any]], path: Path, fmt: str) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        with replaced(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        return
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InputError(
            "--format", "parquet needs pyarrow", "pip install 'servetune[parquet]'"
        ) from exc
    table = pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows])
    with replaced(path) as tmp:
        pq.write_table(table, tmp)


def export(
    store: Store, run_ids: Sequence[str], path: Path, fmt: str, records: bool = False
) -> int:
    """Write runs to `path` as csv/json/parquet; returns rows (or runs, for json)."""
    if fmt not in FORMATS:
        raise InputError("--format", f"{fmt!r} is not one of {', '.join(FORMATS)}")
    if not path.parent.is_dir():
        raise InputError("--output", f"folder {path.parent} does not exist")
    if fmt == "json":
        export_json(store, run_ids, path)
        return len(run_ids)
    if records:
        rows = list(record_rows(store, run_ids))
    else:
        rows = [summary_row(info, store.metrics(info)) for info in map(store.get, run_ids)]
    export_table(rows, path, fmt)
    return len(rows)
