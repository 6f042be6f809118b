"""One streamed /v1/completions call against a real engine, for the engine tests that
check it streams (llama.cpp's and vLLM's)."""

from __future__ import annotations

import json

import httpx


def stream_completion(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """The text chunks and the server's usage of one streamed completion, greedy and run to
    `max_tokens`. A fresh connection closed after the answer: llama-server closes it anyway."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[str] = []
    usage: dict = {}
    headers = {"Connection": "close"}
    with httpx.stream(
        "POST", url + "/v1/completions", json=body, timeout=120, headers=headers
    ) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    chunks.append(choice["text"])
    return {"chunks": chunks, "usage": usage}
