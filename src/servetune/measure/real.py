"""Real measurements: a server at a URL (what `bench --url` and the fidelity harness
measure) or an engine servetune launched (the tuner's real backend). Both go through
`ServerSession.measure`: materialise the point's requests, run bench's load generator.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from servetune.bench.client import Timeouts
from servetune.bench.http import server_root
from servetune.bench.runner import BenchInterrupted, BenchOptions, run_point
from servetune.bench.server_metrics import engine_adapter, http_fetcher
from servetune.engines.process import EngineError
from servetune.engines.registry import adapter, exports_metrics
from servetune.measure.result import Infeasible
from servetune.measure.session import NO_SINKS, Interrupted, Point, Sinks
from servetune.results.schema import RunResult
from servetune.slo import SLO
from servetune.telemetry import DEFAULT_TELEMETRY, TelemetryOptions, sampling
from servetune.telemetry.host import local_server_pids
from servetune.workload.materialize import Request, materialize
from servetune.workload.sessions import AgentLoop
from servetune.workload.spec import Fixed, WorkloadSpec
from servetune.workload.tokenizer import Tokenizer, agree, load_tokenizer


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
        telemetry: TelemetryOptions | None = DEFAULT_TELEMETRY,
        engine_pids: Callable[[], set[int]] | None = None,
    ) -> None:
        self.opts = opts
        self.tokenizer = tokenizer
        self.slo = slo
        self.launch_command = launch_command
        self.cache = requests_cache
        # Telemetry (servetune.telemetry) is sampled around every point; the engine's
        # process tree is the launched engine's, or whatever listens on a local URL.
        self.telemetry = telemetry
        self.engine_pids = engine_pids

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
        tel = None
        if self.telemetry is not None and self.telemetry.enabled:
            pids = self.engine_pids or local_server_pids(self.opts.url)
            tel = sampling(self.telemetry, pids)
        store = tel.recorder(sinks.store) if tel is not None else sinks.store
        # the tokenizer the requests were counted with: a session worker re-plans the
        # turns' max_tokens and context cap in it (bench.runner.session_worker)
        tok = self.opts.tokenizer or self.tokenizer
        opts = replace(
            self.opts,
            records_path=sinks.records,
            progress=sinks.live,
            store=store,
            tokenizer=tok,
            stop_when_missed=point.stop_when_missed,
        )
        try:
            res = run_point(point.spec, requests, opts, self.slo, point.label)
        except BenchInterrupted as exc:
            if tel is not None:
                tel.attach(exc.result)
            raise Interrupted(exc.result) from None
        except BaseException:
            if tel is not None:
                tel.close()  # no result to attach it to: just stop sampling
            raise
        if tel is not None:
            tel.attach(res)
        return res


WARMUP_REQUESTS = 2  # sent before an engine's first point (`EngineSession.warm_up`)


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
        telemetry: TelemetryOptions | None = DEFAULT_TELEMETRY,
    ) -> None:

        t = request_timeout_s
        opts = BenchOptions(
            url=srv.url,
            model=srv.served_model,
            timeouts=Timeouts(10.0, t, min(60.0, t), 2 * t),
            # an engine without /metrics (MLX, transformers): client-side figures only
            metrics_fetch=(
                http_fetcher(srv.url, engine_adapter(srv.engine))
                if exports_metrics(srv.engine)
                else None
            ),
            keep_text=False,
            drain_s=2 * t,
        )
        self.srv = srv
        self.launch_command = srv.spec.shell()
        self.server = ServerSession(
            opts,
            engine_tokenizer(srv.engine, srv.url, srv.model),
            slo,
            launch_command=self.launch_command,
            requests_cache=requests_cache,
            telemetry=telemetry,
            engine_pids=srv.pids,
        )
        self.measured = 0  # points measured in this engine's life (`fresh_prompts`)

    def warm_up(self, point: Point) -> None:
        """Before the engine's first point: WARMUP_REQUESTS of that point's workload, one
        at a time, unmeasured. Why: the first requests after a launch pay one-time costs
        that no later request does (llama.cpp + Gemma 3 270M, the main job's first point:
        TTFT 2,082 and 525 ms for the first two requests, 94-127 ms for the next four;
        the launch's own one-token completion does not pay them), and the simulator
        models none of it. The calibration sweep warms up the same way."""
        try:
            spec = warmup_spec(point.spec)
        except ValueError:  # a trace: nothing to send one at a time
            return
        self.server.measure(Point(f"{point.label} warm-up", spec))

    def measure(self, point: Point, sinks: Sinks = NO_SINKS) -> RunResult:
        point = replace(point, spec=engine_sampling(point.spec, self.srv.engine))
        if self.measured == 0 and point.requests is None:
            self.warm_up(point)
            self.measured += 1  # its prompts are spent: the first point draws new ones
        point = fresh_prompts(point, self.measured)
        self.measured += 1
        res = self.server.measure(point, sinks)
        try:
            self.srv.check()
        except EngineError as exc:
            raise Infeasible(exc.kind, f"died under load: {exc.problem}", exc.log_tail) from None
        res.target.engine = self.srv.engine
        res.target.config = self.srv.cfg.model_dump(mode="json", exclude_defaults=True)
        res.target.settings = self.srv.settings
        return res


def warmup_spec(spec: WorkloadSpec) -> WorkloadSpec:
    """The warm-up of `spec` (`EngineSession.warm_up`): WARMUP_REQUESTS of its requests, one
    at a time. Sessions: that many sessions of one turn each (a chat's first turn, an agent's
    one answering call), not whole sessions, whose later turns wait on think and tool times
    (the agent-loop example's 2 sessions were ~10 calls and seconds of tool waits before
    the point's first request). A chat dataset's conversations keep their own turns: one
    of them is sent."""
    out = spec.with_load(concurrency=1, count=WARMUP_REQUESTS)
    ses = out.sessions
    if isinstance(ses, AgentLoop):
        ses = ses.model_copy(update={"steps": Fixed(value=1)})
    elif ses is not None and ses.dataset is None:
        ses = ses.model_copy(update={"turns": Fixed(value=1)})
    elif ses is not None:
        out = out.with_load(count=1)
    return out.model_copy(update={"sessions": ses})


def engine_sampling(spec: WorkloadSpec, engine: str | None) -> WorkloadSpec:
    """The workload as `engine` takes it. `transformers serve` answers HTTP 422 to any
    request field outside the OpenAI schema (`OPENAI_FIELDS_ONLY` in its adapter), so
    `ignore_eos` and `min_tokens` are not sent there: an answer may stop at EOS before
    `max_tokens` (the random-weight test model practically never emits it; the output
    tokens counted are the ones that came, as always)."""
    s = spec.sampling
    strict = engine is not None and getattr(adapter(engine), "OPENAI_FIELDS_ONLY", False)
    if not strict or not (s.ignore_eos or s.min_tokens_equal_max):
        return spec
    plain = s.model_copy(update={"ignore_eos": False, "min_tokens_equal_max": False})
    return spec.model_copy(update={"sampling": plain})


def engine_tokenizer(engine: str, url: str, model: str) -> Tokenizer:
    """What a launched engine's prompts are built with. A local HF directory's
    tokenizer.json is what the engine serves with: it is used when the engine has no
    /tokenize (`NO_TOKENIZE` in its adapter: MLX, transformers serve), and when the
    engine's own /tokenize agrees with it on the probe texts (`agree`: vLLM on a local
    directory), because a server's tokenizer costs an HTTP call per prompt (4,096 prompts
    of a duration-bound closed loop: ~22 s on a 2-core host before the first send).
    Otherwise the engine's /tokenize (llama.cpp's GGUF, a hub id); a model that is not such
    a directory, on an engine without one, falls back to whitespace words."""
    local = Path(model)
    here = (local / "tokenizer.json").is_file()
    if getattr(adapter(engine), "NO_TOKENIZE", False):
        return load_tokenizer(str(local) if here else "word")
    server = load_tokenizer("server", url)
    if here and agree(hf := load_tokenizer(str(local)), server):
        return hf
    return server


def fresh_prompts(point: Point, k: int) -> Point:
    """The `k`-th point measured on one engine process (the warm-up counts) draws its own
    prompts: the spec's seed + k (k = 0 as given; fixed `requests` as given). Why: an
    engine keeps the prompts it served (llama.cpp per slot and in its host-memory prompt
    cache) and serves a repeated prompt from that cache, and one seed at every load point
    of a config repeated the same first prompts: later points measured cache hits (the main job,
    llama.cpp + Gemma 3 270M, one config's 4-user point: 4 prompts served at earlier points
    reached their first token in 85 ms, the next 4, half of them new, in 234 ms). Traffic
    without shared prefixes never repeats a prompt, and the simulator rightly does not
    assume it does."""
    if k == 0 or point.requests is not None:
        return point
    return replace(point, spec=point.spec.model_copy(update={"seed": point.spec.seed + k}))


def server_engine(url: str, api_key: str | None = None) -> str | None:
    """The engine serving `url`, named by its own /metrics names (`engines.metrics.
    engine_of`). Best effort, 2 s: None when the server has no such page or names none."""
    import httpx

    from servetune.engines.metrics import engine_of

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(server_root(url) + "/metrics", headers=headers, timeout=2.0)
    except httpx.HTTPError:
        return None
    return engine_of(r.text) if r.status_code == 200 else None


def server_software(url: str, api_key: str | None = None) -> dict[str, Any]:
    """The engine's version as the server reports it: vLLM's /version, llama.cpp's /props
    `build_info`. Best effort, 2 s: {} when the server says neither."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = server_root(url)  # a --url ending in /v1 asked /v1/version
    for path, key in (("/version", "version"), ("/props", "build_info")):
        try:
            r = httpx.get(base + path, headers=headers, timeout=2.0)
            version = r.json().get(key) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        if version:
            return {"engine_version": str(version)}
    return {}
