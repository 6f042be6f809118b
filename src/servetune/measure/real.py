"""Real measurements: a server at a URL (what `bench --url` and the fidelity harness
measure) or an engine servetune launched (the tuner's real backend). Both go through
`ServerSession.measure`: materialise the point's requests, run bench's load generator.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from servetune.bench.client import Timeouts
from servetune.bench.runner import BenchInterrupted, BenchOptions, run_point
from servetune.bench.server_metrics import engine_adapter, http_fetcher
from servetune.engines.process import EngineError
from servetune.measure.result import Infeasible
from servetune.measure.session import NO_SINKS, Interrupted, Point, Sinks
from servetune.results.schema import RunResult
from servetune.slo import SLO
from servetune.workload.materialize import Request, materialize
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import Tokenizer, load_tokenizer


class ServerSession:
    """A server already running at `opts.url`. `opts` says how to talk to it; the
    per-point parts (records log, store writer, live progress) come from the sinks.
    `requests_cache`, when given, keeps each spec's materialised requests: the same model
    behind the same tokenizer makes them reusable (a relaunched engine, a repeated load)."""

    def __init__(
        self,
        opts: BenchOptions,
        tokenizer: Tokenizer,
        slo: SLO | None = None,
        *,
        launch_command: str | None = None,
        requests_cache: dict[str, list[Request]] | None = None,
    ) -> None:
        self.opts = opts
        self.tokenizer = tokenizer
        self.slo = slo
        self.launch_command = launch_command
        self.cache = requests_cache

    def requests(self, spec: WorkloadSpec) -> list[Request]:
        if self.cache is None:
            return materialize(spec, self.tokenizer)
        key = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
        if key not in self.cache:
            self.cache[key] = materialize(spec, self.tokenizer)
        return self.cache[key]

    def measure(self, point: Point, sinks: Sinks = NO_SINKS) -> RunResult:
        """Send the point's requests and build its RunResult from the raw records.
        Ctrl-C raises `Interrupted` carrying the part measured."""
        requests = point.requests if point.requests is not None else self.requests(point.spec)
        opts = replace(
            self.opts, records_path=sinks.records, progress=sinks.live, store=sinks.store
        )
        try:
            return run_point(point.spec, requests, opts, self.slo, point.label)
        except BenchInterrupted as exc:
            raise Interrupted(exc.result) from None


class EngineSession:
    """An engine servetune launched (`engines.process.launch`): measured like any server
    at its URL, with the server's own tokenizer and /metrics, then checked: an engine that
    died under load makes the config `Infeasible`, quoting its log."""

    def __init__(
        self,
        srv: Any,
        slo: SLO | None,
        request_timeout_s: float,
        requests_cache: dict[str, list[Request]] | None = None,
    ) -> None:

        t = request_timeout_s
        opts = BenchOptions(
            url=srv.url,
            model=srv.served_model,
            timeouts=Timeouts(10.0, t, min(60.0, t), 2 * t),
            metrics_fetch=http_fetcher(srv.url, engine_adapter(srv.engine)),
            keep_text=False,
            drain_s=2 * t,
        )
        self.srv = srv
        self.launch_command = srv.spec.shell()
        self.server = ServerSession(
            opts,
            load_tokenizer("server", srv.url),
            slo,
            launch_command=self.launch_command,
            requests_cache=requests_cache,
        )

    def measure(self, point: Point, sinks: Sinks = NO_SINKS) -> RunResult:
        res = self.server.measure(point, sinks)
        try:
            self.srv.check()
        except EngineError as exc:
            raise Infeasible(exc.kind, f"died under load: {exc.problem}", exc.log_tail) from None
        res.target.engine = self.srv.engine
        res.target.config = self.srv.cfg.model_dump(mode="json", exclude_defaults=True)
        res.target.settings = self.srv.settings
        return res


def server_software(url: str, api_key: str | None = None) -> dict[str, Any]:
    """The engine's version as the server reports it: vLLM's /version, llama.cpp's /props
    `build_info`. Best effort, 2 s: {} when the server says neither."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    for path, key in (("/version", "version"), ("/props", "build_info")):
        try:
            r = httpx.get(base + path, headers=headers, timeout=2.0)
            version = r.json().get(key) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        if version:
            return {"engine_version": str(version)}
    return {}
