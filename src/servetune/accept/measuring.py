"""How `accept` sends load: every probe is a `Point` measured through the one seam
(`servetune.measure`: a `ServerSession` for the deployment's URL, `sweep` storing each
run as it goes). A probe varies only what the bench client is told (an API key, a client
timeout that abandons requests, cancellations); it never runs a load loop of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servetune.accept.inputs import Deployment
from servetune.bench.client import Timeouts
from servetune.bench.http import server_root
from servetune.bench.runner import BenchOptions
from servetune.bench.server_metrics import engine_adapter, http_fetcher
from servetune.engines.metrics import EngineMetrics, scrape
from servetune.errors import InputError
from servetune.measure import Point, ServerSession, StoreSettings, server_software, sweep
from servetune.results.schema import RunResult
from servetune.status import RunStatus
from servetune.store import RunMeta, software_info
from servetune.workload.materialize import Request, materialize
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import ServerTokenizer, Tokenizer

Say = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    """How much each probe sends. The defaults suit a real deployment (minutes in all);
    tests pass smaller ones. `overload`: the queue probe's multiple of the measured
    capacity (the issue's 3-5x)."""

    warm_requests: int = 12
    capacity_requests: int = 64
    queue_seconds: float = 20.0  # arrivals of the overload probe
    min_queue_requests: int = 40
    overload: float = 4.0
    stage_requests: int = 120  # each stability stage
    cancel_after_chunks: int = 2
    nonstream_abandon_s: float = 1.0  # non-streaming give-up when no stream was cancelled
    free_within_s: float = 5.0  # cancelled work must be gone from the engine within this


class Memo:
    """A tokenizer that remembers its answers: every probe materialises its own requests,
    and each time the prompt maker asks the server the same ~1,000 /tokenize questions
    (`safe_token_ids`) - through a gateway that closes every connection, seconds each."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.name = tok.name
        self._enc: dict[str, list[int]] = {}
        self._dec: dict[tuple[int, ...], str] = {}

    def encode(self, text: str) -> list[int]:
        if text not in self._enc:
            self._enc[text] = self.tok.encode(text)
        return list(self._enc[text])

    def decode(self, ids: list[int]) -> str:
        key = tuple(ids)
        if key not in self._dec:
            self._dec[key] = self.tok.decode(ids)
        return self._dec[key]

    def vocab_size(self) -> int:
        return self.tok.vocab_size()


class Prober:
    """Measures probes against the deployment's first URL and keeps their run ids."""

    def __init__(
        self,
        dep: Deployment,
        *,
        db: str | None,
        study: str,
        say: Say,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.dep = dep
        self.say = say
        key = dep.api_keys[0] if dep.api_keys else None
        self.tokenizer = tokenizer or Memo(ServerTokenizer(server_root(dep.url), api_key=key))
        self.opts = BenchOptions(
            url=dep.url,
            api_key=key,
            model=dep.served_model,
            timeouts=Timeouts(10.0, 120.0, 60.0, 600.0),
            metrics_fetch=http_fetcher(dep.url, engine_adapter(dep.engine)),
            keep_text=False,
            breaker_error_rate=None,  # a deployment that sheds load answers 429 on purpose
            workers=1,
        )
        self.store = StoreSettings(
            db=db, kind="accept", study=study, tags=("accept",), meta=self._meta
        )
        self.cache: dict[str, list[Request]] = {}
        self.software: dict[str, Any] = {}
        self.lock = threading.Lock()

    def _meta(self) -> RunMeta:
        dep = self.dep
        if not self.software:
            self.software = software_info() | server_software(dep.url, self.opts.api_key)
        return RunMeta(
            model=dep.served_model,
            engine_config=dep.config.model_dump(mode="json")
            if dep.config
            else {"engine": dep.engine},
            software={"engine": dep.engine, **self.software},
            slo=dep.slo.model_dump(mode="json", exclude_none=True),
        )

    def requests(self, spec: WorkloadSpec) -> list[Request]:
        return ServerSession(self.opts, self.tokenizer, requests_cache=self.cache).requests(spec)

    def measure(
        self, label: str, spec: WorkloadSpec, requests: list[Request] | None = None, **opts: Any
    ) -> RunResult:
        """One probe through the seam; `opts` override the bench options (api_key,
        timeouts, cancel_fraction...). The run is stored as it is measured."""
        session = ServerSession(
            replace(self.opts, **opts), self.tokenizer, self.dep.slo, requests_cache=self.cache
        )
        store = replace(self.store, tags=("accept", f"accept:{label}"))
        res = sweep(session, [Point(label, spec, requests)], store=store)[0]
        if res.status == RunStatus.INTERRUPTED:  # Ctrl-C: sweep kept the part measured
            self.say(f"  {label}: interrupted (run {res.id} kept)")
            raise KeyboardInterrupt(f"interrupted during {label}")
        m = res.metrics
        self.say(
            f"  {label}: {m.completed} ok, {m.failed} failed, {m.req_s:.2f} req/s (run {res.id})"
        )
        return res

    def measure_together(
        self, probes: Sequence[tuple[str, WorkloadSpec, dict[str, Any]]]
    ) -> list[RunResult]:
        """Several probes at once, each through the seam in its own thread (two users
        with their own API keys at the same time)."""
        out: list[RunResult | BaseException | None] = [None] * len(probes)

        def one(k: int) -> None:
            label, spec, opts = probes[k]
            try:
                out[k] = self.measure(label, spec, **opts)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                out[k] = exc

        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(probes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in out:
            if isinstance(r, BaseException):
                raise r
        return [r for r in out if isinstance(r, RunResult)]

    def metrics(self) -> EngineMetrics | None:
        """One scrape of the engine's /metrics (canonical names); None when it has none."""
        try:
            return scrape(server_root(self.dep.url), self.dep.engine)
        except InputError:
            return None

    def wait_idle(self, since_ns: int, within_s: float, poll_s: float = 0.1) -> float | None:
        """Seconds from `since_ns` (monotonic) until the engine's running gauge reads 0,
        polled every `poll_s`; None when it is still busy after `within_s` or the engine
        has no such gauge (see `running_gauge`)."""
        deadline = time.monotonic() + within_s
        while True:
            m = self.metrics()
            running = m.get("requests_running") if m else None
            if running is None:
                return None
            if running == 0:
                return (time.monotonic_ns() - since_ns) / 1e9
            if time.monotonic() > deadline:
                return None
            time.sleep(poll_s)


def at_rate(spec: WorkloadSpec, rate: float, count: int, **arrival: Any) -> WorkloadSpec:
    """`spec` open loop at `rate` req/s, `count` requests, no cap on requests in flight
    (a workload read for sweeping carries a one-user placeholder that would cap it)."""
    data = spec.with_load(rate=rate, count=count).model_dump()
    data["arrival"] = {**data["arrival"], "concurrency": None, **arrival}
    return WorkloadSpec.model_validate(data)


def output_p99(requests: Sequence[Request]) -> int:
    return int(np.percentile([r.output_tokens or 0 for r in requests], 99))


def total_p99(requests: Sequence[Request]) -> int:
    """P99 of input + output tokens per request: the context one request needs."""
    return int(np.percentile([r.prompt_tokens + (r.output_tokens or 0) for r in requests], 99))


def workload_sample(prober: Prober, spec: WorkloadSpec, n: int = 400) -> list[Request]:
    """The real distribution, drawn once (seeded): what the limits are judged against."""
    return prober.requests(spec.with_load(concurrency=1, count=n))


def single(spec: WorkloadSpec, req: Request, *, stream: bool | None = None) -> WorkloadSpec:
    """A one-request point (closed loop, one user) for a hand-made request."""
    data = spec.with_load(concurrency=1, count=1).model_dump()
    data["warmup_s"] = data["cooldown_s"] = 0.0
    data["mix"] = data["mix"][:1]
    if stream is not None:
        data["stream"] = stream
    return WorkloadSpec.model_validate(data)


def materialize_one(tok: Tokenizer, spec: WorkloadSpec, prompt_tokens: int, out: int) -> Request:
    """One request of `prompt_tokens` (the workload's prompt style) asking for `out`."""
    data = spec.with_load(concurrency=1, count=1).model_dump()
    data["mix"] = [
        {
            "name": "probe",
            "input_tokens": {"dist": "fixed", "value": prompt_tokens},
            "output_tokens": {"dist": "fixed", "value": out},
        }
    ]
    return materialize(WorkloadSpec.model_validate(data), tok)[0]
