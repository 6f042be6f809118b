"""`servetune accept` against the real engines as the tests launch them: bare vLLM-CPU
fails the items it has no answer for (no queue bound, no output cap); llama.cpp behind
the load-shedding front, which bounds the queue and caps the output, passes them. (The
llama.cpp build here lets a request's own n_predict override the server's `-n`, so
`-n` alone is no cap: the accept run says so.) Run one at a time with the other timed
engine tests (scripts/run.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.cli_run import run_cli

from servetune.accept import probes
from servetune.accept.inputs import Deployment
from servetune.accept.measuring import Prober
from servetune.accept.shedder import shedder_in_thread
from servetune.engines.config import EngineConfig
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG, VLLM_TEST_CONFIG
from servetune.slo import parse_slo
from servetune.workload.spec import parse_workload

pytestmark = [pytest.mark.engine]

WORKLOAD = {
    "name": "short-completions",
    "api": "completions",
    "count": 20,
    "input_tokens": {"dist": "uniform", "low": 16, "high": 48},
    "output_tokens": {"dist": "uniform", "low": 8, "high": 16},
}
# Loose enough for a busy 2-core host: the stages are judged, the test asserts the items
# whose outcome the deployment's design decides (queue bound, output cap).
SLO = {"ttft_ms": {"p99": 30000}, "tpot_ms": {"p95": 3000}}
CAP = 32  # the output cap the deployment promises (--max-new-tokens)
# Requests per stability stage: accept's least (4). The stages are judged and recorded,
# but no assertion here reads their verdict, and 6 stages of 10 took most of the run.
STAGE = 4


def _files(tmp_path: Path, cfg: EngineConfig) -> list[str]:
    knobs = cfg.model_dump(mode="json", exclude_defaults=True)
    knobs.pop("engine", None)
    for name, data in (("wl", WORKLOAD), ("slo", SLO), ("cfg", knobs)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return [
        "--workload", str(tmp_path / "wl.yaml"), "--slo", str(tmp_path / "slo.yaml"),
        "--config", str(tmp_path / "cfg.yaml"), "--quick", "--requests", str(STAGE),
        "--max-new-tokens", str(CAP), "--json", "-o", str(tmp_path / "checklist.json"),
    ]  # fmt: skip


def _items(out: str) -> dict[str, dict]:
    data = json.loads(out)
    items = {i["id"]: i for i in data["items"]}
    assert len(items) == 23
    assert all(i["status"] != "not run" and (i["evidence"] or i["fix"]) for i in items.values())
    return items


@pytest.mark.timeout(600)
def test_bare_vllm_fails_the_queue_bound_and_the_output_cap(vllm_server, capsys, tmp_path):
    args = _files(tmp_path, VLLM_TEST_CONFIG)
    code, out, err = run_cli(capsys, "accept", "--url", vllm_server.url, "--engine", "vllm", *args)
    items = _items(out)
    assert code == 1, err
    cap, queue = items["output-cap"], items["queue-bound"]
    assert cap["status"] == "fail" and cap["values"]["got"] > CAP
    assert queue["status"] == "fail" and queue["values"]["shed"] == 0 and queue["runs"]
    assert items["latency-monitored"]["status"] == "pass"  # vLLM's TTFT/ITL/queue histograms
    assert items["input-limit"]["status"] == "pass"  # 2,048 >> the workload's P99
    cancel = items["cancel-frees-work"]
    assert cancel["values"], cancel
    # unchecked only when the host kept the client from giving up (a one-core hog once
    # made a 0.08 s patience fire 2.9 s in): said so, never blamed on vLLM
    assert cancel["status"] in ("pass", "fail") or "host was too busy" in cancel["fix"], cancel
    print(json.dumps({k: (v["status"], v["evidence"]) for k, v in items.items()}, indent=1))


@pytest.mark.timeout(600)
def test_llamacpp_capped_behind_the_shedder_passes_them(
    llamacpp_install, gemma_gguf, capsys, tmp_path
):
    from servetune.engines.process import launch

    cfg = LLAMACPP_TEST_CONFIG.model_copy(update={"extra_args": ("-n", str(CAP))})
    args = _files(tmp_path, cfg)
    # in all, the slots and twice as many waiting; per API key, one more than the capacity
    # probe's users (a user's next request can come before its last is counted out)
    slots = cfg.parallel_slots or 1
    bound, per_key = 3 * slots, slots + 1
    with (
        launch("llamacpp", cfg, str(gemma_gguf), device="cpu") as srv,
        shedder_in_thread(srv.url, bound, per_key=per_key, max_tokens=CAP) as (url, sh),
    ):
        code, _, err = run_cli(capsys, "accept", "--url", srv.url, "--engine", "vllm", *args)
        assert code == 2 and "served by llamacpp, not vllm" in err  # wrong engine: one line
        # -n alone: this build lets the request's own max_tokens override it
        bare = Deployment([srv.url], "llamacpp", None, cfg, parse_slo(SLO),
                          parse_workload(WORKLOAD, swept=True))  # fmt: skip
        p = Prober(bare, db=f"sqlite:///{tmp_path / 'bare.db'}", study="bare", say=lambda m: None)
        uncapped = probes.output_cap(p, bare.workload, CAP)
        assert uncapped.status == "fail" and uncapped.values["got"] > CAP, uncapped.evidence
        code, out, err = run_cli(capsys, "accept", "--url", url, "--engine", "llamacpp",
                                 "--model-path", str(gemma_gguf), "--api-key", "user-a",
                                 "--api-key", "user-b", *args)  # fmt: skip
    items = _items(out)
    cap, queue = items["output-cap"], items["queue-bound"]
    assert cap["status"] == "pass" and cap["values"]["got"] <= CAP, cap
    assert queue["status"] == "pass" and queue["values"]["shed"] > 0 and sh.shed > 0, queue
    assert items["per-user-limits"]["status"] == "pass", items["per-user-limits"]
    assert items["model-pinned"]["status"] == "pass"  # the GGUF's bytes hashed
    assert items["stack-pinned"]["status"] == "pass"  # llama.cpp's build_info
    print(json.dumps({k: (v["status"], v["evidence"]) for k, v in items.items()}, indent=1))
