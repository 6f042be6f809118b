"""`servetune monitor export`: the tuned limits as the monitoring and autoscaling teams
already run — Prometheus recording and alert rules, a Grafana dashboard, and KEDA / HPA
manifests following seed 003 §11."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "Deployment": "deployment",
    "from_description": "deployment",
    "from_study": "deployment",
    "from_summary": "deployment",
    "export": "writer",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
