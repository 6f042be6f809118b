"""Is there an OpenAI-compatible server at this URL? Checked before a run, so a dead,
wrong or non-HTTP address fails in seconds with its cause, instead of a run of failed
requests (or a 2-minute wait for a TTFT timeout when the port speaks another protocol).

The URL is checked first (scheme, host, port), then one GET of the readiness route
through bench's own HTTP client (`bench.http`), so what the check reaches, the run
reaches: same connect, same TLS, same parser.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from urllib.parse import urlsplit

from servetune.bench.http import Pool, Target, connect_cause, where, with_scheme
from servetune.errors import InputError

# The route every OpenAI-compatible server answers (vLLM, llama.cpp, SGLang, TGI's
# Messages API): it lists the served models once the engine is ready.
READY_PATH = "/v1/models"
_RUNNING = "is the server running at that address?"
_HOST = re.compile(r"^[A-Za-z0-9._:-]+$")  # a name, IPv4, or IPv6 (brackets stripped)


def check_url(url: str, flag: str = "--url") -> Target:
    """The server's address, checked: http or https, a host, a port in 1-65535. One check
    for bench, calibrate and diagnose (accept reads its own through httpx, one line too)."""
    eg = "e.g. http://127.0.0.1:8000"
    try:
        u = urlsplit(with_scheme(url))
    except ValueError as exc:  # 'http://[::1': an IPv6 host left open
        raise InputError(
            flag,
            f"{url!r} is not a valid URL ({exc})",
            "give http(s)://HOST[:PORT], an IPv6 host in brackets: http://[::1]:8000",
        ) from None
    if u.scheme not in ("http", "https"):
        raise InputError(
            flag, f"scheme {u.scheme!r} in {url!r} is not served", f"use http:// or https://, {eg}"
        )
    if not u.hostname or not _HOST.match(u.hostname):
        raise InputError(flag, f"{url!r} has no valid host name", eg)
    try:
        port = u.port
    except ValueError:  # not digits ('abc', '8000 '); digits past 65535 say "out of range"
        digits = u.netloc.rpartition(":")[2]
        if not digits.isdigit():
            raise InputError(flag, f"the port in {url!r} is not a number", eg) from None
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise InputError(flag, f"the port in {url!r} is out of range", f"1-65535, {eg}")
    return Target(url)


def check_server(
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 5.0,
    flag: str = "--url",
) -> None:
    """Raise InputError with the cause when no HTTP server answers the readiness route
    at `url` within `timeout_s` (connect, then answer): refused, unresolvable, TLS on a
    plain port, another protocol, not ready (5xx), or the API key refused."""
    target = check_url(url, flag)
    if api_key:
        check_api_key(api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = target.request_bytes(READY_PATH, b"", headers, method="GET")
    try:
        status = asyncio.run(_get(target, request, timeout_s))
    except _Unreachable as exc:
        raise InputError(flag, exc.cause, exc.fix) from None
    at = where(target)
    if status in (401, 403):
        raise InputError(
            "--api-key-env",
            f"the server at {at} refused the API key (HTTP {status})",
            "set the variable --api-key-env names",
        )
    if status >= 500:
        raise InputError(
            flag,
            f"the server at {at} is not ready (HTTP {status} on {READY_PATH})",
            "wait until it has loaded the model",
        )


def check_api_key(api_key: str, flag: str = "--api-key-env") -> None:
    """An API key goes in a header: printable ASCII only. Anything else broke the run
    with a traceback (UnicodeEncodeError on a non-latin-1 key), and a line break inside
    it ended the header early and sent the rest as a header of its own. The key itself is
    never echoed."""
    if not all(" " <= ch <= "~" for ch in api_key):
        raise InputError(
            flag,
            "the API key has a character an HTTP header cannot carry "
            "(non-ASCII, or a control character such as a line break)",
            "set the variable --api-key-env names to the key alone",
        )


class _Unreachable(Exception):
    """Why no answer came, and what to do about it."""

    def __init__(self, cause: str, fix: str | None) -> None:
        super().__init__(cause)
        self.cause, self.fix = cause, fix


class _Answer:
    """The readiness answer as bench's client delivers it (an `http.ResponseHandler`)."""

    def __init__(self, done: asyncio.Future[int], at: str) -> None:
        self.done = done
        self.at = at
        self.status = 0

    def on_headers(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.status = status

    def on_body(self, data: bytes, now_ns: int) -> None:
        return None

    def on_end(self, now_ns: int) -> None:
        if not self.done.done():
            self.done.set_result(self.status)

    def on_fail(self, kind: str, detail: str, now_ns: int) -> None:
        if self.done.done():
            return
        if kind == "malformed_response":  # another protocol on that port
            self.done.set_exception(_Unreachable(detail, "point --url at the server's HTTP port"))
        else:
            cause = detail if self.at in detail else f"{detail} at {self.at}"
            self.done.set_exception(_Unreachable(cause, _RUNNING))


async def _get(target: Target, request: bytes, timeout_s: float) -> int:
    """One GET through a fresh connection; the HTTP status, or `_Unreachable`."""
    pool = Pool(target, timeout_s)
    try:
        conn = await pool.connect()
    except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
        fix = None if isinstance(exc, ssl.SSLError) else _RUNNING  # the cause asks already
        raise _Unreachable(connect_cause(exc, target, timeout_s), fix) from None
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    try:
        conn.send(request, _Answer(done, where(target)))
        return await asyncio.wait_for(done, timeout_s)
    except (TimeoutError, asyncio.TimeoutError):
        no_answer = f"no HTTP answer from {where(target)} within {timeout_s:g} s"
        raise _Unreachable(no_answer, "is it the server's HTTP port?") from None
    finally:
        conn.close()
