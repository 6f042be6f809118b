"""`servetune accept` and its front on what a bug hunt found: a Ctrl-C inside a probe, a
server gone between items, a deployment that refuses everything with 429, an over-limit
prompt served whole, output caps the front let through, autoscalers on GPU utilisation
under other names, a stage trusting a cap the server did not hold, simulated runs as
linked data. Every probe here runs against the mock (short, bounded)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from servetune.accept import Acceptance, AcceptSettings, ProbeFailed, Sizes, probes, static
from servetune.accept import run as accept_run
from servetune.accept import stability as stab
from servetune.accept.checklist import Status, failed, passed
from servetune.accept.inputs import Deployment
from servetune.accept.measuring import Prober
from servetune.accept.shedder import cap_tokens, shedder_in_thread
from servetune.bench.runner import BenchInterrupted
from servetune.engines.config import EngineConfig
from servetune.measure import real
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.slo import parse_slo
from servetune.status import RunStatus
from servetune.store import Store
from servetune.workload.spec import parse_workload

WORKLOAD = {
    "name": "chat-small",
    "api": "completions",
    "count": 20,
    "input_tokens": {"dist": "uniform", "low": 16, "high": 48},
    "output_tokens": {"dist": "uniform", "low": 8, "high": 16},
}
SLO = {"ttft_ms": {"p99": 3000}, "tpot_ms": {"p95": 500}}
TINY = Sizes(warm_requests=6, capacity_requests=8, queue_seconds=2.0, min_queue_requests=16,
             stage_requests=8)  # fmt: skip
ALL_429 = MockConfig(ttft_ms=5, itl_ms=1, faults={"http_429": 1.0})


def _dep(url: str, **kw) -> Deployment:
    return Deployment([url], "vllm", "mock", kw.pop("config", None), parse_slo(SLO),
                      parse_workload(WORKLOAD, swept=True), **kw)  # fmt: skip


def _acceptance(tmp_path: Path, url: str, **kw) -> Acceptance:
    s = AcceptSettings(db=f"sqlite:///{tmp_path / 's.db'}", study="acc",
                       output=tmp_path / "checklist.json", sizes=TINY)  # fmt: skip
    return Acceptance(_dep(url, **kw), s, say=lambda m: None)


def _prober(tmp_path: Path, url: str, **kw) -> Prober:
    return Prober(_dep(url, **kw), db=f"sqlite:///{tmp_path / 's.db'}", study="t",
                  say=lambda m: None)  # fmt: skip


def _went_on(*_a, **_k):
    raise RuntimeError("the run went on past the break")


# -- 1, 3: a probe or a shared step that breaks off ----------------------------------


@pytest.mark.timeout(120)
def test_ctrl_c_inside_a_probe_stops_the_run_naming_it(tmp_path: Path, monkeypatch):
    """sweep turns Ctrl-C into a result with status interrupted; the run once judged that
    cut probe (`None run stopped: interrupted`) and went on for minutes."""
    real_point = real.run_point

    def cut(spec, requests, opts, slo, label):
        res = real_point(spec, requests, opts, slo, label)
        if label == "warmup":  # Ctrl-C as the warm-up's requests finish
            res.status = RunStatus.INTERRUPTED
            raise BenchInterrupted(res)
        return res

    monkeypatch.setattr(real, "run_point", cut)
    monkeypatch.setattr(probes, "monitoring", _went_on)  # bounded if it does not stop
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=1)) as srv:
        acc = _acceptance(tmp_path, f"http://127.0.0.1:{srv.port}")
        with pytest.raises(ProbeFailed) as exc:
            acc.run()
    assert (exc.value.item, exc.value.reason) == ("warmup-before-traffic", "interrupted")
    saved = json.loads((tmp_path / "checklist.json").read_text())
    status = {i["id"]: i["status"] for i in saved["items"]}
    assert status["warmup-before-traffic"] == "not run"  # not judged on a cut run
    assert status["model-pinned"] == "cannot check here"  # what was done stays saved
    assert "warmup-before-traffic broke off: interrupted" in saved["notes"]
    with Store.open(acc.s.db) as store:  # the part measured is kept
        kept = store.list_runs(tag="accept:warmup")
    assert len(kept) == 1 and kept[0].n_records == TINY.warm_requests


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "name", "step"),
    [
        (probes, "monitoring", "monitoring"),
        (accept_run, "workload_sample", "workload-sample"),
        (probes, "capacity", "capacity"),
    ],
)
def test_a_server_gone_between_items_saves_the_checklist_and_names_the_step(
    tmp_path: Path, monkeypatch, where, name, step
):
    """The steps several items share ran outside the items' guard: a refused connection
    there was a traceback, and the saved checklist had no note of where it broke."""

    def gone(*_a, **_k):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    monkeypatch.setattr(where, name, gone)
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=1)) as srv:
        acc = _acceptance(tmp_path, f"http://127.0.0.1:{srv.port}")
        with pytest.raises(ProbeFailed) as exc:
            acc.run()
    assert exc.value.item == step and "Connection refused" in exc.value.reason
    saved = json.loads((tmp_path / "checklist.json").read_text())
    assert f"{step} broke off: [Errno 111] Connection refused" in saved["notes"]
    status = {i["id"]: i["status"] for i in saved["items"]}
    assert status["warmup-before-traffic"] != "not run"
    with Store.open(acc.s.db) as store:
        assert store.study_meta("acc")["checklist"]["notes"] == saved["notes"]


# -- 2: a deployment that refuses every request with 429 ------------------------------


@pytest.mark.timeout(180)
def test_a_deployment_refusing_everything_passes_no_limit_and_runs_no_stage(tmp_path: Path):
    """Every request 429: the queue bound, the output cap and the input limit all passed,
    and a measured capacity of 0 ran the stages at 0.1 req/s (hours)."""
    cfg = EngineConfig(engine="vllm", max_model_len=256)
    with mock_in_thread(ALL_429) as srv:
        acc = _acceptance(tmp_path, f"http://127.0.0.1:{srv.port}", config=cfg,
                          max_new_tokens=8)  # fmt: skip
        items = acc.run().items
    queue = items["queue-bound"]
    assert queue.status == Status.FAIL and "served no request" in queue.evidence[0]
    for item in ("output-cap", "input-limit"):
        it = items[item]
        assert it.status == Status.UNCHECKED, (item, it.evidence)
        assert "HTTP 429" in (it.fix or "") and it.runs
    st = items["stability-stage"]
    assert st.status == Status.UNCHECKED and "--load" in (st.fix or "")
    assert "no load to size the stages by" in st.evidence[0]
    with Store.open(acc.s.db) as store:
        assert not [r for r in store.list_runs(study="acc") if "stage" in " ".join(r.tags)]


@pytest.mark.timeout(60)
def test_a_bound_that_serves_nothing_fails_the_queue_item(tmp_path: Path, monkeypatch):
    with mock_in_thread(ALL_429) as srv:
        p = _prober(tmp_path, f"http://127.0.0.1:{srv.port}")
        f = probes.queue_bound(p, p.dep.workload, probes.Capacity(10.0, 1, "cap"), TINY)
        assert f.status == Status.FAIL and f.values["served"] == 0 and f.values["shed"] > 0
        assert "refused everything" in (f.fix or "")
        # no capacity measured: nothing is sent (it once sent 40 requests at 0.4 req/s)
        monkeypatch.setattr(p, "measure", _went_on)
        zero = probes.queue_bound(p, p.dep.workload, probes.Capacity(0.0, 4, "cap"), TINY)
    assert zero.status == Status.FAIL and zero.runs == ["cap"]


# -- 5: an over-limit prompt served whole ---------------------------------------------


@pytest.mark.timeout(60)
def test_an_over_limit_prompt_served_whole_fails_the_input_limit(tmp_path: Path):
    """The mock serves any prompt and reports its usage: 2,112 prompt tokens served under
    a 2,048 limit is a server that does not enforce max_model_len, not a truncation."""
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=1)) as srv:
        p = _prober(tmp_path, f"http://127.0.0.1:{srv.port}")
        sample = p.requests(p.dep.workload.with_load(concurrency=1, count=20))
        f = probes.input_limit(p, p.dep.workload, sample, 2048)
    assert f.status == Status.FAIL and "does not enforce max_model_len" in (f.fix or "")
    assert f.values["served_prompt_tokens"] == 2112 and "served whole" in f.evidence[1]


# -- 4, 12: the front ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "capped"),
    [
        ({"max_tokens": -1}, {"max_tokens": 64}),  # llama.cpp: -1 = unlimited
        ({"n_predict": -1}, {"n_predict": 64}),
        ({"max_tokens": 0, "n_predict": None}, {"max_tokens": 64, "n_predict": 64}),
        ({"max_completion_tokens": 1000.0}, {"max_completion_tokens": 64}),
        ({"max_completion_tokens": "1000"}, {"max_completion_tokens": 64}),  # vLLM coerces it
        ({"max_tokens": 10.0, "min_tokens": 1e9}, {"max_tokens": 10, "min_tokens": 64}),
    ],
)
def test_the_front_caps_an_ask_for_no_bound_or_a_number_in_another_type(asked, capped):
    assert json.loads(cap_tokens(json.dumps(asked).encode(), 64)) == capped


@pytest.mark.parametrize(
    ("path", "asked", "capped"),
    [
        ("/v1/responses", {"input": "x", "max_output_tokens": 500}, {"max_output_tokens": 64}),
        ("/v1/responses", {"input": "x"}, {"max_output_tokens": 64}),  # none asked: set
        ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 500}},
         {"parameters": {"max_new_tokens": 64}}),
        ("/generate_stream", {"inputs": "x"}, {"parameters": {"max_new_tokens": 64}}),
        ("/generate", {"inputs": "x", "parameters": "odd"}, {"parameters": "odd"}),  # engine's
    ],
)  # fmt: skip
def test_the_front_caps_the_responses_api_and_tgis_native_fields(path, asked, capped):
    """The Responses API's `max_output_tokens` and TGI's `parameters.max_new_tokens`
    went to the engine as asked (the OpenAI fields were set beside them, read by no one)."""
    out = json.loads(cap_tokens(json.dumps(asked).encode(), 64, path))
    assert {k: v for k, v in out.items() if k in capped} == capped
    assert not set(out) - set(asked) - set(capped)  # no OpenAI field added beside


class _Upstream(BaseHTTPRequestHandler):
    """Records each request's path and body; a generation waits for `hold` (to be in
    flight while the test sends the next)."""

    seen: list[tuple[str, dict]] = []
    hold = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        type(self).seen.append((self.path, body))
        if "/tokenize" not in self.path:
            type(self).hold.wait(10)
        data = b'{"choices":[{"text":"x"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_a) -> None:
        pass


@pytest.fixture()
def upstream():
    _Upstream.seen, _Upstream.hold = [], threading.Event()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    _Upstream.hold.set()
    srv.shutdown()
    srv.server_close()


LLAMA_ASK = ({"prompt": "x", "n_predict": -1}, {"prompt": "x", "n_predict": 8})
TGI_ASK = ({"inputs": "x", "parameters": {"max_new_tokens": 99}},
           {"inputs": "x", "parameters": {"max_new_tokens": 8}})  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("path", "ask"),
    [("/completion", LLAMA_ASK), ("/v1/chat/completions?api-version=1", LLAMA_ASK),
     ("/v1/chat%2Fcompletions", LLAMA_ASK), ("/generate_stream", TGI_ASK)],
)  # fmt: skip
def test_the_front_caps_and_counts_every_generation_path(upstream: str, path: str, ask):
    """llama.cpp's native /completion and a path with a query went through uncapped and,
    for /completion, uncounted toward --max-in-flight; TGI's /generate_stream uncapped."""
    with (
        shedder_in_thread(upstream, max_in_flight=1, max_tokens=8) as (url, sh),
        httpx.Client(base_url=url, timeout=20) as client,
    ):
        first = threading.Thread(target=client.post, args=(path,),
                                 kwargs={"json": ask[0]})  # fmt: skip
        first.start()
        for _ in range(200):  # until the first is in flight upstream
            if _Upstream.seen:
                break
            threading.Event().wait(0.02)
        second = client.post(path, json={"prompt": "y", "max_tokens": 100})
        tok = client.post("/tokenize", json={"content": "x"})  # generates nothing: not counted
        _Upstream.hold.set()
        first.join(20)
    assert second.status_code == 429 and sh.shed == 1
    assert tok.status_code == 200
    assert _Upstream.seen[0][1] == ask[1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("length", ["abc", "-5"])
def test_a_content_length_that_is_no_number_gets_400_not_a_crash(upstream: str, length: str):
    with shedder_in_thread(upstream, max_in_flight=2) as (url, sh):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Length: {length}\r\n\r\n{{}}".encode())  # fmt: skip
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"Content-Length" in answer.split(b"\r\n\r\n", 1)[1] and sh.in_flight == 0


# -- 6, 8: static items -----------------------------------------------------------------


@pytest.mark.parametrize(
    "metric",
    [
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "nvidia_smi_utilization_gpu_ratio",
        'avg(DCGM_FI_PROF_SM_ACTIVE{pod=~"queue-worker.*"})',  # a label value is no metric
    ],
)
def test_gpu_utilisation_under_any_name_is_no_scaling_signal(tmp_path: Path, metric: str):
    trigger = {"type": "prometheus", "metadata": {"query": metric}}
    keda = {"kind": "ScaledObject", "spec": {"triggers": [trigger]}}
    (tmp_path / "keda.yaml").write_text(yaml.safe_dump(keda))
    f = static.autoscaling_signals(tmp_path / "keda.yaml")
    assert f.status == Status.FAIL and "seed 003 §11" in (f.fix or ""), f.evidence


def test_cpu_alone_is_no_scaling_signal_and_the_engines_queue_is(tmp_path: Path):
    def hpa(*metrics: dict) -> Path:
        doc = {"kind": "HorizontalPodAutoscaler", "spec": {"metrics": list(metrics)}}
        (tmp_path / "hpa.yaml").write_text(yaml.safe_dump(doc))
        return tmp_path / "hpa.yaml"

    cpu = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}
    assert static.autoscaling_signals(hpa(cpu)).status == Status.FAIL
    kv = {"type": "External", "external": {"metric": {"name": "vllm:gpu_cache_usage_perc"}}}
    f = static.autoscaling_signals(hpa(cpu, kv))
    assert f.status == Status.PASS and f.values["signals"] == ["vllm:gpu_cache_usage_perc"]
    assert "KV cache use" in f.evidence[1]


def test_only_real_runs_link_a_config_to_data():
    """A `tune --backend sim` study's runs measured the simulator, not the deployment."""
    from types import SimpleNamespace

    cfg = EngineConfig(engine="vllm", max_num_seqs=16)
    sim = SimpleNamespace(id="sim-1", backend="sim", tags=[], metrics={"req_s": 1.0},
                          engine_config=cfg.model_dump(mode="json"))  # fmt: skip
    assert static.config_linked(cfg, [sim]).status == Status.FAIL
    measured = SimpleNamespace(**{**vars(sim), "id": "real-1", "backend": "real"})
    ok = static.config_linked(cfg, [sim, measured])
    assert ok.status == Status.PASS and ok.runs == ["real-1"]


# -- 7: a cap the server did not hold ---------------------------------------------------


@pytest.mark.timeout(120)
def test_the_stages_trust_no_cap_the_server_did_not_hold(tmp_path: Path, monkeypatch):
    """output-cap failed (the server generated 32 tokens past a cap of 8), yet the stage
    skipped long outputs as `capped at 8 tokens`. (A cap that passed still bounds them:
    test_accept.py's end-to-end run behind the front.)"""
    seen: dict[str, int | None] = {}

    def stage(p, spec, tuned, sample, limit, cap, sizes, fault=None):
        seen["cap"] = cap
        raise RuntimeError("stop after the stage is planned")

    verdict = failed("cap it", "the server generated 32 tokens")
    monkeypatch.setattr(probes, "output_cap", lambda *a: verdict)
    for name in ("queue_bound", "cancellation", "per_user"):
        monkeypatch.setattr(probes, name, lambda *a: passed("skipped here"))
    monkeypatch.setattr(stab, "run_stage", stage)
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=1)) as srv:
        acc = _acceptance(tmp_path, f"http://127.0.0.1:{srv.port}", max_new_tokens=8)
        with pytest.raises(ProbeFailed, match="stop after the stage is planned"):
            acc.run()
    assert seen["cap"] is None
