"""Connection timers and the connection budget (service/connections.py) against a real uvicorn server
in a thread: slow or silent clients are closed at their deadline, idle connections never turn a
live client's request into a 503, and requests over ``max_concurrency`` get a JSON 503."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.connections import ConnectionBudget, raise_open_file_limit
from service.server import _Server, server_for, warn_if_exposed
from service.testing import FakeEncoder
from tests.service_client import free_port, make_settings, wait_until

pytestmark = pytest.mark.usefixtures("clean_service_env")  # no DISTILEMBED_* from the shell

CLOSED_WITHIN_S = 10  # sanity bound on every wait for the server to close a socket
CLOCK_S = 0.005  # uvloop's clock ticks in milliseconds: a deadline may pass that much early


@dataclass
class Served:
    server: _Server
    port: int
    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def budget(self) -> ConnectionBudget:
        return self.server.config.http.budget  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=CLOSED_WITHIN_S)
        self.sockets.append(sock)
        return sock


@contextmanager
def serving(encoder: FakeEncoder | None = None, **overrides: Any) -> Iterator[Served]:
    settings = make_settings(port=free_port(), log_level="warning", shutdown_timeout_s=2, **overrides)
    server = server_for(create_app(settings, encoder or FakeEncoder()), settings)
    runner = threading.Thread(target=server.run)
    runner.start()
    served = Served(server, settings.port)
    try:
        wait_until(lambda: server.started, "the server to start", runner)
        yield served
    finally:
        for sock in served.sockets:
            sock.close()
        server.should_exit = True
        runner.join(30)
        assert not runner.is_alive()


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length; what follows it stays in ``buffer`` (pipelining)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed inside a body"
        rest += chunk
    buffer[:] = rest[length:]
    return int(lines[0].split()[1]), headers, rest[:length]


def until_closed(sock: socket.socket, start: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and the seconds from ``start`` to the close."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic() - start


def trickle_until_closed(sock: socket.socket, pieces: Iterator[bytes], pace_s: float) -> tuple[bytes, int]:
    """Send one piece each ``pace_s`` (waiting on the socket, not sleeping) until the server closes;
    what it sent, and how many pieces went out."""
    sock.settimeout(pace_s)
    received, sent = b"", 0
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            sock.sendall(next(pieces))
            sent += 1
            continue
        if not chunk:
            return received, sent
        received += chunk


def error_of(raw: bytes, status: int, kind: str) -> dict:
    assert raw.startswith(f"HTTP/1.1 {status} ".encode()), raw
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    payload = json.loads(body)
    assert set(payload) == {"error", "type", "took_ms"} and payload["type"] == kind, payload
    return payload


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


def post_embed(text: str) -> bytes:
    body = json.dumps({"inputs": [text]}).encode()
    head = f"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def test_a_silent_connection_is_closed_at_the_header_timeout() -> None:
    with serving(header_timeout_s=0.4) as served:
        start = time.monotonic()
        received, elapsed = until_closed(served.connect(), start)
    assert received == b""  # nothing was asked: nothing is answered
    assert 0.4 - CLOCK_S <= elapsed < CLOSED_WITHIN_S


@pytest.mark.parametrize("after_a_request", [False, True])
def test_a_trickled_head_is_closed_at_the_header_timeout_with_a_408(after_a_request: bool) -> None:
    with serving(header_timeout_s=0.5, keep_alive_s=5) as served:
        start = time.monotonic()
        sock = served.connect()
        if after_a_request:  # a keep-alive connection: timed from the next request's first byte
            sock.sendall(GET_HEALTH)
            assert read_response(sock, bytearray())[0] == 200
            start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        lines = (f"X-Slow-{i}: 1\r\n".encode() for i in range(10_000))
        received, sent = trickle_until_closed(sock, lines, pace_s=0.05)
        elapsed = time.monotonic() - start
    assert sent >= 3  # bytes kept arriving, and the deadline held
    assert 0.5 - CLOCK_S <= elapsed < CLOSED_WITHIN_S
    assert "head" in error_of(received, 408, "request_timeout")["error"]


def test_a_trickled_body_is_closed_at_the_body_timeout_with_a_408() -> None:
    with serving(header_timeout_s=5, body_timeout_s=0.4) as served:
        sock = served.connect()
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n")
        start = time.monotonic()
        sock.sendall(b"Content-Length: 1000\r\n\r\n")
        received, sent = trickle_until_closed(sock, iter(lambda: b" ", None), pace_s=0.05)
        elapsed = time.monotonic() - start
    assert sent >= 3
    assert 0.4 - CLOCK_S <= elapsed < 5  # the body's deadline, not the head's
    assert "body" in error_of(received, 408, "request_timeout")["error"]


def test_an_idle_keep_alive_connection_is_closed_at_keep_alive_s_silently() -> None:
    with serving(header_timeout_s=5, keep_alive_s=0.4) as served:
        sock, buffer = served.connect(), bytearray()
        start = time.monotonic()  # the deadline starts before the response reaches the client
        sock.sendall(GET_HEALTH)
        assert read_response(sock, buffer)[0] == 200
        received, elapsed = until_closed(sock, start)
    assert received == b""
    assert 0.4 - CLOCK_S <= elapsed < 5


def test_keep_alive_reuse_and_pipelined_requests_share_one_connection() -> None:
    with serving(keep_alive_s=0.5) as served:
        sock, buffer = served.connect(), bytearray()
        for request in (GET_HEALTH, post_embed("one"), GET_HEALTH, post_embed("two words")):
            sock.sendall(request)
            status, _, body = read_response(sock, buffer)
            assert status == 200, body
        sock.sendall(GET_HEALTH + post_embed("three") + GET_HEALTH)  # pipelined
        assert [read_response(sock, buffer)[0] for _ in range(3)] == [200, 200, 200]
        # idle again after the pipeline: the keep-alive deadline, not the app's phase, applies
        received, _ = until_closed(sock, time.monotonic())
    assert received == b"" and buffer == b""


def test_at_max_connections_a_new_client_evicts_the_longest_idle_one() -> None:
    with serving(max_connections=4) as served:
        idle = [served.connect() for _ in range(4)]
        wait_until(lambda: served.budget.open == 4, "four connections accepted")
        assert httpx.get(f"{served.url}/health").status_code == 200
        assert until_closed(idle[0], time.monotonic())[0] == b""  # the oldest went, silently
        idle[1].setblocking(False)
        with pytest.raises(BlockingIOError):  # the others stay open
            idle[1].recv(1)


def test_far_more_idle_connections_than_max_concurrency_do_not_refuse_requests() -> None:
    with serving(max_concurrency=4) as served:
        for _ in range(64):
            served.connect()
        wait_until(lambda: served.budget.open == 64, "the idle connections accepted")
        with httpx.Client(base_url=served.url) as client:
            assert [client.get("/health").status_code for _ in range(3)] == [200, 200, 200]


def test_with_no_idle_connection_to_evict_a_new_one_gets_a_json_503_and_is_closed() -> None:
    with serving(max_connections=2, header_timeout_s=5) as served:
        for sock in (served.connect(), served.connect()):
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # begun: no longer idle
        wait_until(lambda: served.budget.open == 2 and not served.budget.idle, "two requests begun")
        received, _ = until_closed(served.connect(), time.monotonic())
    error_of(received, 503, "unavailable")
    assert b"retry-after: 1\r\n" in received.lower()


def test_requests_over_max_concurrency_get_a_json_503_and_keep_their_connection() -> None:
    gate = threading.Event()
    with serving(FakeEncoder(gate=gate), max_concurrency=2) as served:
        tasks = served.server.server_state.tasks
        answers: list[int] = []

        def embed() -> None:
            answers.append(httpx.post(f"{served.url}/embed", json={"inputs": ["held"]}).status_code)

        held = [threading.Thread(target=embed) for _ in range(2)]
        for thread in held:
            thread.start()
        try:
            wait_until(lambda: len(tasks) == 2, "two requests in flight")
            sock, buffer = served.connect(), bytearray()
            request = post_embed("over the limit")
            sock.sendall(request[:-3])  # the 503 comes before the body is all in
            status, headers, body = read_response(sock, buffer)
            assert status == 503 and headers["retry-after"] == "1"
            assert json.loads(body)["type"] == "unavailable"
            sock.sendall(request[-3:])
        finally:
            gate.set()
            for thread in held:
                thread.join(30)
        assert answers == [200, 200]
        wait_until(lambda: not tasks, "the held requests to finish")
        sock.sendall(post_embed("under the limit again"))
        assert read_response(sock, buffer)[0] == 200


@pytest.mark.parametrize(
    ("host", "keys", "warned"),
    [
        ("0.0.0.0", {}, True),
        ("::", {}, True),
        ("api.example.com", {}, True),
        ("0.0.0.0", {"api_key": "k"}, False),
        ("0.0.0.0", {"read_keys": "r"}, False),
        ("127.0.0.1", {}, False),
        ("127.8.0.1", {}, False),
        ("::1", {}, False),
        ("localhost", {}, False),
    ],
)
def test_an_open_service_on_a_reachable_address_warns_once(
    host: str, keys: dict, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="distilembed.service"):
        warn_if_exposed(make_settings(host=host, **keys))
    messages = [r.getMessage() for r in caplog.records if r.name == "distilembed.service"]
    if not warned:
        assert messages == []
        return
    assert len(messages) == 1 and "with no API key" in messages[0], messages
    if host == "0.0.0.0":
        assert messages[0].startswith("serving on 0.0.0.0:8080 with no API key")


def test_the_open_file_limit_is_raised_and_a_shortfall_warned(caplog: pytest.LogCaptureFixture) -> None:
    resource = pytest.importorskip("resource")
    with caplog.at_level(logging.WARNING, logger="distilembed.service"):
        raise_open_file_limit(64)
    assert caplog.records == []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or hard == resource.RLIM_INFINITY
    if soft != resource.RLIM_INFINITY:
        with caplog.at_level(logging.WARNING, logger="distilembed.service"):
            raise_open_file_limit(soft + 1)
        assert len(caplog.records) == 1 and "open-file limit" in caplog.records[0].getMessage()
