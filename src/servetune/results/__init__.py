"""RunResult: the one result schema of `bench` (real server) and `simulate`."""

from servetune.results.schema import Metrics, RequestRecord, RunResult

__all__ = ["Metrics", "RequestRecord", "RunResult"]
