"""What `accept` checks: the deployment (its URLs, engine, config), the SLO, the real
workload and the tuned load, resolved from the command line, a tuning study in the
store, or a stored run. Bad input is one line (InputError, exit 2): an unreachable
URL, an engine that is not the one answering, an unknown study or run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servetune.bench.http import server_root
from servetune.engines.config import ENGINES, EngineConfig
from servetune.errors import InputError, closest, from_validation_error
from servetune.slo import SLO, load_slo, parse_slo
from servetune.store import Store
from servetune.workload.spec import WorkloadSpec, parse_workload
from servetune.yamlfile import load_yaml


@dataclass
class Deployment:
    """The deployment under test and what it is judged against."""

    urls: list[str]  # the first is where the probes go (a replica or a gateway)
    engine: str
    served_model: str | None
    config: EngineConfig | None
    slo: SLO
    workload: WorkloadSpec
    load_kind: str | None = None  # the tuned load: "rate" (req/s) or "concurrency"
    load: float | None = None
    study: str | None = None  # the tuning study the config came from
    study_summary: dict[str, Any] = field(default_factory=dict)
    model_path: Path | None = None  # local weights, to hash
    api_keys: list[str] = field(default_factory=list)
    max_new_tokens: int | None = None  # the output cap the deployment promises
    dcgm_url: str | None = None
    autoscaling: Path | None = None
    pools: str | None = None  # "shared" | "split": the long/short pooling decision
    fault_cmd: str | None = None  # stops one replica, for the fault test

    @property
    def url(self) -> str:
        return self.urls[0]

    def describe(self) -> dict[str, Any]:
        """The context a checklist is about (no secrets: API keys are counted only)."""
        return {
            "urls": self.urls,
            "engine": self.engine,
            "served_model": self.served_model,
            "config": self.config.model_dump(mode="json", exclude_defaults=True)
            if self.config
            else None,
            "study": self.study,
            "slo": self.slo.model_dump(mode="json", exclude_none=True),
            "workload": self.workload.name,
            "tuned_load": {"kind": self.load_kind, "load": self.load} if self.load else None,
            "api_keys": len(self.api_keys),
        }


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        near = closest(engine, ENGINES)
        raise InputError(
            "--engine",
            f"unknown engine {engine!r}",
            f"one of {', '.join(ENGINES)}" + (f"; did you mean {near[0]}?" if near else ""),
        )
    return engine


def reach(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, Any]:
    """What the server at `url` says about itself: its served model (/v1/models) and the
    engine it looks like (vLLM answers /version, llama.cpp /props). Unreachable: exit 2."""
    import httpx

    base = server_root(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.InvalidURL as exc:  # not an HTTPError: 'http://[::1', 'http://[zz]/'
        raise InputError(
            "--url",
            f"{url!r} is not a valid URL ({exc})",
            "give http(s)://HOST[:PORT], an IPv6 host in brackets: http://[::1]:8000",
        ) from None
    except httpx.HTTPError as exc:
        raise InputError(
            "--url",
            f"{url} is unreachable ({type(exc).__name__})",
            "start the server or fix the address",
        ) from None
    out: dict[str, Any] = {"status": r.status_code}
    try:
        data = r.json().get("data") or []
        out["served_model"] = data[0].get("id") if data else None
        out["max_model_len"] = data[0].get("max_model_len") if data else None
    except (ValueError, AttributeError):
        out["served_model"] = None
    out["looks_like"] = _looks_like(base, headers)
    return out


def _looks_like(base: str, headers: dict[str, str]) -> str | None:
    import httpx

    probes = (("vllm", "/version", "version"), ("llamacpp", "/props", "build_info"))
    for engine, path, key in probes:
        try:
            r = httpx.get(base + path, headers=headers, timeout=3.0)
            if r.status_code == 200 and key in r.json():
                return engine
        except (httpx.HTTPError, ValueError, TypeError):
            continue
    return None


def check_answering(engine: str, seen: str | None, url: str) -> None:
    """`--engine` must be the engine that answers (when the server shows which it is)."""
    if seen is not None and seen != engine:
        raise InputError(
            "--engine", f"{url} is served by {seen}, not {engine}", f"pass --engine {seen}"
        )


def check_model_path(path: str | None) -> Path | None:
    """`--model-path`: the files the engine serves, to hash. A missing path is bad input,
    not a deployment that serves dummy weights."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise InputError(
            "--model-path", f"{path} does not exist", "give the file or folder the engine serves"
        )
    return p


def load_engine_config(path: str | Path, engine: str) -> EngineConfig:
    """`--config FILE`: the canonical knobs as YAML/JSON (docs/engines.md)."""
    data = load_yaml(path, "--config")
    if not isinstance(data, dict):
        raise InputError("--config", f"{path} must be a mapping of knobs", "e.g. max_num_seqs: 64")
    try:
        return EngineConfig.model_validate({"engine": engine, **data})
    except ValidationError as exc:
        raise from_validation_error(exc, "--config") from None


def study_summary(db: str | None, study: str) -> dict[str, Any]:
    """The tuning study's summary (what `tune` recommended, its OOM edges, its SLO)."""
    with Store.open(db, create=False) as store:
        meta = store.study_meta(study)
        where = store.where
    if meta is None:
        raise InputError(
            "--from-study",
            f"no study {study!r} in {where}",
            "servetune runs list shows the studies",
        )
    summary = meta.get("summary")
    if not isinstance(summary, dict):
        raise InputError(
            "--from-study",
            f"study {study!r} has no tuning result",
            "pick a study that `servetune tune` finished",
        )
    return summary


def from_study(summary: dict[str, Any]) -> tuple[EngineConfig | None, str | None, float | None]:
    """The config `tune` recommended (one safe step back when it took one) and the load
    its winner carried at its best passing point."""
    rec = summary.get("recommended") or {}
    winner = summary.get("winner") or {}
    raw = rec.get("config") or winner.get("config")
    cfg = EngineConfig.model_validate(raw) if raw else None
    best = winner.get("best") or {}
    return cfg, best.get("load_kind"), best.get("load")


def resolve_workload(path: str | None, run_ref: str | None, db: str | None) -> WorkloadSpec:
    """`--workload FILE`, else the workload of a stored run (`--workload-run ID`). Its
    load and length are the probes' to set: a count is filled in when the file has none."""
    if path:
        data = load_yaml(path, "--workload")
        base: Path | None = Path(path).parent
    elif run_ref:
        with Store.open(db, create=False) as store:
            rid = store.resolve([run_ref])[0]
            data = store.get(rid).part("workload")
        base = None
        if not data:
            raise InputError(
                "--workload-run", f"run {rid} has no workload recorded", "give --workload FILE"
            )
    else:
        raise InputError(
            "--workload",
            "a workload is needed (the real request distribution)",
            "give --workload FILE or --workload-run RUN",
        )
    if isinstance(data, dict) and not data.get("count") and not data.get("duration_s"):
        data = {**data, "count": 100}
    return parse_workload(data, base_dir=base, swept=True)


def resolve_slo(path: str | None, summary: dict[str, Any]) -> SLO:
    if path:
        return load_slo(path)
    if summary.get("slo"):
        return parse_slo(summary["slo"], "study slo")
    raise InputError(
        "--slo",
        "an SLO is needed to judge the stability stage",
        "give --slo FILE (or --from-study a tuned study)",
    )
