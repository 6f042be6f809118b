"""Diagnose a stored run, a RunResult file, or a live deployment watched for a window.
The I/O edge of the package: read the run (or scrape for `window_s`), build the evidence,
apply the rules, and give the findings a stable JSON shape."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servetune.diagnose.evidence import Evidence, from_result, from_window
from servetune.diagnose.rules import Finding, diagnose
from servetune.errors import InputError
from servetune.outfile import missing_file_fix
from servetune.results.schema import RunResult

MAX_WINDOW_S = 86_400  # a day: longer is a monitor's job (servetune monitor), not a window


@dataclass
class Diagnosis:
    evidence: Evidence
    findings: list[Finding]

    def to_json(self) -> dict[str, Any]:
        """Stable keys: source, live, findings[{key, kind, title, seed, trigger, score,
        actions[{knob, now, next, why, predicted}]}], evidence (the numbers read)."""
        ev = self.evidence
        return {
            "source": ev.source,
            "live": ev.live,
            "findings": [f.to_json() for f in self.findings],
            "evidence": {
                "engine": ev.engine,
                "batch_cap": ev.batch_cap,
                "ttft_ms": ev.ttft,
                "tpot_ms": ev.tpot,
                "e2e_ms": ev.e2e,
                "input_tokens": ev.input_tokens,
                "output_tokens": ev.output_tokens,
                "running_max": ev.running_max,
                "waiting_max": ev.waiting_max,
                "kv_usage_max": ev.kv_usage_max,
                "preemptions": ev.preemptions,
                "queue_ms": ev.queue_ms,
                "telemetry": ev.tel,
            },
        }


def diagnose_result(res: RunResult, source: str | None = None, whatif: bool = True) -> Diagnosis:
    """The findings of a run; with `whatif`, the simulator's effect of the top actions
    where the run names a catalog model and hardware (diagnose.whatif)."""
    ev = from_result(res, source)
    found = diagnose(ev)
    if whatif:
        from servetune.diagnose.whatif import add_simulated_effects

        add_simulated_effects(res, found)
    return Diagnosis(ev, found)


def load_run(ref: str, db: str | None = None) -> tuple[RunResult, str]:
    """A RunResult file when `ref` names one, else a run in the store (id or prefix)."""
    if not ref.strip():  # an unset shell variable; Path("") would be this folder
        raise InputError("RUN", "is empty", "give a run id or a result file")
    try:
        kind = "file" if Path(ref).is_file() else "dir" if Path(ref).is_dir() else None
    except OSError:  # a name too long for a path (ENAMETOOLONG): not a file, maybe an id
        kind = None
    if kind == "file":
        from servetune.results.files import load_result

        return load_result(ref, "RUN"), ref
    if kind == "dir":
        raise InputError("RUN", f"{ref} is a folder", "give a result file or a run id")
    if "/" in ref or ref.endswith(".json"):  # a path, not a run id: say the file is missing
        fix = missing_file_fix(ref, "give a result file or a run id")
        raise InputError("RUN", f"no such file: {ref}", fix)
    from servetune.store import Store

    with Store.open(db, create=False) as store:
        ids = store.resolve([ref])
        if len(ids) != 1:
            raise InputError(
                "RUN", f"{ref!r} names {len(ids)} runs", "give one run id (servetune runs list)"
            )
        return store.load_result(ids[0]), ids[0]


def watch(
    url: str,
    window_s: float,
    engine: str | None = None,
    telemetry_url: str | None = None,
    interval_s: float = 1.0,
) -> Diagnosis:
    """Scrape `url`'s /metrics and sample telemetry for `window_s` seconds, sending no
    load of its own, then diagnose what the engine and the host showed."""
    from servetune.bench.server_metrics import Scraper, engine_adapter, http_fetcher
    from servetune.telemetry import sampling, telemetry_options
    from servetune.telemetry.host import local_server_pids

    if not 1 <= window_s <= MAX_WINDOW_S:  # NaN and inf too
        raise InputError(
            "--window", f"{window_s:g} s", f"give a window of 1 to {MAX_WINDOW_S} seconds"
        )
    from servetune.bench.http import with_scheme
    from servetune.bench.reach import check_url

    check_url(url)  # one check, bench's: scheme, host, port, an IPv6 host in brackets
    url = with_scheme(url)  # `127.0.0.1:8000`, as bench takes it
    if telemetry_url is not None:
        _check_telemetry(telemetry_url)
    if engine is not None:
        _check_engine(engine)
    else:  # named by its own /metrics names, as bench does
        from servetune.measure.real import server_engine

        engine = server_engine(url)
    fetch = http_fetcher(url, engine_adapter(engine) if engine else None)
    try:
        fetch()
    except Exception as exc:  # any failure to read /metrics is the user's URL problem
        raise InputError("--url", f"cannot read {url}/metrics ({type(exc).__name__})") from None
    scraper = Scraper(fetch, interval_s)
    anchor = time.monotonic_ns()
    tel = sampling(
        replace(telemetry_options(True, telemetry_url), interval_s=interval_s),
        local_server_pids(url),
    )
    scraper.start(anchor)
    time.sleep(window_s)
    series = scraper.stop()
    telemetry = tel.sampler.stop(anchor) if tel is not None else None
    ev = from_window(url, series, telemetry, engine)
    return Diagnosis(ev, diagnose(ev))


def _check_telemetry(url: str) -> None:
    """A `--telemetry-url` the window cannot read is the user's to fix before the wait:
    sampled, its failures are counted and never break a run, so an unreachable exporter
    read as a quiet GPU (`no symptom found`)."""
    from servetune.telemetry import telemetry_options
    from servetune.telemetry.prom import PromSource

    telemetry_options(True, url)  # http(s) only
    source = PromSource(url, timeout_s=5.0)
    try:
        source.read()
    except Exception as exc:  # refused, unresolvable, 404, not Prometheus text
        raise InputError(
            "--telemetry-url",
            f"cannot read {url} ({type(exc).__name__})",
            "give a DCGM exporter's /metrics, e.g. http://gpu-node:9400/metrics, or drop it",
        ) from None
    finally:
        source.close()


def _check_engine(engine: str) -> None:
    """An unknown --engine, named as the flag (not a failed read of the URL's /metrics)."""
    from servetune.engines.registry import adapter

    try:
        adapter(engine)
    except InputError as exc:
        raise InputError("--engine", exc.problem, exc.fix) from None


def _watched(ev: Evidence) -> str:
    """What a live window saw, in one line (figures the engine or the host did not give
    are left out)."""

    def pct(x: float | None) -> str | None:
        return None if x is None else f"{x:.0%}"

    parts = {
        "running max": ev.running_max,
        "waiting max": ev.waiting_max,
        "KV peak": pct(ev.kv_usage_max),
        "host CPU": pct(ev.tel.get("host_cpu_busy_mean")),
        "engine cores": ev.tel.get("engine_cpu_cores_mean"),
        "GPU util": pct(ev.tel.get("gpu_util_mean")),
    }
    shown = [
        f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in parts.items()
        if v is not None
    ]
    return ", ".join(shown) or "nothing (no /metrics series, no local telemetry)"


def render(d: Diagnosis) -> list[str]:
    """The report as lines: each finding, its trigger, its ordered actions."""
    ev = d.evidence
    head = f"diagnosis of {ev.source}" + (" (live window, no load sent)" if ev.live else "")
    lines = [head]
    if ev.live:
        lines.append("  watched: " + _watched(ev))
    if not d.findings:
        lines.append("  no symptom found: nothing in seed 003 §13's list fired")
        return lines
    for n, f in enumerate(d.findings, 1):
        lines.append(f"{n}. [{f.kind}] {f.title}")
        lines.append(f"   because: {f.trigger}")
        lines.append(f"   seeds: {f.seed}")
        for k, a in enumerate(f.actions, 1):
            lines.append(f"   {n}.{k} {a.line()}")
    if any(f.kind != "engine" for f in d.findings) and any(f.kind == "engine" for f in d.findings):
        lines.append(
            "note: fix the client/host findings first; the engine findings were measured under them"
        )
    return lines
