"""`accept` and `accept-shedder` refuse bad input in one line, exit 2, before any probe
runs or any port is served; a missing input leaves its item unchecked, not failed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from tests.cli_run import run_cli
from tests.test_accept import SLO, WORKLOAD  # the same small deployment checks

from servetune.accept import Acceptance, AcceptSettings, ProbeFailed, Sizes, probes
from servetune.accept.inputs import Deployment
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.slo import parse_slo
from servetune.workload.spec import parse_workload


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(code: int, err: str, field: str) -> None:
    assert code == 2 and err.startswith(f"error: {field}:") and err.count("\n") == 1, err


@pytest.mark.timeout(60)  # before the fix a bad upstream could be served forever
@pytest.mark.parametrize(
    ("upstream", "why"),
    [
        ("https://127.0.0.1:18102", "scheme 'https'"),
        ("ftp://x/y", "scheme 'ftp'"),
        ("http://127.0.0.1:18102/api", "path '/api'"),
        ("not a url", "no http:// scheme"),
        ("http://127.0.0.1:abc", "no valid port"),
        ("http://127.0.0.1:0", "no valid port"),
        ("http://127.0.0.1:18102/v1?x=1", "query"),
    ],
)
def test_the_shedder_refuses_an_upstream_it_cannot_honour(capsys, upstream: str, why: str):
    code, _, err = run_cli(
        capsys, "accept-shedder", "--upstream", upstream, "--max-in-flight", "2",
        "--port", str(_free_port()),
    )  # fmt: skip
    _one_line(code, err, "--upstream")
    assert why in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "flag", "why"),
    [  # one engine listed twice took twice the traffic; a per-key cap the front's binds
        # first never binds
        (["--upstream", "http://127.0.0.1:18102", "--upstream", "http://127.0.0.1:18102/v1",
          "--max-in-flight", "2"], "--upstream", "is given twice"),
        (["--upstream", "http://127.0.0.1:18102", "--max-in-flight", "2", "--per-key", "3"],
         "--per-key", "3 is above --max-in-flight 2: it never binds"),
    ],
)  # fmt: skip
def test_the_shedder_refuses_limits_that_cannot_hold(capsys, args, flag: str, why: str):
    code, _, err = run_cli(capsys, "accept-shedder", *args, "--port", str(_free_port()))
    _one_line(code, err, flag)
    assert why in err, err


@pytest.mark.timeout(60)
def test_the_shedder_names_port_when_it_is_in_use_or_out_of_range(capsys):
    up = "http://127.0.0.1:18102/v1"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = str(held.getsockname()[1])
        code, _, err = run_cli(capsys, "accept-shedder", "--upstream", up,
                               "--max-in-flight", "2", "--port", busy)  # fmt: skip
    _one_line(code, err, "--port")
    assert "in use" in err
    for port in ("99999", "0"):
        code, _, err = run_cli(capsys, "accept-shedder", "--upstream", up,
                               "--max-in-flight", "2", "--port", port)  # fmt: skip
        assert code == 2 and "'--port'" in err and "1<=x<=65535" in err and err.count("\n") == 1


@pytest.fixture()
def base(tmp_path: Path) -> list[str]:
    """An accept command line whose --url would answer: each refusal below must come
    before it is even reached (the port is free, so reaching it would name --url)."""
    (tmp_path / "wl.yaml").write_text(yaml.safe_dump(WORKLOAD))
    (tmp_path / "slo.yaml").write_text(yaml.safe_dump(SLO))
    url = f"http://127.0.0.1:{_free_port()}"
    wl, slo = str(tmp_path / "wl.yaml"), str(tmp_path / "slo.yaml")
    return ["accept", "--url", url, "--engine", "vllm", "--workload", wl, "--slo", slo]


@pytest.mark.parametrize(
    ("load", "why"),
    [
        ("rate=nan", "finite"),
        ("rate=inf", "finite"),
        ("rate=-inf", "finite"),
        ("concurrency=1.5", "whole number"),
        ("concurrency=nan", "whole number"),
    ],
)
def test_accept_refuses_a_load_it_cannot_run(capsys, base: list[str], load: str, why: str):
    code, _, err = run_cli(capsys, *base, "--load", load)
    _one_line(code, err, "--load")
    assert why in err and "pydantic" not in err


def test_accept_refuses_a_missing_autoscaling_file_or_model_path(capsys, base, tmp_path: Path):
    code, _, err = run_cli(capsys, *base, "--autoscaling", str(tmp_path / "nofile.yaml"))
    _one_line(code, err, "--autoscaling")
    assert "cannot read" in err
    (tmp_path / "bad.yaml").write_text("a: [\n")
    code, _, err = run_cli(capsys, *base, "--autoscaling", str(tmp_path / "bad.yaml"))
    _one_line(code, err, "--autoscaling")
    # YAML, but no autoscaler (a word, a list, empty): refused before the live checks
    for text in ("garbage\n", "[1, 2]\n", "", "---\nkind: HorizontalPodAutoscaler\n---\n- x\n"):
        (tmp_path / "word.yaml").write_text(text)
        code, _, err = run_cli(capsys, *base, "--autoscaling", str(tmp_path / "word.yaml"))
        _one_line(code, err, "--autoscaling")
        assert "holds no mapping" in err, err
    code, _, err = run_cli(capsys, *base, "--model-path", str(tmp_path / "no-weights"))
    _one_line(code, err, "--model-path")
    assert "does not exist" in err


def test_no_promised_output_cap_leaves_the_item_unchecked_not_failed(tmp_path: Path, monkeypatch):
    """Without --max-new-tokens there is no cap to hold the server to: the item is
    `cannot check here` naming the flag (a fail would alone make the exit code 1)."""

    def stop(*_a, **_k):
        raise RuntimeError("stop after the output-cap item")

    monkeypatch.setattr(probes, "input_limit", stop)  # the item after output-cap
    out = tmp_path / "checklist.json"
    sizes = Sizes(warm_requests=6, capacity_requests=8, queue_seconds=2.0,
                  min_queue_requests=16, stage_requests=8)  # fmt: skip
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=1)) as srv:
        dep = Deployment([f"http://127.0.0.1:{srv.port}"], "vllm", "mock", None,
                         parse_slo(SLO), parse_workload(WORKLOAD, swept=True))  # fmt: skip
        settings = AcceptSettings(db=f"sqlite:///{tmp_path / 's.db'}", study="acc",
                                  output=out, sizes=sizes)  # fmt: skip
        with pytest.raises(ProbeFailed):
            Acceptance(dep, settings, say=lambda m: None).run()
    item = next(i for i in json.loads(out.read_text())["items"] if i["id"] == "output-cap")
    assert item["status"] == "cannot check here" and "--max-new-tokens" in item["fix"]
    assert not item["runs"]  # nothing was sent for it
