"""Raw local TCP servers for the tests that need a server misbehaving below HTTP: one that
dies, one that speaks another protocol, one that drops a kept-alive connection."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def tcp_server(on_client: Callable[[socket.socket], None], once: bool = False) -> Iterator[int]:
    """A local TCP server calling `on_client` for each connection (`once`: for the first
    only, then it stops listening: a server that dies); yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            held.append(conn)
            on_client(conn)
            if once:
                srv.close()
                return

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        th.join(2)
        for c in held:
            c.close()
        srv.close()


def read_request(conn: socket.socket) -> bytes:
    """One HTTP/1.1 request off `conn` (head and Content-Length body); b"" when it closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def json_response(body: bytes) -> bytes:
    """A kept-alive 200 with a JSON body."""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
