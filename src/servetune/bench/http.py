"""A minimal HTTP/1.1 client on asyncio protocols, built for timing and speed.

Why not httpx/aiohttp: `data_received` is the earliest point where Python sees bytes
arrive, so the timestamp is taken there, before any parsing (field notes: stamp when
bytes arrive); and a callback-driven client with no task per request holds several
times the request rate of general-purpose clients on one core.

Supports keep-alive connection reuse, Content-Length, chunked and read-until-close
bodies, TLS, and servers that close after every response (llama.cpp).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Protocol
from urllib.parse import quote, urlsplit

_now_ns = time.monotonic_ns


class HttpError(Exception):
    """Framing error in the server's response."""


class ResponseHandler(Protocol):
    def on_headers(self, status: int, headers: dict[str, str], now_ns: int) -> None: ...

    def on_body(self, data: bytes, now_ns: int) -> None: ...

    def on_end(self, now_ns: int) -> None: ...

    def on_fail(self, kind: str, detail: str, now_ns: int) -> None: ...


def with_scheme(url: str) -> str:
    """`url` with `http://` in front when it names none (`127.0.0.1:8000`)."""
    return url if "://" in url else f"http://{url}"


class Target:
    """Where requests go: scheme/host/port parsed once."""

    def __init__(self, url: str) -> None:
        u = urlsplit(with_scheme(url))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self.url = url
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None
        )
        self.base_path = base_path(u.path)
        default = (u.scheme == "http" and self.port == 80) or (
            u.scheme == "https" and self.port == 443
        )
        # an IPv6 literal goes in brackets (RFC 3986 §3.2.2): `::1:8000` is not a host
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default else f"{host}:{self.port}"

    def request_bytes(
        self, path: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST"
    ) -> bytes:
        """Serialised request, built once before the run so sending is one write()."""
        lines = [
            f"{method} {self.base_path}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            "Content-Type: application/json",
            "Accept: text/event-stream, application/json",
            f"Content-Length: {len(body)}",
        ]
        for k, v in (headers or {}).items():
            if "\r" in k + v or "\n" in k + v:  # it would end the header, inject another
                raise ValueError(f"header {k!r} has a line break")
            lines.append(f"{k}: {v}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def server_root(url: str) -> str:
    """The server's root URL: a trailing / and /v1 (the base URL the OpenAI SDKs take)
    dropped, since every route servetune asks for carries its own /v1 (or none)."""
    return url.rstrip("/").removesuffix("/v1")


def base_path(path: str) -> str:
    """The URL's path as the prefix of the API routes. A trailing /v1 (the base URL the
    OpenAI SDKs take) is dropped, as `/metrics` scraping, `quality` and `accept` drop it:
    the routes carry their own /v1, and `http://host/v1` asked for /v1/v1/chat/completions
    (404 on every request, while /v1/v1/models passed the readiness check as a 404).
    A path outside ASCII (`/пусть`) is percent-encoded: a request line is ASCII, and the
    path raised UnicodeEncodeError (a traceback); %-escapes already there are kept."""
    return quote(server_root(path), safe="/%:@!$&'()*+,;=")


def where(target: Target) -> str:
    """`host:port`, as causes name the server."""
    return f"{target.host}:{target.port}"


def not_http(first: bytes, target: Target) -> str:
    """What a server that does not speak HTTP sent instead (an SSH server greets first)."""
    line = first.split(b"\n", 1)[0].strip()[:60].decode("latin-1")
    what = "an SSH banner" if first.startswith(b"SSH-") else "no HTTP status line"
    return f"not an HTTP server at {where(target)} (got {what}: {line!r})"


def connect_cause(exc: BaseException, target: Target, timeout_s: float) -> str:
    """Why a connection could not be made, in one line naming the server (what `bench`
    says when a server cannot be reached, and each failed request's detail)."""
    at = where(target)
    if isinstance(exc, ssl.SSLError):  # before OSError: it is one
        reason = getattr(exc, "reason", None) or str(exc)
        return f"TLS handshake failed at {at} ({reason}): is it a plain http:// server?"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused at {at}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host {target.host!r} ({exc.strerror or exc})"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        tls = " (TLS handshake unanswered: is it a plain http:// server?)" if target.ssl else ""
        return f"no connection to {at} within {timeout_s:g} s{tls}"
    if isinstance(exc, OSError):
        return f"cannot connect to {at}: {exc.strerror or exc}"
    return f"cannot connect to {at}: {type(exc).__name__}: {exc}"


# body modes
_LENGTH, _CHUNKED, _UNTIL_CLOSE, _NONE = range(4)
# chunked sub-states
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.handler: ResponseHandler | None = None
        self.got_bytes = False
        self.uses = 0
        self.greeting: bytes | None = None
        self._reset()

    def _reset(self) -> None:
        self._buf = bytearray()
        self._in_head = True
        self._mode = _NONE
        self._remaining = 0
        self._chunk_state = _SIZE
        self._keep_alive = True
        self._at_chunk = False  # chunked body, nothing buffered, a chunk starts next

    # --- asyncio callbacks -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = _now_ns()  # arrival time, before any parsing
        h = self.handler
        if h is None:  # bytes nobody asked for: the connection is not reusable
            if not self.uses:  # the server spoke first: no HTTP server does (SSH does)
                self.greeting = bytes(data[:200])
            self.close()
            return
        self.got_bytes = True
        try:
            if self._at_chunk:  # fast path: `data` is exactly one chunk (one SSE event)
                j = data.find(b"\r\n", 0, 16)
                if j > 0:
                    try:
                        end = j + 2 + int(data[:j], 16)
                    except ValueError:
                        end = -1
                    if end > j + 2 and len(data) == end + 2 and data.endswith(b"\r\n"):
                        h.on_body(data[j + 2 : end], now)
                        return
            self._feed(data, now, h)
        except HttpError as exc:
            self._fail("malformed_response", str(exc), now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        h = self.handler
        if h is None:
            return
        now = _now_ns()
        if not self._in_head and self._mode == _UNTIL_CLOSE and exc is None:
            self.handler = None
            h.on_end(now)
            return
        if self.greeting is not None:  # the greeting closed it before send()'s failure ran
            kind, detail = "malformed_response", not_http(self.greeting, self.pool.target)
        elif isinstance(exc, ConnectionResetError) or not self.got_bytes:
            at = where(self.pool.target)
            kind, detail = (
                "connection_reset",
                f"connection reset or closed by {at} ({exc or 'EOF'})",
            )
        elif self._in_head:
            kind, detail = "malformed_response", f"closed inside the headers ({exc or 'EOF'})"
        else:
            kind, detail = "truncated_stream", f"closed mid-body ({exc or 'EOF'})"
        self.handler = None
        h.on_fail(kind, detail, now)

    # --- use -------------------------------------------------------------------------
    def send(self, data: bytes, handler: ResponseHandler) -> int:
        """Write a whole request; returns the send time (ns)."""
        self._reset()
        self.handler = handler
        self.got_bytes = False
        self.uses += 1
        assert self.transport is not None
        now = _now_ns()
        if self.greeting is not None:  # fail it once the caller has it in flight
            detail = not_http(self.greeting, self.pool.target)
            asyncio.get_running_loop().call_soon(self._fail, "malformed_response", detail, now)
            return now
        self.transport.write(data)
        return now

    def abort(self) -> None:
        """Drop the request in flight: the socket is closed (the server sees a disconnect)."""
        self.handler = None
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, kind: str, detail: str, now: int) -> None:
        h = self.handler
        self.handler = None
        self.close()
        if h is not None:
            h.on_fail(kind, detail, now)

    def _finish(self, now: int) -> None:
        h = self.handler
        self.handler = None
        if self._keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.close()
        if h is not None:
            h.on_end(now)

    # --- parsing ---------------------------------------------------------------------
    def _feed(self, data: bytes, now: int, h: ResponseHandler) -> None:
        if self._in_head:
            self._buf += data
            if not b"HTTP/".startswith(bytes(self._buf[:5])):  # an SSH banner, a TLS alert
                raise HttpError(not_http(bytes(self._buf), self.pool.target))
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > 65536:
                    raise HttpError("response headers over 64 KiB")
                return
            head = bytes(self._buf[:end])
            rest = bytes(self._buf[end + 4 :])
            self._buf = bytearray()
            self._in_head = False
            self._parse_head(head, now, h)
            if self.handler is None:
                return
            if self._mode == _NONE:
                self._finish(now)
                return
            if not rest:
                self._at_chunk = self._mode == _CHUNKED
                return
            data = rest
        mode = self._mode
        if mode == _CHUNKED:
            self._feed_chunked(data, now, h)
        elif mode == _LENGTH:
            n = len(data)
            if n >= self._remaining:
                h.on_body(data[: self._remaining], now)
                self._remaining = 0
                if self.handler is not None:
                    self._finish(now)
            else:
                self._remaining -= n
                h.on_body(data, now)
        else:  # until close
            h.on_body(data, now)

    def _parse_head(self, head: bytes, now: int, h: ResponseHandler) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise HttpError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if sep:
                headers[k.strip().lower()] = v.strip()
        conn = headers.get("connection", "").lower()
        self._keep_alive = parts[0] == "HTTP/1.1" and conn != "close" or conn == "keep-alive"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._mode = _CHUNKED
        elif "content-length" in headers:
            try:
                self._remaining = int(headers["content-length"])
            except ValueError as exc:
                raise HttpError("bad Content-Length") from exc
            self._mode = _LENGTH if self._remaining > 0 else _NONE
        elif status in (204, 304) or 100 <= status < 200:
            self._mode = _NONE
        else:
            self._mode = _UNTIL_CLOSE
            self._keep_alive = False
        h.on_headers(status, headers, now)

    def _feed_chunked(self, data: bytes, now: int, h: ResponseHandler) -> None:
        """De-chunk everything `data` completes and hand it to the handler in ONE
        `on_body` call (an SSE stream sends one HTTP chunk per event: one call per
        event would double the per-chunk cost)."""
        buf = self._buf
        if buf:
            buf += data
            data = bytes(buf)
            self._buf = bytearray()
        parts: list[bytes] = []
        i, n = 0, len(data)
        st = self._chunk_state
        remaining = self._remaining
        finished = False
        while i < n:
            if st == _SIZE:
                j = data.find(b"\r\n", i)
                if j < 0:
                    if n - i > 1024:
                        raise HttpError("chunk size line too long")
                    self._buf = bytearray(data[i:])
                    break
                try:
                    size = int(data[i:j], 16)
                except ValueError:  # chunk extensions (`1a;name=v`) or junk
                    size_s = data[i:j].split(b";", 1)[0].strip()
                    try:
                        size = int(size_s, 16)
                    except ValueError as exc:
                        raise HttpError(f"bad chunk size {size_s[:20]!r}") from exc
                if size < 0:
                    raise HttpError("negative chunk size")
                i = j + 2
                if size == 0:
                    st = _TRAILER
                else:
                    remaining = size
                    st = _DATA
                    # the common case: the whole chunk and its CRLF are here
                    end = i + size
                    if end + 2 <= n:
                        if data[end : end + 2] != b"\r\n":
                            raise HttpError("chunk not followed by CRLF")
                        parts.append(data[i:end])
                        i = end + 2
                        remaining = 0
                        st = _SIZE
            elif st == _DATA:
                take = min(remaining, n - i)
                parts.append(data[i : i + take])
                i += take
                remaining -= take
                if remaining == 0:
                    st = _DATA_END
            elif st == _DATA_END:
                if n - i < 2:
                    self._buf = bytearray(data[i:])
                    break
                if data[i : i + 2] != b"\r\n":
                    raise HttpError("chunk not followed by CRLF")
                i += 2
                st = _SIZE
            else:  # trailer: lines until an empty one
                j = data.find(b"\r\n", i)
                if j < 0:
                    self._buf = bytearray(data[i:])
                    break
                if j == i:
                    st, finished = _SIZE, True
                    break
                i = j + 2
        self._chunk_state, self._remaining = st, remaining
        self._at_chunk = st == _SIZE and not self._buf
        if parts and self.handler is not None:
            h.on_body(parts[0] if len(parts) == 1 else b"".join(parts), now)
        if finished and self.handler is not None:
            self._finish(now)


class Pool:
    """Keep-alive connections to one target; one connection per request in flight."""

    def __init__(self, target: Target, connect_timeout_s: float = 10.0) -> None:
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self.opened = 0

    def get_idle(self) -> Connection | None:
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                return c
        return None

    def release(self, conn: Connection) -> None:
        self.idle.append(conn)

    async def connect(self) -> Connection:
        """A new connection; raises TimeoutError (connect timeout) or OSError."""
        loop = asyncio.get_running_loop()
        t = self.target
        _, proto = await asyncio.wait_for(
            loop.create_connection(
                lambda: Connection(self),
                t.host,
                t.port,
                ssl=t.ssl,
                server_hostname=t.host if t.ssl else None,
            ),
            self.connect_timeout_s,
        )
        self.opened += 1
        return proto

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()
