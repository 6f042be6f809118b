"""Names for the configs of a report: the knobs that differ within it, "default" for a
knob left at the engine's default, and everything else that describes a config
(engine, real or simulated, model, workload, hardware, the CPU's full name) as context for a
hover or a table, never in the legend."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from servetune.store.compare import knob_defaults
from servetune.store.runinfo import RunInfo

MAX_LABEL = 120  # characters of a legend entry; the full config is in the table


def value_text(v: Any) -> str:
    """A knob's value as a label shows it: None (the engine decides) is "default"."""
    if v is None:
        return "default"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v) or "none"
    return str(v)


def knobs_of(info: RunInfo) -> dict[str, Any]:
    """Every knob of the run's config, defaults filled in (a knob not recorded had its
    default), the engine name left out (it is context)."""
    cfg = {**knob_defaults(), **info.engine_config}
    cfg.pop("engine", None)
    return cfg


def server_of(info: RunInfo) -> str | None:
    """The server a run measured: its URL (two deployments of one config are two
    configs), but not for a run `tune` launched: each launch takes a free port, and the
    config itself names the server."""
    return None if info.tune is not None else info.target.url


def context_of(info: RunInfo) -> dict[str, str]:
    """What describes a config besides its knobs, for hovers and the configs table."""
    hw = info.meta.get("hardware") or {}
    cpu = hw.get("cpu")
    if cpu and hw.get("cpu_count"):
        cpu = f"{cpu} ({hw['cpu_count']} cores)"
    gpu = hw.get("gpu")
    if gpu and (hw.get("gpu_count") or 1) > 1:
        gpu = f"{hw['gpu_count']} x {gpu}"
    workload = info.part("workload") or {}
    out = {
        "engine": info.engine or info.engine_config.get("engine"),
        "backend": "simulated" if info.backend == "sim" else info.backend,
        "model": info.model,
        # the traffic is part of what makes a config (`data._config_key`): two workloads
        # on one config are two curves, told apart by the workload's name
        "workload": workload.get("name"),
        "hardware": gpu or hw.get("catalog"),
        "CPU": cpu,
        "server": server_of(info),
    }
    return {k: str(v) for k, v in out.items() if v}


def _same(values: Sequence[Any]) -> bool:
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) <= 1


def differing_knobs(infos: Sequence[RunInfo]) -> list[str]:
    """Knobs whose value is not the same in every config, in EngineConfig's order."""
    return varying([i.engine_config for i in infos])


def knob_label(config: dict[str, Any], knobs: Sequence[str]) -> str:
    """`parallel_slots=4 threads=default`: the config's values of `knobs`."""
    cfg = {**knob_defaults(), **config}
    return " ".join(f"{k}={value_text(cfg.get(k))}" for k in knobs)


def varying(configs: Sequence[dict[str, Any]]) -> list[str]:
    """Knobs whose value is not the same in every one of `configs` (engine config dicts)."""
    cfgs = [{**knob_defaults(), **c} for c in configs]
    names = [k for k in dict.fromkeys(k for c in cfgs for k in c) if k != "engine"]
    return [k for k in names if not _same([c.get(k) for c in cfgs])]


def config_labels(
    infos: Sequence[RunInfo], fallback: str = "config", knobs: Sequence[str] | None = None
) -> list[str]:
    """One unique, short name per config (one run each): `knob=value` for the knobs that
    differ (or `knobs`); the backend (then model, workload, hardware, engine, server, CPU)
    added when configs share the knobs; `fallback` when nothing differs (a single config)."""
    knobs = differing_knobs(infos) if knobs is None else knobs
    labels = [knob_label(i.engine_config, knobs) for i in infos]
    contexts = [context_of(i) for i in infos]
    for field in ("backend", "model", "workload", "hardware", "engine", "server", "CPU"):
        if len(set(labels)) == len(labels):
            break
        if not _same([c.get(field) for c in contexts]):
            labels = [
                f"{lab} {c.get(field, '')}".strip() for lab, c in zip(labels, contexts, strict=True)
            ]
    labels = [(lab or fallback)[:MAX_LABEL] for lab in labels]
    seen: dict[str, int] = {}
    unique = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        unique.append(lab if seen[lab] == 1 else f"{lab} #{seen[lab]}")
    return unique


def changes(info: RunInfo, base: RunInfo, knobs: Sequence[str]) -> list[str]:
    """`parallel_slots default -> 4`: the knobs in which `info` differs from `base`."""
    a, b = knobs_of(info), knobs_of(base)
    return [
        f"{k} {value_text(b.get(k))} -> {value_text(a.get(k))}"
        for k in knobs
        if not _same([a.get(k), b.get(k)])
    ]
