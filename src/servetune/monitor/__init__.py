"""`servetune monitor export`: the tuned limits as the monitoring and autoscaling teams
already run — Prometheus recording and alert rules, a Grafana dashboard, and KEDA / HPA
manifests following seed 003 §11."""

from servetune.monitor.deployment import Deployment, from_description, from_study, from_summary
from servetune.monitor.export import export

__all__ = ["Deployment", "export", "from_description", "from_study", "from_summary"]
