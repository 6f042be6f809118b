"""Everything a report draws, read from the store once: runs, their full results
(records, server series), how they group into configs (series) and the load axis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.errors import InputError
from servetune.report.labels import (
    config_labels,
    context_of,
    differing_knobs,
    server_of,
    varying,
)
from servetune.results.schema import RequestRecord, RunResult
from servetune.store import RunInfo, Store
from servetune.store.compare import compare_runs

MAX_RUNS = 200
X_TITLES = {"concurrency": "concurrency (users)", "rate": "achieved req/s"}


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

    def measured_records(self) -> list[RequestRecord]:
        """The records its metrics rest on: sent inside the measurement window, so the
        warm-up (`WorkloadSpec.warmup_s`) and the drain are left out as in every figure."""
        m = self.result.metrics
        if not m.window_end_ns:
            return list(self.result.records)
        lo, hi = m.window_start_ns, m.window_end_ns
        return [x for x in self.result.records if lo <= x.send_ns <= hi]


@dataclass
class ReportData:
    title: str
    where: str
    runs: list[RunData]
    x_kind: str  # "concurrency" | "rate"
    comparison: Any = None
    series: dict[str, list[RunData]] = field(default_factory=dict)
    knobs: list[str] = field(default_factory=list)  # knobs that differ between series
    context: dict[str, dict[str, str]] = field(default_factory=dict)  # series -> context
    baseline: str | None = None  # the series the others are compared with
    tune: dict[str, Any] | None = None  # the tune study's summary (TuneOutcome.to_json)

    @property
    def is_tune(self) -> bool:
        return self.tune is not None

    def role(self, name: str) -> str:
        """`winner`, `baseline`, `winner, baseline` or '' for a series."""
        if not self.is_tune:
            return "baseline" if name == self.baseline else ""
        tags = []
        for label in ("winner", "baseline"):
            t = (self.tune or {}).get(label) or {}
            if self.series_of(t.get("key"), t.get("backend")) == name:
                tags.append(label)
        return ", ".join(tags)

    def ordered(self) -> list[str]:
        """Series names, the winner and the baseline first, then measured before simulated
        (tables, capped charts)."""
        roles = {name: self.role(name) for name in self.series}

        def rank(n: str) -> tuple[bool, bool, bool]:
            simulated = self.series[n][0].info.backend == "sim"
            return (not roles[n], "winner" not in roles[n], simulated)

        return sorted(self.series, key=rank)

    def series_of(self, key: str | None, backend: str | None = None) -> str | None:
        """The series of a tune config key (and backend), when the report shows it."""
        for name, members in self.series.items():
            tag = members[0].info.tune
            same_backend = backend is None or members[0].info.backend == backend
            if tag is not None and tag.key == key and same_backend:
                return name
        return None

    def x(self, r: RunData) -> float | None:
        """Position of a run on the load axis; None for a run of the other loop kind:
        users in flight and an achieved rate are different loads, so a closed-loop sweep
        and open-loop runs are never drawn on one axis."""
        if (self.x_kind == "concurrency") != closed_loop(r.info):
            return None
        if self.x_kind == "concurrency":
            return float(r.info.concurrency) if r.info.concurrency is not None else None
        v = r.result.metrics.req_s
        return float(v) if v else None

    @property
    def x_title(self) -> str:
        return X_TITLES[self.x_kind]


# Workload fields that size or repeat a load point rather than define the traffic: an
# open-loop point's request count and warm-up grow with its rate
# (`measure.steady.SteadyRule.sized`), and a tune repetition draws with the next seed.
_SIZING = ("arrival", "count", "duration_s", "warmup_s", "seed")


def traffic(info: RunInfo) -> dict[str, Any]:
    """The run's workload without the fields that only size a load point (`_SIZING`)."""
    return {k: v for k, v in (info.part("workload") or {}).items() if k not in _SIZING}


def _config_key(info: RunInfo) -> str:
    """What makes runs one config (one curve): backend, model, hardware, engine and its
    version, knobs, traffic, and the server measured (`labels.server_of`), the context
    `runs compare` calls a difference."""
    hw = info.meta.get("hardware") or {}
    sw = info.meta.get("software") or {}
    return json.dumps(
        [
            info.backend,
            info.model,
            hw.get("gpu"),
            hw.get("gpu_count"),
            hw.get("cpu"),
            info.engine,
            sw.get("engine_version") or info.engine_version,
            info.engine_config,
            traffic(info),
            server_of(info),
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
    data = ReportData(
        title=title or _title(refs, infos),
        where=store.where,
        runs=runs,
        x_kind=load_axis([r.info for r in runs]),
    )
    data.tune = _tune_summary(store, infos)
    _group(data)
    if len(runs) > 1:
        data.comparison = compare_runs(infos, [r.metrics for r in runs])
    return data


def closed_loop(info: RunInfo) -> bool:
    """A closed-loop run: its load is users in flight (each sends when its last request
    ends), so its rate is an outcome, not a load."""
    return info.concurrency is not None and info.load_kind in (None, "closed")


def load_axis(infos: Sequence[RunInfo]) -> str:
    """The report's load axis, one loop kind: the achieved rate when some config has an
    open-loop sweep (two rates), else users in flight when some config has a closed-loop
    sweep (a simulated tune study: one open-loop run per config beside the winner's
    concurrency sweep), else users only when every run is a closed loop."""

    def sweeps(closed: bool) -> bool:
        loads: dict[str, set[float | None]] = {}
        for i in infos:
            if closed_loop(i) == closed:
                load = i.concurrency if closed else i.rate
                loads.setdefault(_config_key(i), set()).add(load)
        return any(len(v - {None}) >= 2 for v in loads.values())

    if sweeps(closed=False):
        return "rate"
    if sweeps(closed=True) or all(closed_loop(i) for i in infos):
        return "concurrency"
    return "rate"


def _tune_summary(store: Store, infos: list[RunInfo]) -> dict[str, Any] | None:
    """The summary `tune` stores with its study, when every run is of one tune study."""
    studies = {i.study for i in infos}
    if len(studies) != 1 or None in studies or any(i.tune is None for i in infos):
        return None
    meta = store.study_meta(infos[0].study or "") or {}
    return meta.get("summary")


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
    """Runs with the same config, model, hardware, workload, server and backend form a series
    (one curve), named by the knobs that differ between series (`labels`). The baseline
    is the tune study's, else the first series."""
    groups: dict[str, list[RunData]] = {}
    for r in data.runs:
        groups.setdefault(_config_key(r.info), []).append(r)
    firsts = [g[0].info for g in groups.values()]
    fallback = firsts[0].study or firsts[0].model or "runs"
    if data.tune:  # named by the knobs the study varied, as its bars and tables are
        trials = [*(data.tune.get("ranked") or []), *(data.tune.get("sim_ranked_top") or [])]
        data.knobs = varying([t["config"] for t in trials] + [i.engine_config for i in firsts])
    else:
        data.knobs = differing_knobs(firsts) if len(firsts) > 1 else []
    names = config_labels(firsts, fallback, data.knobs) if len(firsts) > 1 else [fallback]
    for name, members in zip(names, groups.values(), strict=True):
        members.sort(key=lambda r: data.x(r) or 0.0)
        for r in members:
            r.series = name
        data.series[name] = members
        data.context[name] = context_of(members[0].info)
    base = (data.tune or {}).get("baseline") or {}
    data.baseline = data.series_of(base.get("key"), base.get("backend")) or names[0]
