"""RunResult: the one result schema of `bench` (real server) and `simulate`, and the
files a run is kept in (`files`: the result JSON, the JSONL record log)."""

from servetune.results.files import RecordLog, load_result, write_result
from servetune.results.schema import Load, Metrics, RequestRecord, RunResult, Target, TuneTag

__all__ = [
    "Load",
    "Metrics",
    "RecordLog",
    "RequestRecord",
    "RunResult",
    "Target",
    "TuneTag",
    "load_result",
    "write_result",
]
