"""A mock OpenAI-compatible server: a test tool and the yardstick of the client's ceiling.

It is never how real engines are tested (DESIGN.md): it exists for what an engine cannot
do on demand, namely injected faults, and a server fast enough that the *client* is
the bottleneck. Tokens are whitespace words, so `WordTokenizer` counts them exactly.

Fault modes (chosen per request by probability, or forced by the body field
`mock_fault`): http_500, http_429, slow_headers, stall, truncate, reset, malformed,
error_event, disconnect.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from servetune.aio import install_fast_loop, loop_in_thread, raise_fd_limit
from servetune.errors import InputError
from servetune.workload.tokenizer import WordTokenizer

FAULTS = (
    "http_500",
    "http_429",
    "slow_headers",
    "stall",
    "truncate",
    "reset",
    "malformed",
    "error_event",
    "disconnect",
)


@dataclass
class MockConfig:
    ttft_ms: float = 5.0
    ttft_jitter_ms: float = 0.0
    itl_ms: float = 1.0
    itl_jitter_ms: float = 0.0
    output_tokens: int | None = None  # the model's own length; default: the cap, else 16
    tokens_per_chunk: int = 1  # >1 imitates speculative decoding's multi-token chunks
    # Hold every content chunk and send them all at the end, as onnx-genai-server does
    # (metrics/buffering.py): a stream that is valid but carries no token timing.
    buffer_stream: bool = False
    role_chunk: bool = True  # vLLM sends a role-only first chunk on chat streams
    reasoning_tokens: int = 0  # the first N tokens arrive as `reasoning_content`
    usage: bool = True  # honour stream_options.include_usage
    close_after_response: bool = False  # llama.cpp-like: Connection: close
    # A server that drops a keep-alive connection after this many answers without saying
    # so (a keep-alive timeout or count): the next request on it finds only EOF.
    answers_per_connection: int | None = None
    faults: dict[str, float] = field(default_factory=dict)
    fault_after_chunks: int = 3
    slow_headers_s: float = 2.0
    seed: int = 0
    # An engine bug on demand: a client that disconnects mid-stream leaves its request
    # counted as running (the slot is never freed), as an engine that misses the abort.
    leak_cancelled: bool = False


_HEAD_SSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n"
)


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class MockStats:
    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0
        self.requests = 0
        self.cancelled = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.faults: dict[str, int] = {}

    def prometheus(self) -> bytes:
        lines = [
            "# TYPE mock:num_requests_running gauge",
            f"mock:num_requests_running {self.running}",
            "# TYPE mock:num_requests_waiting gauge",
            "mock:num_requests_waiting 0",
            "# TYPE mock:requests_total counter",
            f"mock:requests_total {self.requests}",
            "# TYPE mock:requests_cancelled_total counter",
            f"mock:requests_cancelled_total {self.cancelled}",
            "# TYPE mock:prompt_tokens_total counter",
            f"mock:prompt_tokens_total {self.prompt_tokens}",
            "# TYPE mock:generation_tokens_total counter",
            f"mock:generation_tokens_total {self.generation_tokens}",
        ]
        return ("\n".join(lines) + "\n").encode()


def request_cap(req: dict[str, Any]) -> int | None:
    """The request's token cap: `max_completion_tokens` (OpenAI's newer name) or
    `max_tokens`; None when neither is a positive whole number."""
    for key in ("max_completion_tokens", "max_tokens"):
        try:
            cap = int(req.get(key) or 0)
        except (TypeError, ValueError):
            continue
        if cap > 0:
            return cap
    return None


def answer_length(own: int | None, cap: int | None) -> tuple[int, str]:
    """(tokens, finish_reason) of one answer: the model's own length (`--output-tokens`;
    without it the cap, else 16) stopped at the request's cap, as a real server stops at
    max_tokens. "length" when the cap ended it, else "stop", the model's own end. Always
    "length" made every mock answer look capped, so a cap check learnt nothing. The
    compiled mock (fastmock.c) follows the same rule."""
    n = own if own is not None else (cap or 16)
    if cap is not None and n >= cap:
        return cap, "length"
    return n, "stop"


class _Stream:
    """One streamed answer, driven by loop timers."""

    __slots__ = (
        "proto", "n_tokens", "sent", "chat", "usage", "cont", "fault", "prompt", "handle", "held",
        "finish",
    )  # fmt: skip

    def __init__(
        self,
        proto: _MockProtocol,
        n_tokens: int,
        chat: bool,
        usage: bool,
        cont: bool,
        fault: str | None,
        prompt: int,
        finish: str,
    ) -> None:
        self.proto = proto
        self.n_tokens = n_tokens
        self.sent = 0
        self.chat = chat
        self.usage = usage
        self.cont = cont
        self.fault = fault
        self.prompt = prompt
        self.handle: asyncio.TimerHandle | None = None
        self.held: list[bytes] = []  # content events held back (MockConfig.buffer_stream)
        self.finish = json.dumps(finish).encode()


class _MockProtocol(asyncio.Protocol):
    def __init__(self, server: MockServer) -> None:
        self.srv = server
        self.t: asyncio.Transport | None = None
        self.buf = b""
        self.stream: _Stream | None = None
        self.closed = False
        self.answered = 0  # requests routed on this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        st = self.stream
        if st is not None:  # client went away mid-stream: the slot is freed
            self.srv.stats.cancelled += 1
            if self.srv.cfg.leak_cancelled and st.handle is not None:
                st.handle.cancel()  # stop streaming, but keep the slot counted as running
                self.stream = None
                return
            self._end_stream(st)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            clen = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    clen = int(v.strip())
            if len(self.buf) < end + 4 + clen:
                return
            body = self.buf[end + 4 : end + 4 + clen]
            self.buf = self.buf[end + 4 + clen :]
            method, path = (head.split(" ", 2) + ["", ""])[:2]
            self._route(method, path, body)

    # --- routing -------------------------------------------------------------------
    def _send_json(self, status: int, obj: object, reason: str = "OK") -> None:
        body = json.dumps(obj).encode()
        conn = "close" if self.srv.cfg.close_after_response else "keep-alive"
        self.t.write(  # type: ignore[union-attr]
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: %s\r\n\r\n%s" % (status, reason.encode(), len(body), conn.encode(), body)
        )
        if self.srv.cfg.close_after_response:
            self.t.close()  # type: ignore[union-attr]

    def _route(self, method: str, path: str, body: bytes) -> None:
        path = path.split("?", 1)[0]
        limit = self.srv.cfg.answers_per_connection
        if limit is not None and self.answered >= limit:
            self.t.close()  # type: ignore[union-attr]
            return
        self.answered += 1
        if path == "/metrics":
            data = self.srv.stats.prometheus()
            self.t.write(  # type: ignore[union-attr]
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                % (len(data), data)
            )
        elif path in ("/health", "/v1/models"):
            self._send_json(200, {"object": "list", "data": [{"id": "mock", "object": "model"}]})
        elif path == "/tokenize":
            req = json.loads(body or b"{}")
            text = req.get("prompt", req.get("content", ""))
            toks = WordTokenizer().encode(text)
            self._send_json(200, {"tokens": toks, "count": len(toks), "max_model_len": 1 << 20})
        elif path == "/detokenize":
            toks = json.loads(body or b"{}").get("tokens", [])
            self._send_json(200, {"prompt": WordTokenizer().decode(toks)})
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self._generate(path.endswith("chat/completions"), body)
        else:
            self._send_json(404, {"error": {"message": f"no route {path}"}}, "Not Found")

    def _generate(self, chat: bool, body: bytes) -> None:
        srv = self.srv
        cfg = srv.cfg
        try:
            req = json.loads(body)
        except json.JSONDecodeError:
            self._send_json(400, {"error": {"message": "bad JSON"}}, "Bad Request")
            return
        fault = req.get("mock_fault") or srv.pick_fault()
        if fault:
            srv.stats.faults[fault] = srv.stats.faults.get(fault, 0) + 1
        if fault == "http_500":
            self._send_json(500, {"error": {"message": "injected 500"}}, "Internal Server Error")
            return
        if fault == "http_429":
            self._send_json(429, {"error": {"message": "injected 429"}}, "Too Many Requests")
            return
        if fault == "disconnect":
            self.t.close()  # type: ignore[union-attr]
            return
        if chat:
            msgs = req.get("messages") or []
            prompt = sum(len(str(m.get("content", "")).split()) for m in msgs)
        else:
            prompt = len(str(req.get("prompt", "")).split())
        n, finish = answer_length(cfg.output_tokens, request_cap(req))
        srv.stats.requests += 1
        srv.stats.prompt_tokens += prompt
        opts = req.get("stream_options") or {}
        if not req.get("stream"):
            delay = srv.ttft_s() + n * cfg.itl_ms / 1000.0
            srv.later(delay, self._plain_answer, chat, n, prompt, finish)
            srv.stats.running += 1
            return
        st = _Stream(
            self,
            n,
            chat,
            bool(opts.get("include_usage")) and cfg.usage,
            bool(opts.get("continuous_usage_stats")),
            fault,
            prompt,
            finish,
        )
        self.stream = st
        srv.stats.running += 1
        srv.stats.max_running = max(srv.stats.max_running, srv.stats.running)
        head_delay = cfg.slow_headers_s if fault == "slow_headers" else 0.0
        st.handle = srv.later(head_delay, self._headers, st)

    def _plain_answer(self, chat: bool, n: int, prompt: int, finish: str) -> None:
        self.srv.stats.running -= 1
        if self.closed:
            return
        text = " ".join(f"w{i % 4096}" for i in range(n))
        choice = {"index": 0, "finish_reason": finish}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        self.srv.stats.generation_tokens += n
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        self._send_json(200, {"id": "mock", "choices": [choice], "usage": usage})

    def _headers(self, st: _Stream) -> None:
        if self.closed or self.stream is not st:
            return
        conn = b"close" if self.srv.cfg.close_after_response else b"keep-alive"
        self.t.write(_HEAD_SSE + b"Connection: " + conn + b"\r\n\r\n")  # type: ignore[union-attr]
        if st.chat and self.srv.cfg.role_chunk:
            self._event(
                b'{"id":"m","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
            )
        st.handle = self.srv.later(self.srv.ttft_s(), self._tick, st)

    def _event(self, payload: bytes) -> None:
        self.t.write(_chunked(b"data: " + payload + b"\n\n"))  # type: ignore[union-attr]

    def _tick(self, st: _Stream) -> None:
        if self.closed or self.stream is not st:
            return
        cfg = self.srv.cfg
        if (
            st.fault in ("stall", "truncate", "reset", "malformed", "error_event")
            and st.sent >= cfg.fault_after_chunks * cfg.tokens_per_chunk
        ):
            self._fault(st)
            return
        k = min(cfg.tokens_per_chunk, st.n_tokens - st.sent)
        words = " ".join(f"w{(st.sent + i) % 4096}" for i in range(k))
        text = json.dumps(" " + words)
        field_name = "reasoning_content" if st.sent < cfg.reasoning_tokens else "content"
        st.sent += k
        self.srv.stats.generation_tokens += k
        last = st.sent >= st.n_tokens
        fr = st.finish if last else b"null"
        usage = b""
        if st.cont:
            usage = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d}' % (st.prompt, st.sent)
        if st.chat:
            ev = (
                b'{"id":"m","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"%s":%s},"finish_reason":%s}]%s}'
                % (field_name.encode(), text.encode(), fr, usage)
            )
        else:
            ev = (
                b'{"id":"m","object":"text_completion","choices":[{"index":0,"text":%s,"finish_reason":%s}]%s}'
                % (text.encode(), fr, usage)
            )
        if cfg.buffer_stream:
            st.held.append(_chunked(b"data: " + ev + b"\n\n"))
        else:
            self._event(ev)
        if not last:
            st.handle = self.srv.later(self.srv.itl_s(), self._tick, st)
            return
        if st.held:
            self.t.write(b"".join(st.held))  # type: ignore[union-attr]
        if st.usage:
            self._event(
                b'{"id":"m","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}'
                % (st.prompt, st.n_tokens, st.prompt + st.n_tokens)
            )
        self.t.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")  # type: ignore[union-attr]
        self._end_stream(st)
        if self.srv.cfg.close_after_response:
            self.t.close()  # type: ignore[union-attr]

    def _fault(self, st: _Stream) -> None:
        t = self.t
        assert t is not None
        if st.fault == "stall":
            return  # keep the connection open, send nothing more
        if st.fault == "malformed":
            self._event(b'{"choices": [ this is not json')
            return
        if st.fault == "error_event":
            self._event(b'{"error":{"message":"injected error event","code":500}}')
            t.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self._end_stream(st)
            return
        if st.fault == "reset":
            sock = t.get_extra_info("socket")
            if sock is not None:  # SO_LINGER 0: close() sends RST
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._end_stream(st)
        t.abort() if st.fault == "reset" else t.close()

    def _end_stream(self, st: _Stream) -> None:
        if self.stream is st:
            self.stream = None
            self.srv.stats.running -= 1
            if st.handle is not None:
                st.handle.cancel()


class MockServer:
    def __init__(self, cfg: MockConfig | None = None) -> None:
        self.cfg = cfg or MockConfig()
        self.stats = MockStats()
        self._rng = random.Random(self.cfg.seed)
        self._server: asyncio.base_events.Server | None = None
        self.loop: asyncio.AbstractEventLoop
        self.port = 0

    def pick_fault(self) -> str | None:
        if not self.cfg.faults:
            return None
        x = self._rng.random()
        for name, p in self.cfg.faults.items():
            if x < p:
                return name
            x -= p
        return None

    def later(self, delay_s: float, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        """`loop.call_later`, but never early. uvloop's timers run on a millisecond clock
        cached per loop iteration, so they can fire up to ~1 ms (more on a loaded machine)
        before `delay_s` really passed; tests rely on the mock's TTFT and ITL being lower
        bounds. An early wake-up re-arms for the rest (the callbacks check their stream is
        still live, so only the first handle needs cancelling)."""
        deadline = time.monotonic_ns() + int(delay_s * 1e9)

        def fire() -> None:
            left = deadline - time.monotonic_ns()
            if left > 0:
                self.loop.call_later(left / 1e9, fire)
            else:
                fn(*args)

        return self.loop.call_later(delay_s, fire)

    def ttft_s(self) -> float:
        c = self.cfg
        v = c.ttft_ms + (self._rng.gauss(0, c.ttft_jitter_ms) if c.ttft_jitter_ms else 0.0)
        return max(0.0, v / 1000.0)

    def itl_s(self) -> float:
        c = self.cfg
        v = c.itl_ms + (self._rng.gauss(0, c.itl_jitter_ms) if c.itl_jitter_ms else 0.0)
        return max(0.0, v / 1000.0)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _MockProtocol(self), host, port, backlog=4096, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


@contextmanager
def mock_in_thread(cfg: MockConfig | None = None) -> Iterator[MockServer]:
    """A mock on its own event loop in a daemon thread (tests); yields it once listening."""
    srv = MockServer(cfg)

    async def start() -> MockServer:
        await srv.start()
        return srv

    with loop_in_thread(start, "mock-server") as running:
        yield running


def check_options(cfg: MockConfig, port: int) -> None:
    """The `mock-server` flags, refused in one line before anything listens: a negative or
    NaN delay, no tokens per chunk (a stream that never ends), a fault probability outside
    0..1, or a port the OS would silently take modulo 65536."""
    delays = (("--ttft-ms", cfg.ttft_ms), ("--itl-ms", cfg.itl_ms))
    for flag, ms in (*delays, ("--jitter-ms", cfg.ttft_jitter_ms)):
        if not (math.isfinite(ms) and ms >= 0):
            raise InputError(flag, f"{ms} is not allowed", "give milliseconds >= 0")
    counts = (("--tokens-per-chunk", cfg.tokens_per_chunk), ("--output-tokens", cfg.output_tokens))
    for flag, n in counts:
        if n is not None and n < 1:
            raise InputError(flag, f"{n} is not allowed", "give a token count >= 1")
    for name, p in cfg.faults.items():
        if not 0 <= p <= 1:  # NaN fails too
            raise InputError("--fault", f"{name}={p}: a probability is 0..1", "e.g. stall=0.05")
    if sum(cfg.faults.values()) > 1:
        raise InputError("--fault", "the probabilities add up to more than 1", "lower them")
    if not 1 <= port <= 65535:
        raise InputError("--port", f"{port} is not a TCP port", "give 1-65535")


def serve_forever(cfg: MockConfig, host: str, port: int) -> None:
    """Blocking: run the mock until interrupted (the `servetune mock-server` command)."""
    check_options(cfg, port)
    raise_fd_limit()
    install_fast_loop()

    async def main() -> None:
        srv = MockServer(cfg)
        try:
            p = await srv.start(host, port)
        except socket.gaierror as exc:  # an OSError too: caught first
            fix = "give an IP address or a name that resolves"
            raise InputError("--host", f"cannot resolve {host!r}: {exc.strerror}", fix) from None
        except OSError as exc:  # the port taken (or privileged), or another machine's address
            if exc.errno == errno.EADDRNOTAVAIL:
                fix = "give one of its own, e.g. 127.0.0.1 or 0.0.0.0"
                raise InputError(
                    "--host", f"{host} is not an address of this machine", fix
                ) from None
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            fix = "pick a free port"
            raise InputError("--port", f"cannot listen on port {port}: {why}", fix) from None
        print(f"mock server listening on http://{host}:{p}", flush=True)
        await asyncio.Event().wait()

    with suppress(KeyboardInterrupt):
        asyncio.run(main())
