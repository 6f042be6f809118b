"""Per-step trace of a simulation (batch, prefill/decode tokens, KV blocks, preemptions),
as CSV for plots. A row covering a decode-only jump has `steps` > 1."""

from __future__ import annotations

import csv
from pathlib import Path

from servetune.outfile import replaced
from servetune.sim.scheduler import TRACE_COLUMNS, Scheduler


def write_trace(sched: Scheduler, path: str | Path) -> int:
    """Write the trace; returns the number of rows."""
    rows = sched.stats.trace
    with replaced(path, "--trace") as tmp, tmp.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TRACE_COLUMNS)
        for row in rows:
            w.writerow([f"{v:.6f}" if isinstance(v, float) else v for v in row])
    return len(rows)
