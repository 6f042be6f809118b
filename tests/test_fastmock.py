"""The compiled mock (`servetune.mock.fast`, the client-ceiling benchmark's server) answers
as an OpenAI-compatible server does: what ended each answer, streamed or not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from servetune.mock.fast import build, command


@pytest.fixture(scope="module")
def fastmock(tmp_path_factory: pytest.TempPathFactory):
    exe = build(tmp_path_factory.mktemp("fastmock"))
    if exe is None:
        pytest.skip("no C compiler here")
    proc = subprocess.Popen(
        command(Path(exe), ttft_ms=1, itl_ms=0.2, output_tokens=5),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()[-1]
    finally:
        proc.terminate()
        proc.wait(5)


def _finish(url: str, body: dict) -> tuple[str, int]:
    """(finish_reason, content chunks or completion tokens) of one answer."""
    with httpx.Client(timeout=10) as c:
        if not body.get("stream"):
            r = c.post(f"{url}/v1/completions", json=body).json()
            return r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
        reasons, chunks = [], 0
        with c.stream("POST", f"{url}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    chunks += 1
                    reasons.append(choice["finish_reason"])
        assert all(x is None for x in reasons[:-1])
        return reasons[-1], chunks


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream", [True, False])
def test_length_at_max_tokens_and_stop_at_its_own_end(fastmock: str, stream: bool) -> None:
    capped = {"prompt": "hi", "max_tokens": 7, "stream": stream}
    assert _finish(fastmock, capped) == ("length", 7)
    # no max_tokens: --output-tokens (5) is the model's own end, not a length limit
    assert _finish(fastmock, {"prompt": "hi", "stream": stream}) == ("stop", 5)
