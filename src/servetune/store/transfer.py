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
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from servetune.errors import InputError, from_validation_error
from servetune.metrics.compute import compute_metrics
from servetune.metrics.table import csv_row
from servetune.results.schema import RequestRecord, RunResult, Target
from servetune.status import RunStatus
from servetune.store.meta import RunMeta
from servetune.store.runinfo import RunInfo
from servetune.store.timestamps import utc_now

if TYPE_CHECKING:  # the Store imports this module to read import files
    from servetune.store.store import Store

EXPORT_FORMAT = 1
FORMATS = ("csv", "json", "parquet")
_DIST_STATS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass
class ImportItem:
    result: RunResult
    meta: RunMeta
    conclusion: str | None = None
    conclusion_note: str | None = None
    quality: dict[str, Any] | None = None


def _result(obj: Any, where: str) -> RunResult:
    try:
        return RunResult.model_validate(obj)
    except ValidationError as exc:
        raise from_validation_error(exc, where) from exc


def read_import(path: Path) -> Iterator[ImportItem]:
    """Parse an import file into results with their metadata (validated first: a bad
    file raises before anything is written)."""
    if not path.is_file():
        raise InputError("FILE", f"no such file: {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    first = text.lstrip()[:1]
    if first not in ("{", "["):
        raise InputError("FILE", f"{path.name} is not JSON or JSONL", "give a bench result file")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        items = [_from_jsonl(path, text)]
    else:
        items = list(_from_json(path, obj))
    return iter(items)


def _from_json(path: Path, obj: Any) -> Iterator[ImportItem]:
    name = path.name
    if isinstance(obj, dict) and "servetune_export" in obj:
        if obj["servetune_export"] > EXPORT_FORMAT:
            raise InputError("FILE", f"{name} is a newer export format", "upgrade servetune")
        for i, run in enumerate(obj.get("runs", [])):
            try:
                meta = RunMeta.model_validate(run.get("meta") or {})
            except ValidationError as exc:
                raise from_validation_error(exc, f"{name}.runs[{i}].meta") from exc
            yield ImportItem(
                _result(run["result"], f"{name}.runs[{i}].result"),
                meta,
                run.get("conclusion"),
                run.get("conclusion_note"),
                run.get("quality"),
            )
        return
    runs = obj if isinstance(obj, list) else [obj]
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or "id" not in run or "records" not in run:
            raise InputError("FILE", f"{name}: entry {i} is not a servetune run result")
        yield ImportItem(_result(run, name), RunMeta())


def _from_jsonl(path: Path, text: str) -> ImportItem:
    """bench's record log: a {"run": {...}} header, then one raw record per line. It has
    no final result, so metrics are computed here and the run is marked interrupted."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        rows = [json.loads(ln) for ln in lines]
    except json.JSONDecodeError as exc:
        raise InputError("FILE", f"{path.name}: line {exc.lineno} is not JSON") from exc
    head = rows[0].get("run") if rows and isinstance(rows[0], dict) else None
    if not isinstance(head, dict) or "id" not in head:
        raise InputError("FILE", f"{path.name} is not a bench record log (no run header)")
    records: list[RequestRecord] = []
    for i, row in enumerate(rows[1:], start=2):
        try:
            records.append(RequestRecord.model_validate(row))
        except ValidationError as exc:
            raise from_validation_error(exc, f"{path.name}:{i}") from exc
    records.sort(key=lambda r: (r.send_ns, r.index))
    result = RunResult(
        id=head["id"],
        created_utc=str(head.get("created_utc") or _created_from_id(head["id"])),
        target=Target(url=head["url"]) if head.get("url") else Target(),
        load=head.get("load") or {},
        status=RunStatus.INTERRUPTED,
        stop_reason=f"imported from the record log {path.name} (no final result)",
        records=records,
        metrics=compute_metrics(records),
    )
    return ImportItem(result, RunMeta(load=result.load))


def _created_from_id(run_id: str) -> str:
    """bench ids carry their UTC start: bench-20260101T120000-abcdef."""
    for part in run_id.split("-"):
        try:
            return datetime.strptime(part, "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc).isoformat()
        except ValueError:
            continue
    return datetime.now(timezone.utc).isoformat()


# -- export ---------------------------------------------------------------------------


def summary_row(info: RunInfo) -> dict[str, Any]:
    """One flat row per run: identity, load, every metric, every engine knob."""
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
    for k, v in (info.metrics or {}).items():
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
    for rid in run_ids:
        info = store.get(rid)
        meta = {**info.meta, "id": rid, "study": info.study, "tags": info.tags}
        runs.append(
            {
                "meta": meta,
                "result": json.loads(store.load_result(rid).model_dump_json()),
                "status": info.status,
                "conclusion": info.conclusion,
                "conclusion_note": info.conclusion_note,
                "quality": info.quality,
            }
        )
    doc = {"servetune_export": EXPORT_FORMAT, "exported_utc": utc_now(), "runs": runs}
    _atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())


def export_table(rows: list[dict[str, Any]], path: Path, fmt: str) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(path)
        return
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InputError(
            "--format", "parquet needs pyarrow", "pip install 'servetune[parquet]'"
        ) from exc
    table = pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows])
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


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
        rows = [summary_row(store.get(rid)) for rid in run_ids]
    export_table(rows, path, fmt)
    return len(rows)
