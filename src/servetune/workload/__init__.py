"""WorkloadSpec and its materialisation into concrete requests."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "WorkloadSpec": "spec",
    "Arrival": "spec",
    "SubWorkload": "spec",
    "load_workload": "spec",
    "parse_workload": "spec",
    "Request": "materialize",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
