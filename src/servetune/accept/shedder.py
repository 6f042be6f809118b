"""A load-shedding front: the smallest gateway that gives a deployment a hard queue
bound (seed 003 §15 "请求队列有硬上限"), per-user concurrency limits and, optionally, a
server-side output cap ("max_new_tokens由服务端限制").

It counts the requests in flight (and per API key); beyond the bound it answers
`429 Too Many Requests` at once instead of queueing, and otherwise forwards the request
(its output-length fields lowered to the cap, when one is set) to an upstream engine
(round robin over replicas, skipping one that refuses connections) and streams the
answer back. A client that goes away closes the
upstream connection, so the engine sees the cancellation.

Why our own and not nginx: nginx's limit_conn answers 503 beyond N connections, but
installing it needs root and each test would need a config file and a process to
manage; this is ~150 lines of stdlib asyncio, started in-process by a test or by
`servetune accept-shedder`. It is a test and bootstrap tool, not a production gateway:
HTTP/1.1 only, one request per connection (it answers `Connection: close`). A request
is counted out when its connection is closed, a moment after the client has the last
byte: a client that sends its next request at once may briefly be counted twice, so a
per-key bound of 1 refuses some back-to-back requests (as nginx's limit_conn may).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from servetune.aio import loop_in_thread
from servetune.errors import InputError

HEAD_LIMIT = 64 * 1024


@dataclass
class Shedder:
    """Forward to `upstreams` ((host, port) each, in turn) with at most `max_in_flight`
    requests in flight, and at most `per_key` per API key (None: no per-user limit)."""

    upstreams: list[tuple[str, int]]
    max_in_flight: int
    per_key: int | None = None
    max_tokens: int | None = None  # the output cap: larger asks are lowered to it
    in_flight: int = 0
    keys: dict[str, int] = field(default_factory=dict)
    shed: int = 0
    forwarded: int = 0
    turn: int = 0
    refused: list[str] = field(default_factory=list)  # replicas that refused a connection

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The next replica that accepts a connection: each request starts one further
        along (round robin) and tries every replica once; None: none accepts."""
        start, n = self.turn, len(self.upstreams)
        self.turn += 1
        for k in range(n):
            host, port = self.upstreams[(start + k) % n]
            try:
                return await asyncio.open_connection(host, port)
            except OSError as exc:
                self.refused.append(f"{host}:{port}: {exc}")
        return None

    def admit(self, key: str) -> bool:
        if self.in_flight >= self.max_in_flight:
            return False
        if self.per_key is not None and self.keys.get(key, 0) >= self.per_key:
            return False
        self.in_flight += 1
        self.keys[key] = self.keys.get(key, 0) + 1
        return True

    def release(self, key: str) -> None:
        self.in_flight -= 1
        self.keys[key] -= 1

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
        }
        length = headers.get("content-length", "0") or "0"
        if not length.isdigit():  # `abc`, `-1`: readexactly would raise, the client hang
            await self._answer(
                writer, "400 Bad Request", f"Content-Length {length!r} is not a byte count"
            )
            return
        try:
            body = await reader.readexactly(int(length))
        except (asyncio.IncompleteReadError, ConnectionError):  # gone before its body
            writer.close()
            return
        key = headers.get("authorization", "")
        method, _, rest = lines[0].partition(" ")
        path = request_path(rest.split(" ")[0])
        counted = method == "POST" and path not in UNCOUNTED_PATHS
        if counted and not self.admit(key):
            self.shed += 1
            await self._answer(writer, "429 Too Many Requests", "over capacity, retry later",
                               "overloaded", "Retry-After: 1\r\n")  # fmt: skip
            return
        if counted and self.max_tokens is not None and path.endswith(GENERATION_PATHS):
            body = cap_tokens(body, self.max_tokens, path)
        try:
            await self._forward(lines, body, reader, writer)
        finally:
            if counted:
                self.release(key)
            writer.close()

    @staticmethod
    async def _answer(
        writer: asyncio.StreamWriter,
        status: str,
        message: str,
        kind: str = "invalid_request_error",
        extra: str = "",
    ) -> None:
        """Answer the client at once (an OpenAI-style error) and close."""
        msg = json.dumps({"error": {"message": message, "type": kind}}).encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
            f"Connection: close\r\nContent-Length: {len(msg)}\r\n\r\n".encode("latin-1")
            + msg
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def _forward(
        self,
        lines: list[str],
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Send the request upstream (one per connection) and pipe the answer back; the
        first side to close ends both, so a client that leaves cancels the request."""
        self.forwarded += 1
        conn = await self.connect()
        if conn is None:
            writer.write(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return
        up_r, up_w = conn
        drop = ("connection:", "content-length:")
        kept = [ln for ln in lines[1:] if ln and not ln.lower().startswith(drop)]
        kept += [f"Content-Length: {len(body)}", "Connection: close"]
        up_w.write(("\r\n".join([lines[0], *kept]) + "\r\n\r\n").encode("latin-1") + body)

        async def upstream_to_client() -> None:
            head = await up_r.readuntil(b"\r\n\r\n")
            hl = [ln for ln in head.decode("latin-1").split("\r\n") if ln]
            hl = [hl[0], *(ln for ln in hl[1:] if not ln.lower().startswith("connection:"))]
            writer.write(("\r\n".join([*hl, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
            while chunk := await up_r.read(65536):
                writer.write(chunk)
                await writer.drain()

        async def client_gone() -> None:
            await reader.read()  # b"" at EOF: the client closed its side

        pipe = asyncio.ensure_future(upstream_to_client())
        gone = asyncio.ensure_future(client_gone())
        try:
            await asyncio.wait({pipe, gone}, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for t in (pipe, gone):
                t.cancel()
            for t in (pipe, gone):
                with contextlib.suppress(BaseException):
                    await t
            up_w.close()


TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")  # OpenAI, llama.cpp
# The paths whose requests generate (their output is capped): OpenAI's /v1/completions,
# /v1/chat/completions and /v1/responses (vLLM serves all three), llama.cpp's native
# /completion, /completions and /infill, TGI's native /generate and /generate_stream.
GENERATION_PATHS = (
    "/completions", "/completion", "/infill", "/responses", "/generate", "/generate_stream"
)  # fmt: skip


def output_fields(path: str) -> tuple[tuple[str, ...], str | None]:
    """The output-length fields a generation path's body carries, and the object that
    holds them (None: the body itself). The Responses API names its cap
    `max_output_tokens`; TGI's native API puts `max_new_tokens` under `parameters`
    (its docs' GenerateParameters)."""
    if path.endswith("/responses"):
        return ("max_output_tokens",), None
    if path.endswith(("/generate", "/generate_stream")):
        return ("max_new_tokens",), "parameters"
    return TOKEN_FIELDS, None


# POSTs that generate nothing: not counted in flight (the probes' prompt maker calls them)
UNCOUNTED_PATHS = ("/tokenize", "/detokenize")


def request_path(target: str) -> str:
    """The path a request line's target routes to, as the engine's router sees it: no
    query or fragment (`/v1/chat/completions?api-version=1`), percent-escapes decoded
    (`/v1/chat%2Fcompletions`), no trailing slash; an absolute-form target's path."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    if "://" in path:
        path = urlsplit(path).path
    return unquote(path).rstrip("/") or "/"


def _asked(value: object) -> int | None:
    """The output length a field asks for: a whole number >= 1 (a numeric string or float
    as an engine's JSON validation would coerce it), else None - no ask: llama.cpp reads
    -1 as unlimited, and 0, null or a non-number leave the engine's own default."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 1:
        return int(value)
    return None


def cap_tokens(body: bytes, cap: int, path: str = "/v1/completions") -> bytes:
    """The request with every output-length field of its path (`output_fields`) at most
    `cap` (and the path's first field set when it asked for none): the cap a gateway
    enforces whatever the engine allows (a llama.cpp request's own n_predict overrides the
    server's -n). A field that asks for no bound (-1, 0, null, not a number) is set to the
    cap. A body that is not a JSON object, or whose `parameters` is not one, goes through
    unchanged; the engine answers it."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    fields, holder = output_fields(path)
    target = data if holder is None else data.setdefault(holder, {})
    if not isinstance(target, dict):
        return body
    given = [f for f in fields if f in target]
    for f in given or [fields[0]]:
        asked = _asked(target.get(f))
        target[f] = cap if asked is None else min(asked, cap)
    if "min_tokens" in target and (least := _asked(target["min_tokens"])) is not None:
        target["min_tokens"] = min(least, cap)
    return json.dumps(data, separators=(",", ":")).encode()


UPSTREAM_PATHS = ("", "/", "/v1", "/v1/")  # the front forwards each request's own path


def upstream_address(url: str) -> tuple[str, int]:
    """(host, port) of an `--upstream` URL. The front opens plain TCP and forwards each
    request's path unchanged, so only `http://HOST[:PORT]` (optionally ending in `/v1`)
    can be honoured: https, another scheme or a path prefix would be silently dropped."""
    fix = "give the engine's plain-HTTP address, e.g. http://127.0.0.1:8000"
    parts = urlsplit(url.strip())
    if parts.scheme != "http":
        got = f"scheme {parts.scheme!r}" if parts.scheme else "no http:// scheme"
        raise InputError("--upstream", f"{url!r} has {got}; the front speaks plain HTTP", fix)
    host = parts.hostname or ""
    if not host or any(c.isspace() for c in host):
        raise InputError("--upstream", f"{url!r} has no valid host", fix)
    try:
        port = 80 if parts.port is None else parts.port
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise InputError("--upstream", f"{url!r} has no valid port (1-65535)", fix)
    if parts.path not in UPSTREAM_PATHS:
        raise InputError(
            "--upstream",
            f"{url!r} has path {parts.path!r}; the front forwards each request's own path, "
            "so the URL may end only in /v1",
            fix,
        )
    if parts.query or parts.fragment:
        raise InputError("--upstream", f"{url!r} has a query or fragment the front drops", fix)
    return host, port


def listen(port: int) -> socket.socket:
    """A socket bound to 127.0.0.1:`port` in the caller's thread: a port in use (or out of
    range) is then one line naming --port, not a server thread that dies unseen."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's own does
    try:
        sock.bind(("127.0.0.1", port))
    except (OSError, OverflowError) as exc:
        sock.close()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(
            "--port", f"cannot listen on 127.0.0.1:{port} ({why})", "pick a free port 1-65535"
        ) from None
    return sock


@contextlib.contextmanager
def shedder_in_thread(
    upstreams: str | list[str],
    max_in_flight: int,
    per_key: int | None = None,
    port: int = 0,
    max_tokens: int | None = None,
) -> Iterator[tuple[str, Shedder]]:
    """Run a shedder on its own event loop in a daemon thread; yields (its URL, it)."""
    ups = [upstreams] if isinstance(upstreams, str) else list(upstreams)
    addresses = [upstream_address(u) for u in ups]
    twice = next((u for u, a in zip(ups, addresses, strict=True) if addresses.count(a) > 1), None)
    if twice is not None:  # one engine listed twice took twice the share of the traffic
        raise InputError("--upstream", f"{twice!r} is given twice", "give each engine once")
    if per_key is not None and per_key > max_in_flight:  # the front's cap binds first
        raise InputError(
            "--per-key",
            f"{per_key} is above --max-in-flight {max_in_flight}: it never binds",
            f"give at most {max_in_flight}",
        )
    sh = Shedder(addresses, max_in_flight, per_key, max_tokens)
    sock = listen(port)

    async def start() -> asyncio.Server:
        return await asyncio.start_server(sh.handle, sock=sock, limit=HEAD_LIMIT)

    with loop_in_thread(start, "accept-shedder") as srv:
        try:
            yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", sh
        finally:
            srv.close()


def serve(
    upstreams: list[str], max_in_flight: int, per_key: int | None, port: int, max_tokens: int | None
) -> None:
    """Blocking: the `servetune accept-shedder` command."""
    with shedder_in_thread(upstreams, max_in_flight, per_key, port, max_tokens) as (url, _):
        limits = f"max {max_in_flight} in flight" + (f", {per_key} per key" if per_key else "")
        limits += f", output capped at {max_tokens} tokens" if max_tokens else ""
        print(f"shedding at {url} -> {', '.join(upstreams)} ({limits})", flush=True)
        threading.Event().wait()
