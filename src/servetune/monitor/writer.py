"""Write the monitoring set for one Deployment into a folder: the rules file, the
dashboard, the KEDA and HPA manifests, and the prometheus-adapter rules the HPA's External
metrics need — each checked against its schema before writing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servetune.errors import InputError
from servetune.monitor import schemas
from servetune.monitor.autoscale import adapter_config, hpa, keda_scaled_object
from servetune.monitor.dashboard import dashboard
from servetune.monitor.deployment import Deployment
from servetune.monitor.rules import rule_groups
from servetune.outfile import replaced

FILES = {
    "rules": "prometheus-rules.yaml",
    "dashboard": "grafana-dashboard.json",
    "keda": "keda-scaledobject.yaml",
    "hpa": "hpa.yaml",
    "adapter": "prometheus-adapter.yaml",
}


def documents(d: Deployment) -> dict[str, Any]:
    return {
        "rules": rule_groups(d),
        "dashboard": dashboard(d),
        "keda": keda_scaled_object(d),
        "hpa": hpa(d),
        "adapter": adapter_config(d),
    }


def check(docs: dict[str, Any]) -> None:
    """Refuse to write a document its published schema rejects."""
    for key, schema in (
        ("dashboard", schemas.GRAFANA_DASHBOARD),
        ("keda", schemas.KEDA_SCALED_OBJECT),
        ("hpa", schemas.HPA_V2),
        ("adapter", schemas.PROMETHEUS_ADAPTER),
    ):
        if bad := schemas.problems(docs[key], schema):
            raise InputError(key, f"generated {FILES[key]} fails its schema: {bad[0]}")


def export(d: Deployment, out_dir: str | Path) -> dict[str, Path]:
    """Write the five files; returns kind -> path."""
    import yaml

    docs = documents(d)
    check(docs)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only place, no permission, a file in the way
        raise InputError(
            "--out",
            f"cannot create folder {out} ({exc.strerror or exc})",
            "give a folder you can write",
        ) from None
    paths = {}
    for key, doc in docs.items():
        p = out / FILES[key]
        text = (
            json.dumps(doc, indent=2) + "\n"
            if p.suffix == ".json"
            else yaml.safe_dump(doc, sort_keys=False)
        )
        with replaced(p, "--out") as tmp:
            tmp.write_text(text)
        paths[key] = p
    return paths
