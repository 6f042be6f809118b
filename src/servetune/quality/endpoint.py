"""Talking to one endpoint: tokenize, score a passage's tokens, continue greedily.

Two engines expose what perplexity needs, each in its own way:
- vLLM: `prompt_logprobs` in /v1/completions returns, for every prompt token after the
  first, its log-probability given the tokens before it (vLLM docs, "Sampling Parameters").
- llama.cpp's server (b11434) has no prompt logprobs: `n_probs` reports the log-probability
  of each *generated* token from the raw logits (tools/server/README.md, /completion). So
  each passage token is scored by generating exactly that token: the prefix as token ids,
  `n_predict: 1`, and a `logit_bias` that forces the wanted id; the reported `logprob` is
  taken before sampling (`post_sampling_probs` off), so the bias does not change it. The
  slot's prompt cache makes each step one prefill token plus one decode.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from servetune.accept.static import WEIGHT_SUFFIXES
from servetune.bench.http import server_root
from servetune.errors import InputError
from servetune.http_retry import post_twice

# The forcing bias: logits of a small LM span tens of nats; +1e4 makes the wanted token the
# only choice without overflowing float32.
FORCE_BIAS = 1e4
LLAMA_B4000 = "llama.cpp b4000 or later reports forced-token logprobs"


@dataclass
class Endpoint:
    """One OpenAI-compatible server that `quality` scores."""

    url: str
    engine: str  # "vllm" or "llamacpp"
    model: str | None
    weights: str | None  # where the server says its weights come from
    timeout_s: float = 120.0
    flag: str = "--url"  # the option that named it: what an error line points at

    def __post_init__(self) -> None:
        self.base = server_root(self.url)
        self._http = httpx.Client(base_url=self.base, timeout=self.timeout_s)

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One scoring request; deterministic and read-only, so a dropped kept-alive
        connection sends it once more (`post_twice`): nothing measured is lost to that."""
        try:
            r = post_twice(self._http, path, body)
        except httpx.HTTPError as exc:
            raise InputError(
                self.flag, f"{self.url} stopped answering ({type(exc).__name__})", "is it up?"
            ) from None
        if r.status_code != 200:
            raise InputError(
                self.flag, f"{self.url}{path} answered {r.status_code}: {r.text[:200]}"
            )
        with _odd_reply(self.flag, f"{self.url}{path}", "JSON", r.text):
            return r.json()

    def tokenize(self, text: str) -> list[int]:
        """The prompt's token ids, BOS included where the model adds one."""
        if self.engine == "llamacpp":
            reply = self._post("/tokenize", {"content": text, "add_special": True})
        else:
            reply = self._post("/tokenize", {"model": self.model, "prompt": text})
        with _odd_reply(self.flag, f"{self.url}/tokenize", "token ids", reply):
            return [int(t) for t in reply["tokens"]]

    def token_logprobs(self, tokens: list[int]) -> list[float]:
        """log p(token_i | tokens before it) for i >= 1."""
        if self.engine == "vllm":
            body = {
                "model": self.model,
                "prompt": tokens,
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": 0,
            }
            reply = self._post("/v1/completions", body)
            with _odd_reply(self.flag, f"{self.url}/v1/completions", "prompt logprobs", reply):
                scored = reply["choices"][0]["prompt_logprobs"]
                return [
                    float(d[str(t)]["logprob"]) for d, t in zip(scored[1:], tokens[1:], strict=True)
                ]
        out = []
        for i in range(1, len(tokens)):
            body = {
                "prompt": tokens[:i],
                "n_predict": 1,
                "temperature": 0,
                "n_probs": 1,
                "logit_bias": [[tokens[i], FORCE_BIAS]],
                "cache_prompt": True,
            }
            reply = self._post("/completion", body)
            with _odd_reply(
                self.flag, f"{self.url}/completion", "token logprobs", reply, LLAMA_B4000
            ):
                p = reply["completion_probabilities"][0]
                forced, logprob = p["id"], float(p["logprob"])
            if forced != tokens[i]:
                raise InputError(self.flag, f"{self.url} did not honour logit_bias", LLAMA_B4000)
            out.append(logprob)
        return out

    def greedy(self, prompt: str, n_tokens: int) -> tuple[list[int | str], str]:
        """The temperature-0 continuation: its token ids and text."""
        if self.engine == "llamacpp":
            body = {
                "prompt": prompt,
                "n_predict": n_tokens,
                "temperature": 0,
                "return_tokens": True,
                "cache_prompt": True,
            }
            r = self._post("/completion", body)
            with _odd_reply(self.flag, f"{self.url}/completion", "continuation", r):
                return list(r.get("tokens") or []), str(r.get("content", ""))
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": n_tokens,
            "temperature": 0,
            "return_token_ids": True,  # vLLM >= 0.10.2; older ones: the logprobs' tokens
            "logprobs": 0,
        }
        reply = self._post("/v1/completions", body)
        with _odd_reply(self.flag, f"{self.url}/v1/completions", "continuation", reply):
            c = reply["choices"][0]
            ids = c.get("token_ids") or (c.get("logprobs") or {}).get("tokens") or []
            return list(ids), str(c.get("text", ""))


def connect(url: str, flag: str, timeout_s: float = 5.0) -> Endpoint:
    """The endpoint at `url`, its engine and where its weights come from; one line (exit 2)
    when nothing answers or the engine cannot report logprobs."""
    if "://" not in url or not url.split("://", 1)[1]:
        raise InputError(flag, f"{url!r} is not a URL", "e.g. http://127.0.0.1:8080")
    base = server_root(url)
    try:
        reply = httpx.get(f"{base}/v1/models", timeout=timeout_s).json()
    except httpx.InvalidURL as exc:  # not an HTTPError: e.g. 'http://[::1'
        raise InputError(
            flag, f"{url!r} is not a URL ({exc})", "e.g. http://127.0.0.1:8080"
        ) from None
    except (httpx.HTTPError, ValueError) as exc:
        raise InputError(
            flag, f"{url} is unreachable ({type(exc).__name__})", "start the server or fix the URL"
        ) from None
    with _odd_reply(flag, f"{base}/v1/models", "model list", reply):
        served = (reply.get("data") or [{}])[0]
        model, root = served.get("id"), served.get("root")
    props = _get_json(f"{base}/props", timeout_s)
    if props and "build_info" in props:
        return Endpoint(url, "llamacpp", model, props.get("model_path"), flag=flag)
    if _get_json(f"{base}/version", timeout_s) is not None:
        return Endpoint(url, "vllm", model, root, flag=flag)
    raise InputError(
        flag,
        f"{url} is neither vLLM nor llama.cpp's server",
        "quality needs prompt logprobs: serve the model with vLLM or llama.cpp",
    )


def _get_json(url: str, timeout_s: float) -> dict[str, Any] | None:
    """The JSON object at `url`, or None (not there, not JSON, not an object)."""
    try:
        r = httpx.get(url, timeout=timeout_s)
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


# What an odd reply can raise while it is read: a field missing (KeyError), null or of
# another type (TypeError, AttributeError), a list too short (IndexError), not JSON or
# not a number (ValueError, JSONDecodeError among them).
_ODD = (KeyError, TypeError, AttributeError, IndexError, ValueError)


@contextmanager
def _odd_reply(
    flag: str, where: str, what: str, reply: object, fix: str | None = None
) -> Iterator[None]:
    """Reading a server's `reply`: one whose shape is not the one expected becomes one line
    naming the flag (`--candidate: URL returned no prompt logprobs (...)`) and showing what
    came instead (an error object's message, a null), not a traceback from the parsing."""
    try:
        yield
    except _ODD as exc:
        got = reply if isinstance(reply, str) else json.dumps(reply, default=str)
        raise InputError(
            flag,
            f"{where} returned no {what} ({type(exc).__name__}: {exc}; got {got[:120]})",
            fix or "serve the model with vLLM or llama.cpp's server (see docs/quality.md)",
        ) from None


def random_weights(weights: str | None) -> str | None:
    """Why the served weights are random, or None. vLLM's `--load-format dummy` serves a
    config directory that holds no weight files (the generated test model); nothing else
    can be loaded from such a directory."""
    if not weights:
        return None
    p = Path(weights)
    if p.is_dir() and not any(f.suffix in WEIGHT_SUFFIXES for f in p.rglob("*") if f.is_file()):
        return (
            f"{weights} holds no weight files: the server runs random weights "
            "(--load-format dummy), so no quality verdict"
        )
    return None
