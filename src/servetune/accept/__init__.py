"""`servetune accept`: seed 003 §15's go-live checklist, run live against a deployment
(docs/accept.md). `checklist` holds the 23 items; `static` reads the config, files and
store; `probes` and `stability` send their load through the measure seam; `run` puts
them in order and saves the checklist after every item; `shedder` is the small
load-shedding front the tests (and a user without a gateway) put before an engine."""

from servetune.accept.checklist import ITEM_IDS, ITEMS, Checklist, Item, Status
from servetune.accept.inputs import Deployment
from servetune.accept.measuring import Sizes
from servetune.accept.run import Acceptance, AcceptSettings, ProbeFailed

__all__ = [
    "ITEMS",
    "ITEM_IDS",
    "AcceptSettings",
    "Acceptance",
    "Checklist",
    "Deployment",
    "Item",
    "ProbeFailed",
    "Sizes",
    "Status",
]
