"""`servetune bench`: the load generator (client, pacing, workers, results).

Exports load on first use: bench's worker processes import this package and must stay
free of pydantic and numpy."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "BenchOptions": "runner",
    "run_point": "runner",
    "Timeouts": "client",
    "engine_adapter": "server_metrics",
    "http_fetcher": "server_metrics",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
