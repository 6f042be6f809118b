"""`servetune accept`: seed 003 §15's go-live checklist, run live against a deployment
(docs/accept.md). `checklist` holds the 23 items; `static` reads the config, files and
store; `probes` and `stability` send their load through the measure seam; `run` puts
them in order and saves the checklist after every item; `shedder` is the small
load-shedding front the tests (and a user without a gateway) put before an engine."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "ITEM_IDS": "checklist",
    "ITEMS": "checklist",
    "Checklist": "checklist",
    "Item": "checklist",
    "Status": "checklist",
    "Deployment": "inputs",
    "Sizes": "measuring",
    "Acceptance": "run",
    "AcceptSettings": "run",
    "ProbeFailed": "run",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
