"""One OpenAI-compatible request in flight: SSE parsing, per-chunk timing, timeouts.

`RequestState` is the response handler of `http.Connection`. Chunk arrival times are the
`data_received` stamps (taken before parsing). What counts (docs/metrics.md):
  - a *content chunk* carries generated text: `delta.content`, `delta.reasoning_content`
    / `delta.reasoning`, `delta.tool_calls` (chat) or `text` (completions); role-only and
    usage-only chunks are not content;
  - tokens per chunk come from the server's cumulative `usage.completion_tokens` when it
    streams it (vLLM `continuous_usage_stats`): what it adds to the tokens counted so far,
    else 1 per chunk; the final `usage` is the request's output token count (on the last
    content chunk, as TGI sends it, that chunk gets only the tokens not yet counted).
Timeouts follow seed 003 §10: connect, TTFT (includes slow headers), idle-stream
(between events, after the response started), total.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servetune.bench.http import Connection
from servetune.status import RequestStatus

try:  # orjson parses SSE payloads ~5x faster; the stdlib is the fallback
    from orjson import JSONDecodeError as _JSONError
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads
    _JSONError = ValueError  # type: ignore[assignment,misc]

_now_ns = time.monotonic_ns


@dataclass(frozen=True)
class Timeouts:
    """Per-request limits in seconds (seed 003 §10). None disables one."""

    connect_s: float | None = 10.0
    ttft_s: float | None = 120.0
    idle_s: float | None = 60.0
    total_s: float | None = 1800.0


def build_body(
    api: str,
    *,
    model: str | None,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    max_tokens: int | None,
    stream: bool,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    min_tokens: bool = True,
    priority: int | None = None,
    continuous_usage: bool = False,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The JSON body of a chat or completions request."""
    body: dict[str, Any] = {"model": model or "default"}
    if api == "chat":
        body["messages"] = messages or [{"role": "user", "content": prompt or ""}]
    else:
        body["prompt"] = prompt if prompt is not None else _flatten(messages)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
        if ignore_eos:
            body["ignore_eos"] = True  # vLLM, llama.cpp, SGLang accept it
            if min_tokens:
                body["min_tokens"] = max_tokens
    body["temperature"] = temperature
    body["stream"] = stream
    if stream:
        opts: dict[str, Any] = {"include_usage": True}
        if continuous_usage:
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
    if priority is not None:
        body["priority"] = priority
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def spec_body(
    spec: Any,
    *,
    model: str | None,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    max_tokens: int | None,
    priority: int | None = None,
    continuous_usage: bool = False,
) -> bytes:
    """`build_body` with the API, streaming and sampling a WorkloadSpec fixes: one place for
    every caller that sends a workload's requests (bench runs, multi-turn sessions)."""
    s = spec.sampling
    return build_body(
        spec.api,
        model=model,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        stream=spec.stream,
        temperature=s.temperature,
        ignore_eos=s.ignore_eos,
        min_tokens=s.min_tokens_equal_max,
        priority=priority,
        continuous_usage=continuous_usage,
        extra=s.extra_body,
    )


def _flatten(messages: list[dict[str, Any]] | None) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages or [])


class RequestState:
    """Everything measured about one request; completes exactly once via `on_done`."""

    __slots__ = (
        "index",
        "stream",
        "on_done",
        "conn",
        "scheduled_ns",
        "queue_ns",
        "send_ns",
        "first_event_ns",
        "first_answer_ns",
        "last_event_ns",
        "chunk_ns",
        "chunk_tokens",
        "status",
        "error",
        "detail",
        "http_status",
        "finish_reason",
        "usage_prompt",
        "usage_completion",
        "timings",
        "texts",
        "keep_text",
        "done",
        "end_ns",
        "_buf",
        "_body",
        "_saw_done",
        "_counted",
        "_timer",
        "_timeouts",
        "cancel_after",
        "connect_ns",
    )

    def __init__(
        self,
        index: int,
        *,
        stream: bool,
        on_done: Callable[[RequestState], None],
        timeouts: Timeouts,
        scheduled_ns: int | None = None,
        cancel_after: int | None = None,
        keep_text: bool = False,
    ) -> None:
        self.index = index
        self.stream = stream
        self.on_done = on_done
        self.conn: Connection | None = None
        self.scheduled_ns = scheduled_ns
        self.queue_ns = 0
        self.send_ns = 0
        self.first_event_ns: int | None = None
        self.first_answer_ns: int | None = None
        self.last_event_ns = 0
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.status = RequestStatus.OK
        self.error: str | None = None
        self.detail: str | None = None
        self.http_status: int | None = None
        self.finish_reason: str | None = None
        self.usage_prompt: int | None = None
        self.usage_completion: int | None = None
        self.timings: dict[str, float] | None = None
        self.texts: list[str] | None = [] if keep_text else None
        self.keep_text = keep_text
        self.done = False
        self.end_ns = 0
        self._buf = b""
        self._body: bytearray | None = None
        self._saw_done = False
        self._counted = 0  # output tokens given to chunks so far
        self._timer: asyncio.TimerHandle | None = None
        self._timeouts = timeouts
        self.cancel_after = cancel_after
        self.connect_ns = 0

    # --- lifecycle -------------------------------------------------------------------
    def sent(self, conn: Connection, write_ns: int) -> None:
        """The request bytes are on the socket. `send_ns` was stamped when the request
        started (before any connect), so a fresh connection's setup counts in TTFT as
        it does for a real client; `connect_ns` says how much of it that was."""
        self.conn = conn
        if not self.send_ns:
            self.send_ns = write_ns
        self.last_event_ns = write_ns
        self._arm()

    def fail(
        self,
        kind: str,
        detail: str,
        now_ns: int | None = None,
        status: RequestStatus = RequestStatus.ERROR,
    ) -> None:
        if self.done:
            return
        self.status = status
        self.error = kind if status == RequestStatus.ERROR else None
        self.detail = detail
        self._complete(now_ns if now_ns is not None else _now_ns())

    def abort(self, status: RequestStatus, kind: str | None, detail: str) -> None:
        """Stop the request from our side (timeout, cancellation, run stop)."""
        if self.done:
            return
        if self.conn is not None:
            self.conn.abort()
        self.status = status
        self.error = kind
        self.detail = detail
        self._complete(_now_ns())

    def _complete(self, now_ns: int) -> None:
        self.done = True
        self.end_ns = now_ns
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.on_done(self)

    # --- timeouts: one timer, re-armed lazily to the nearest pending deadline ----------
    def _deadline(self) -> tuple[int, str] | None:
        t = self._timeouts
        cands = []
        if t.total_s is not None:
            cands.append((self.send_ns + int(t.total_s * 1e9), "total_timeout"))
        if not self.chunk_ns and t.ttft_s is not None:
            cands.append((self.send_ns + int(t.ttft_s * 1e9), "ttft_timeout"))
        if self.http_status is not None and t.idle_s is not None:
            cands.append((self.last_event_ns + int(t.idle_s * 1e9), "idle_timeout"))
        return min(cands) if cands else None

    def _arm(self) -> None:
        d = self._deadline()
        if d is None:
            return
        loop = asyncio.get_running_loop()
        delay_s = max(0.0, (d[0] - _now_ns()) / 1e9)
        self._timer = loop.call_at(loop.time() + delay_s + 0.0005, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.done:
            return
        d = self._deadline()
        if d is not None and _now_ns() >= d[0]:
            limit = d[1].split("_")[0]
            self.abort(RequestStatus.ERROR, d[1], f"no progress within the {limit} limit")
        else:
            self._arm()

    # --- ResponseHandler ---------------------------------------------------------------
    def on_headers(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.http_status = status
        self.last_event_ns = now_ns
        # The idle limit starts here and may fall before the TTFT deadline the timer was
        # armed for: re-armed now, else a stream stalled after its first chunk ran to the
        # TTFT limit (idle 1 s, TTFT 10 s: aborted 10 s in). Later deadlines only move
        # later, so the lazy re-arm in _on_timer covers them.
        if self._timer is not None:
            self._timer.cancel()
            self._arm()
        if status != 200 or not self.stream:
            self._body = bytearray()
        elif "text/event-stream" not in headers.get("content-type", "text/event-stream").lower():
            # a JSON answer to a stream request: judged at the end (media types are
            # case-insensitive, RFC 9110 8.3.1: `Text/Event-Stream` is a stream)
            self._body = bytearray()

    def on_body(self, data: bytes, now_ns: int) -> None:
        self.last_event_ns = now_ns
        if self._body is not None:
            if len(self._body) < 1 << 20:
                self._body += data
            return
        if (  # fast path: exactly one `data: ...` event (a token chunk, usually)
            not self._buf
            and data.startswith(b"data: ")
            and data.find(b"\n", 6) == len(data) - 2
            and data.endswith(b"\n\n")
            and b"\r" not in data
        ):
            self._data(data[6:-2], now_ns)
            return
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        find = buf.find
        while True:  # one pass per SSE event
            end = find(b"\n\n", start)
            if end < 0:
                break
            if buf.startswith(b"data: ", start) and find(b"\n", start, end) < 0:
                self._data(buf[start + 6 : end], now_ns)
            else:
                self._event(buf[start:end], now_ns)
            start = end + 2
            if self.done:
                self._buf = b""
                return
        self._buf = buf[start:]

    def _event(self, ev: bytes, now_ns: int) -> None:
        """A general SSE event: multi-line data, comments, `event:` lines."""
        payload = b"\n".join(
            ln[5:].lstrip(b" ") for ln in ev.split(b"\n") if ln.startswith(b"data:")
        )
        if payload:  # else a comment, keep-alive or `event:` line
            self._data(payload, now_ns)

    def _data(self, payload: bytes, now_ns: int) -> None:
        """One event's data: the per-chunk hot path (kept in one function on purpose)."""
        if self.first_event_ns is None:
            self.first_event_ns = now_ns
        if payload == b"[DONE]":
            self._saw_done = True
            return
        try:
            obj = _loads(payload)
        except _JSONError:
            if payload.strip() == b"[DONE]":  # `data: [DONE] `, `data:\t[DONE]`: off the hot path
                self._saw_done = True
                return
            self.abort(RequestStatus.ERROR, "malformed_response", f"bad SSE JSON: {payload[:80]!r}")
            return
        if type(obj) is not dict:
            self.abort(
                RequestStatus.ERROR,
                "malformed_response",
                f"SSE data is not an object: {payload[:80]!r}",
            )
            return
        if "error" in obj and obj["error"]:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.abort(RequestStatus.ERROR, "server_error_event", str(msg)[:200])
            return
        usage = obj.get("usage")
        choices = obj.get("choices")
        if choices:
            c = choices[0]
            delta = c.get("delta")
            reasoning = None
            if delta is not None:  # chat
                text = delta.get("content")
                if not text:
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    has = bool(reasoning or delta.get("tool_calls"))
                else:
                    has = True
                    if self.texts is not None:
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            else:  # completions
                text = c.get("text")
                has = bool(text)
            if has:
                # tokens not yet counted: continuous usage gives each chunk its share; a
                # final usage on the last content chunk (TGI) adds only what is left
                n = 1
                if usage and usage.get("completion_tokens") is not None:
                    n = max(1, int(usage["completion_tokens"]) - self._counted)
                self._counted += n
                self.chunk_ns.append(now_ns)
                self.chunk_tokens.append(n)
                if text and self.first_answer_ns is None:
                    self.first_answer_ns = now_ns
                if self.texts is not None:
                    self.texts.append((reasoning or "") + (text or ""))
                if self.cancel_after is not None and len(self.chunk_ns) >= self.cancel_after:
                    n = len(self.chunk_ns)
                    self.abort(RequestStatus.CANCELLED, None, f"cancelled after {n} chunks")
                    return
            fr = c.get("finish_reason")
            if fr:
                self.finish_reason = fr
        if usage:
            if usage.get("prompt_tokens") is not None:
                self.usage_prompt = int(usage["prompt_tokens"])
            if usage.get("completion_tokens") is not None:
                self.usage_completion = int(usage["completion_tokens"])
        if "timings" in obj:  # llama.cpp: prompt_ms, predicted_ms, ...
            timings = obj["timings"]
            if isinstance(timings, dict):
                self.timings = {
                    k: float(v) for k, v in timings.items() if isinstance(v, int | float)
                }

    def on_end(self, now_ns: int) -> None:
        if self.done:
            return
        status = self.http_status or 0
        if status != 200:
            body = bytes(self._body or b"")[:300].decode("utf-8", "replace")
            kind = "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
            self.fail(kind, f"HTTP {status}: {body}", now_ns)
            return
        if self._body is not None:
            self._json_answer(bytes(self._body), now_ns)
            return
        if self._buf.strip():  # a last event without its blank line
            self._event(self._buf.strip(), now_ns)
            if self.done:
                return
        if self._saw_done or self.finish_reason:
            self._complete(now_ns)
        else:
            self.fail("truncated_stream", "stream ended without [DONE] or finish_reason", now_ns)

    def _json_answer(self, body: bytes, now_ns: int) -> None:
        """Non-streaming answer: one chunk at the end carrying every token."""
        try:
            obj = _loads(body)
            c = obj["choices"][0]
        except (_JSONError, KeyError, IndexError, TypeError):
            self.fail("malformed_response", f"bad JSON answer: {body[:80]!r}", now_ns)
            return
        msg = c.get("message") or {}
        text = c.get("text") if "text" in c else msg.get("content")
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        usage = obj.get("usage") or {}
        self.usage_prompt = usage.get("prompt_tokens")
        self.usage_completion = usage.get("completion_tokens")
        self.finish_reason = c.get("finish_reason")
        if text or reasoning or msg.get("tool_calls"):
            self.first_event_ns = now_ns
            self.chunk_ns.append(now_ns)
            self.chunk_tokens.append(int(self.usage_completion or 1))
            if self.texts is not None:
                self.texts.append((reasoning or "") + (text or ""))
        self._complete(now_ns)

    def on_fail(self, kind: str, detail: str, now_ns: int) -> None:
        self.fail(kind, detail, now_ns)
