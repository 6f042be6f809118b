"""The per-request table: one row per request with its TTFT/TPOT/E2E (the contract's
per-request definitions, `compute.request_latencies_ms`) beside the raw fields. Bench's
`-o run.csv` and `runs export --format csv` write the same columns."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from servetune.metrics.compute import request_latencies_ms
from servetune.outfile import replaced
from servetune.results.schema import RequestRecord, RunResult

CSV_FIELDS = (  # noqa: SIM905 - one readable string
    "index sub priority prefix_group worker status error http_status scheduled_ns send_ns "
    "connect_ns queue_ns end_ns ttft_ms tpot_ms e2e_ms chunks prompt_tokens "
    "usage_prompt_tokens output_tokens usage_completion_tokens tokenizer_completion_tokens "
    "finish_reason error_detail"
).split()


def csv_row(r: RequestRecord) -> dict[str, Any]:
    ttft, tpot, e2e = request_latencies_ms(r)
    row = {k: getattr(r, k, None) for k in CSV_FIELDS}
    row.update(
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_ms=e2e,
        chunks=len(r.chunk_ns),
        output_tokens=r.output_tokens,
    )
    return row


def write_csv(results: list[RunResult], path: Path) -> None:
    """One row per request; a sweep's points are told apart by `run_id` and load."""
    with replaced(path, "--csv") as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["run_id", "load", *CSV_FIELDS])
        w.writeheader()
        for res in results:
            load = ",".join(f"{k}={v}" for k, v in res.load.model_dump().items() if v is not None)
            for r in res.records:
                w.writerow({"run_id": res.id, "load": load, **csv_row(r)})
