"""`bench` against a dead, wrong or non-HTTP address fails in seconds with the cause
(exit 2), a run that reaches nothing is stored as failed (exit 1), and bench's numeric
flags are refused in one line naming the flag."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.bench.http import Connection, Pool, Target
from servetune.bench.reach import check_server
from servetune.errors import InputError
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.status import RunStatus
from servetune.store import Store
from tcp_servers import tcp_server


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ssh_banner(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")  # an SSH server speaks first, then waits


def silent(conn: socket.socket) -> None:
    return None  # accepts and never answers


# The bound for checks that get an answer (a refusal, a banner, a failed handshake, a 200)
# and are not about speed: 30 s, as CI's starved process stalls for seconds; only
# test_silent_port_times_out_within_the_bound is about the bound firing.
ANSWERS_S = 30.0


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_closed_port_is_refused_with_the_address() -> None:
    port = closed_port()
    with pytest.raises(InputError) as e:
        check_server(f"http://127.0.0.1:{port}", timeout_s=ANSWERS_S)
    assert e.value.field == "--url"
    assert f"connection refused at 127.0.0.1:{port}" in e.value.one_line()


def test_ssh_port_is_not_http() -> None:
    with tcp_server(ssh_banner) as port, pytest.raises(InputError) as e:
        check_server(f"http://127.0.0.1:{port}", timeout_s=ANSWERS_S)
    assert f"not an HTTP server at 127.0.0.1:{port} (got an SSH banner" in e.value.one_line()


class _Failure:
    """A response handler that keeps what it was told."""

    def __init__(self) -> None:
        self.failed: tuple[str, str] | None = None

    def on_headers(self, status: int, headers: dict[str, str], now_ns: int) -> None: ...

    def on_body(self, data: bytes, now_ns: int) -> None: ...

    def on_end(self, now_ns: int) -> None: ...

    def on_fail(self, kind: str, detail: str, now_ns: int) -> None:
        self.failed = (kind, detail)


class _Transport:
    def abort(self) -> None: ...

    def write(self, data: bytes) -> None: ...


def test_a_greeting_that_closed_the_connection_before_the_request_is_still_named() -> None:
    """The banner lands before the request is sent, and its close is delivered before the
    failure `send` scheduled (a busy host's order, which CI met): still 'SSH banner'."""

    async def order() -> _Failure:
        conn = Connection(Pool(Target("http://127.0.0.1:2222")))
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(b"SSH-2.0-OpenSSH_9.6\r\n")  # nobody asked: kept, then closed
        answer = _Failure()
        conn.send(b"GET /v1/models HTTP/1.1\r\n\r\n", answer)
        conn.connection_lost(None)  # the abort's callback, ahead of send's call_soon
        await asyncio.sleep(0)
        return answer

    answer = asyncio.run(order())
    assert answer.failed is not None
    kind, detail = answer.failed
    assert kind == "malformed_response" and "got an SSH banner" in detail


def test_silent_port_times_out_within_the_bound() -> None:
    with tcp_server(silent) as port, pytest.raises(InputError) as e:
        check_server(f"http://127.0.0.1:{port}", timeout_s=0.5)
    assert f"no HTTP answer from 127.0.0.1:{port} within 0.5 s" in e.value.one_line()


def plain_http(conn: socket.socket) -> None:
    """What uvicorn (vLLM) or llama.cpp send to bytes that are not HTTP: a 400, then close."""
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    conn.close()


def test_https_to_a_plain_http_server_fails_the_handshake() -> None:
    with tcp_server(plain_http) as port, pytest.raises(InputError) as e:
        check_server(f"https://127.0.0.1:{port}", timeout_s=ANSWERS_S)
    assert f"TLS handshake failed at 127.0.0.1:{port}" in e.value.one_line()


def test_a_live_server_passes() -> None:
    with mock_in_thread(MockConfig()) as srv:
        check_server(f"http://127.0.0.1:{srv.port}", timeout_s=ANSWERS_S)  # no error


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("not a url", "has no valid host name"),
        ("ftp://127.0.0.1/x", "scheme 'ftp'"),
        ("http://127.0.0.1:99999", "port in 'http://127.0.0.1:99999' is out of range"),
        ("http://:8000", "has no valid host name"),
    ],
)
def test_bad_urls_are_refused_before_any_connection(url: str, said: str) -> None:
    with pytest.raises(InputError) as e:
        check_server(url, timeout_s=0.1)
    assert e.value.field == "--url" and said in e.value.one_line()


def test_bench_against_an_ssh_port_exits_2_with_one_line() -> None:
    with tcp_server(ssh_banner) as port:
        out = cli("bench", "--url", f"http://127.0.0.1:{port}", "--count", "3", "--no-store")
    assert out.returncode == 2
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [ln for ln in out.stderr.splitlines() if ln.strip() and "note:" not in ln]
    assert len(errors) == 1 and "SSH banner" in errors[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--connect-timeout", "-1", "--connect-timeout: -1 is not allowed (give seconds > 0)"),
        ("--cancel-fraction", "2", "--cancel-fraction: 2 is not allowed"),
        ("--count", "0", "--count: 0 is not allowed (give a request count >= 1)"),
        ("--rate", "inf", "--rate: 'inf': values must be finite and > 0"),
    ],
)
def test_bench_flags_out_of_range_are_one_line(flag: str, value: str, said: str) -> None:
    out = cli("bench", "--url", "http://127.0.0.1:9", flag, value, "--no-store")
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: {said}" or out.stderr.startswith(f"error: {said}")
    assert len(out.stderr.strip().splitlines()) == 1


def models(conn: socket.socket) -> None:
    """Answers the readiness check (the server then dies: `tcp_server(once=True)`)."""
    conn.recv(65536)
    body = json.dumps({"data": [{"id": "m"}]}).encode()
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    conn.close()


def test_a_run_that_reaches_nothing_is_stored_failed_and_exits_1(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with tcp_server(models, once=True) as port:
        out = cli(
            "bench", "--url", f"http://127.0.0.1:{port}", "--count", "3", "--concurrency", "1",
            "--tokenizer", "word", "--no-scrape", "--db", str(db), "-o", str(tmp_path / "r.json"),
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no request reached the server (3 failed): ")
    assert last.endswith(f"connection refused at 127.0.0.1:{port}")
    # nothing measured is lost: the result file and the stored run, marked failed
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["status"] == "failed" and len(saved["records"]) == 3
    with Store.open(str(db)) as st:
        (run,) = st.list_runs()
    assert run.status == RunStatus.FAILED and "no request reached" in (run.stop_reason or "")


def test_a_server_that_answers_no_request_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """A plain web server (`python -m http.server`: /v1/models is a 404, every POST a 501
    HTML page) passed the readiness check, and a run of 3 requests, all refused, exited 0:
    the breaker only stops runs of 20 or more. Now it ends as a failed run, exit 1, with
    the cause on one line; the records are kept."""
    import http.server
    import threading

    class Plain(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_: object) -> None:  # quiet
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = cli(
            "bench", "--url", f"http://127.0.0.1:{srv.server_address[1]}", "--count", "3",
            "--concurrency", "1", "--tokenizer", "word", "--no-scrape", "--no-store",
            "-o", str(tmp_path / "r.json"),
        )  # fmt: skip
    finally:
        srv.shutdown()
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: the server served none of the 3 requests (not served): HTTP 501"
    ), last
    assert len(last) < 260 and "<html" in last.lower()  # the HTML page, cut to one line
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["status"] == "failed" and len(saved["records"]) == 3


@pytest.mark.engine
@pytest.mark.timeout(600)  # llama.cpp's start included (seconds; minutes when it builds)
def test_real_llamacpp_passes_and_https_to_it_fails_the_handshake(llamacpp_server) -> None:
    check_server(llamacpp_server.url, timeout_s=10)  # a ready engine answers /v1/models
    tls = llamacpp_server.url.replace("http://", "https://")
    with pytest.raises(InputError) as e:
        check_server(tls, timeout_s=10)
    assert "TLS handshake" in e.value.one_line()
