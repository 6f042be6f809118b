"""The compiled mock (`servetune.mock.fast`, the client-ceiling benchmark's server) answers
as an OpenAI-compatible server does, by the Python mock's rule (`answer_length`): what
ended each answer, streamed or not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from servetune.mock.fast import build, command
from servetune.mock.server import answer_length, request_cap


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build(tmp_path_factory.mktemp("fastmock"))
    if built is None:
        pytest.skip("no C compiler here")
    return Path(built)


@pytest.fixture(scope="module", params=[5, None], ids=["own-length-5", "no-own-length"])
def fastmock(exe: Path, request: pytest.FixtureRequest):
    own = request.param
    proc = subprocess.Popen(
        command(exe, ttft_ms=1, itl_ms=0.2, output_tokens=own), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()[-1], own
    finally:
        proc.terminate()
        proc.wait(5)


def _finish(url: str, body: dict) -> tuple[int, str]:
    """(completion tokens or content chunks, finish_reason) of one answer."""
    with httpx.Client(timeout=10) as c:
        if not body.get("stream"):
            r = c.post(f"{url}/v1/completions", json=body).json()
            return r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]
        reasons, chunks = [], 0
        with c.stream("POST", f"{url}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    chunks += 1
                    reasons.append(choice["finish_reason"])
        assert all(x is None for x in reasons[:-1])
        return chunks, reasons[-1]


CAPS = [{"max_tokens": 7}, {"max_tokens": 3}, {"max_completion_tokens": 4}, {}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("cap", CAPS, ids=["max7", "max3", "maxc4", "none"])
def test_answers_by_the_python_mocks_rule(
    fastmock: tuple[str, int | None], cap: dict, stream: bool
):
    url, own = fastmock
    body = {"prompt": "hi", "stream": stream, **cap}
    assert _finish(url, body) == answer_length(own, request_cap(body))


def test_the_rule_by_hand() -> None:
    # the model's own end before the cap: "stop"; the cap first: "length" at the cap
    assert answer_length(5, 7) == (5, "stop")
    assert answer_length(5, 3) == (3, "length")
    assert answer_length(5, 5) == (5, "length")
    assert answer_length(5, None) == (5, "stop")
    assert answer_length(None, 7) == (7, "length")
    assert answer_length(None, None) == (16, "stop")
    assert request_cap({"max_completion_tokens": 4, "max_tokens": 9}) == 4
    assert request_cap({"max_tokens": "x"}) is None and request_cap({"max_tokens": 0}) is None
