"""A kept-alive connection dropped without an answer costs a read-only request one more try
on a new connection (`http_retry.post_twice`), for both of its callers: `quality`'s scoring
requests and the server tokenizer `bench` builds prompts with. A server that drops every
request still fails: one line from `quality`, an httpx error from the tokenizer."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from servetune.errors import InputError
from servetune.quality.endpoint import Endpoint
from servetune.workload.tokenizer import ServerTokenizer
from tcp_servers import json_response, read_request, tcp_server


def _first_only(answered: list[int]):
    """Answers the first request on each connection and closes it, unanswered, at the
    second: a keep-alive timeout crossing the next request (httpx: RemoteProtocolError)."""

    def handle(conn: socket.socket) -> None:
        if read_request(conn):
            answered.append(1)
            conn.sendall(json_response(json.dumps({"tokens": [7, len(answered)]}).encode()))
        read_request(conn)
        conn.close()

    return handle


def _drop_all(conn: socket.socket) -> None:
    read_request(conn)
    conn.close()


@pytest.mark.parametrize("client", ["quality", "tokenizer"])
def test_a_dropped_connection_goes_once_more_on_a_new_one(client: str) -> None:
    answered: list[int] = []
    with tcp_server(_first_only(answered)) as port:
        url = f"http://127.0.0.1:{port}"
        if client == "quality":
            ep = Endpoint(url, "llamacpp", "m", None, timeout_s=10)
            first, second = ep.tokenize("a"), ep.tokenize("b")
            ep.close()
        else:
            tok = ServerTokenizer(url)
            first, second = tok.encode("a"), tok.encode("b")
    assert first == [7, 1]
    assert second == [7, 2]  # dropped on the kept-alive connection, answered on a new one
    assert len(answered) == 2


def test_a_server_that_drops_every_request_still_fails() -> None:
    with tcp_server(_drop_all) as port:
        url = f"http://127.0.0.1:{port}"
        ep = Endpoint(url, "llamacpp", "m", None, timeout_s=10)
        with pytest.raises(InputError) as e:
            ep.tokenize("a")
        ep.close()
        with pytest.raises(httpx.RemoteProtocolError):
            ServerTokenizer(url).encode("a")
    line = e.value.one_line()
    assert "\n" not in line and "stopped answering (RemoteProtocolError)" in line
