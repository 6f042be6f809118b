"""Everything a report draws, read from the store once: runs, their full results
(records, server series), how they group into configs (series) and the load axis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.errors import InputError
from servetune.results.schema import RunResult
from servetune.store import RunInfo, Store
from servetune.store.compare import compare_runs

MAX_RUNS = 200


@dataclass
class RunData:
    info: RunInfo
    result: RunResult
    letter: str
    series: str = ""

    @property
    def metrics(self) -> dict[str, Any]:
        return self.result.metrics.model_dump(mode="json")

    @property
    def gpus(self) -> int:
        hw = self.info.meta.get("hardware") or {}
        return int(hw.get("gpu_count") or self.info.gpu_count or 1)


@dataclass
class ReportData:
    title: str
    where: str
    runs: list[RunData]
    x_kind: str  # "concurrency" | "rate"
    comparison: Any = None
    series: dict[str, list[RunData]] = field(default_factory=dict)

    def x(self, r: RunData) -> float | None:
        """Position of a run on the load axis."""
        if self.x_kind == "concurrency":
            return float(r.info.concurrency) if r.info.concurrency is not None else None
        v = r.result.metrics.req_s
        return float(v) if v else None

    @property
    def x_title(self) -> str:
        return "concurrency (users)" if self.x_kind == "concurrency" else "achieved req/s"


def _config_key(info: RunInfo) -> str:
    hw = info.meta.get("hardware") or {}
    wl = {k: v for k, v in (info.part("workload") or {}).items() if k != "arrival"}
    return json.dumps(
        [
            info.backend,
            info.model,
            hw.get("gpu"),
            hw.get("gpu_count"),
            info.engine,
            info.engine_config,
            wl,
        ],
        sort_keys=True,
        default=str,
    )


def load_report_data(store: Store, refs: Sequence[str], title: str | None = None) -> ReportData:
    """Resolve refs (runs, studies, A,B,C) and load every run's full result."""
    ids = store.resolve(refs)
    if not ids:
        raise InputError("RUNS", "nothing to report: the study has no runs")
    if len(ids) > MAX_RUNS:
        raise InputError(
            "RUNS",
            f"{len(ids)} runs; a report takes at most {MAX_RUNS}",
            "pick a study or a list of runs",
        )
    infos = [store.get(i) for i in ids]
    runs = [RunData(info, store.load_result(info.id), _letter(k)) for k, info in enumerate(infos)]
    closed = all(
        r.info.concurrency is not None and r.info.load_kind in (None, "closed") for r in runs
    )
    data = ReportData(
        title=title or _title(refs, infos),
        where=store.where,
        runs=runs,
        x_kind="concurrency" if closed else "rate",
    )
    _group(data)
    if len(runs) > 1:
        data.comparison = compare_runs(infos, [r.metrics for r in runs])
    return data


def _letter(k: int) -> str:
    s = ""
    k += 1
    while k:
        k, rem = divmod(k - 1, 26)
        s = chr(65 + rem) + s
    return s


def _title(refs: Sequence[str], infos: list[RunInfo]) -> str:
    studies = sorted({i.study for i in infos if i.study})
    if len(studies) == 1 and all(i.study == studies[0] for i in infos):
        return f"servetune report: study {studies[0]}"
    if len(infos) == 1:
        return f"servetune report: run {infos[0].id}"
    return f"servetune report: {len(infos)} runs"


def _group(data: ReportData) -> None:
    """Runs with the same config, model, hardware, workload and backend form a series
    (one curve); series are named by what differs between them."""
    groups: dict[str, list[RunData]] = {}
    for r in data.runs:
        groups.setdefault(_config_key(r.info), []).append(r)
    firsts = [g[0].info for g in groups.values()]
    names: list[str] = []
    if len(firsts) > 1:
        comp = compare_runs(firsts, [None] * len(firsts))
        diff = [f for f in comp.differing if not f.name.startswith("load.")]
        for i, _ in enumerate(firsts):
            parts = [
                f"{f.name.split('.')[-1]}={f.values[i]}"
                if f.name != "backend"
                else str(f.values[i])
                for f in diff
            ]
            names.append(", ".join(parts)[:60] or f"config {i + 1}")
    else:
        names = [firsts[0].study or firsts[0].model or "runs"]
    for name, (_, members) in zip(names, groups.items(), strict=True):
        name = name if name not in data.series else f"{name} ({len(data.series)})"
        members.sort(key=lambda r: data.x(r) or 0.0)
        for r in members:
            r.series = name
        data.series[name] = members
