"""Requests that may go twice: a dropped kept-alive connection is not the server's answer.

A client keeps a connection open between requests; a server closes it after an idle
timeout (cpp-httplib, which llama.cpp's server is built on, defaults to 5 s). When that
close crosses the next request on the wire, the request is lost unanswered and httpx
raises RemoteProtocolError (or a read/write error): nothing reached the model. For a
request that changes nothing on the server (tokenize, score a prompt, read a page) the
right move is to send it once more on a new connection, as `bench` does for its own pool
(bench/worker.py). A server that really died fails the second try as well, and the
caller reports that.
"""

from __future__ import annotations

from typing import Any

import httpx


def dropped(exc: BaseException) -> bool:
    """Whether `exc` is a connection lost without an answer, worth one more try on a new
    connection (a timeout is not: the server had the request and was slow)."""
    return isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.TimeoutException)


def post_twice(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` as JSON; once more on a new connection if the first was dropped."""
    try:
        return client.post(path, json=body)
    except httpx.HTTPError as exc:
        if not dropped(exc):
            raise
    return client.post(path, json=body)  # httpx discarded the broken connection
