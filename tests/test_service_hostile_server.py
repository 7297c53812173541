"""Hostile requests on a real uvicorn server (a bug's 500 keeps the keep-alive connection; JSON nested
past the parser is a 4xx), and the compose file's refusal to serve HTTP without a key. The in-process
cases are in tests/test_service_hostile.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from fastapi import FastAPI

from service.app import create_app
from service.middleware import InternalErrorMiddleware, Metrics
from service.testing import FakeEncoder, FakeIndex
from tests.service_client import error, make_settings, wait_until
from tests.test_service_hostile import MIB, nested_text, upsert_text

pytestmark = pytest.mark.usefixtures("clean_service_env")


# ---- on a real server: 500s keep the connection, deep JSON is a 4xx


@contextmanager
def real_server(app: FastAPI) -> Iterator[int]:
    """``app`` under uvicorn's httptools protocol (as served) in a thread; yields its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http="httptools", lifespan="on", log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        wait_until(lambda: server.started, "the server to start", thread)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request on an open connection and read its whole response."""
    sock.sendall(request)
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buffer += chunk
    head, _, body = buffer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection inside a body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_a_500_is_json_logged_once_and_the_connection_serves_the_next_request(caplog):
    encoder = FakeEncoder()
    app = create_app(make_settings(), encoder)
    body = b'{"input": "a"}'
    post = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    post += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    with real_server(app) as port, socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        encoder.fail_with = RuntimeError("boom")
        with caplog.at_level(logging.ERROR):
            status, headers, answer = exchange(sock, post)
        assert status == 500 and headers.get("connection") != "close"
        assert json.loads(answer)["type"] == "internal_error" and "boom" not in answer.decode()
        encoder.fail_with = None
        assert exchange(sock, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 200  # the same connection
        assert exchange(sock, post)[0] == 200
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and logged[0].name == "distilembed.service", logged
    registry = app.state.service.metrics.registry
    assert registry.get_sample_value("distilembed_internal_errors_total") == 1
    labels = {"route": "/v1/embeddings", "status": "500"}
    assert registry.get_sample_value("distilembed_request_count_total", labels) == 1


def test_a_bug_after_the_response_began_goes_on_so_the_connection_closes():
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("in the middle of a body")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    guard = InternalErrorMiddleware(app, Metrics())
    with pytest.raises(RuntimeError, match="middle of a body"):
        asyncio.run(guard({"type": "http", "method": "GET", "path": "/x"}, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start"]  # no second answer


def test_json_nested_past_the_parser_is_a_4xx_on_a_real_server():
    app = create_app(make_settings(max_payload_bytes=2 * MIB), FakeEncoder(), FakeIndex())
    with real_server(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for depth, kind in itertools.product((900, 100_000), ("list", "dict")):
            raw = upsert_text(nested_text(depth, kind))
            r = http.post("/documents", content=raw, headers={"content-type": "application/json"})
            error(r, 422, "validation_error")
        assert http.get("/health").status_code == 200
    assert app.state.service.metrics.registry.get_sample_value("distilembed_internal_errors_total") == 0


# ---- compose: the HTTP services refuse to start without a key

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"
KEY_VARIABLES = ("DISTILEMBED_API_KEY", "DISTILEMBED_READ_KEYS", "DISTILEMBED_WRITE_KEYS")


def test_every_compose_service_that_serves_http_refuses_to_start_without_a_key():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    serving = {name: spec for name, spec in services.items() if "ports" in spec}
    assert set(serving) == {"api", "ray-serve"}
    for spec in serving.values():
        sh, flag, script, name = spec["command"][:4]
        assert (sh, flag) == ("sh", "-c") and spec["environment"]["DISTILEMBED_HOST"] == "0.0.0.0"
        assert {*KEY_VARIABLES, "DISTILEMBED_ALLOW_ANONYMOUS"} <= set(spec["environment"])
        script = script.replace("$$", "$")  # Compose's escape of a literal $

        def start(script: str = script, name: str = name, **env: str) -> subprocess.CompletedProcess[str]:
            command = ["sh", "-c", script, name, "echo", "served"]
            env = {"PATH": os.environ["PATH"], **env}
            return subprocess.run(command, check=False, env=env, capture_output=True, text=True)

        refused = start()
        assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1
        assert (
            "DISTILEMBED_API_KEY" in refused.stderr and "DISTILEMBED_ALLOW_ANONYMOUS=true" in refused.stderr
        )
        assert start(DISTILEMBED_ALLOW_ANONYMOUS="false").returncode == 2
        for variable in (*KEY_VARIABLES, "DISTILEMBED_ALLOW_ANONYMOUS"):
            value = "true" if variable == "DISTILEMBED_ALLOW_ANONYMOUS" else "a-key"
            assert start(**{variable: value}).stdout == "served\n", variable


def test_the_compose_file_is_valid_where_compose_is_installed():
    if (compose := shutil.which("docker-compose")) is None:
        pytest.skip("docker-compose is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTILEMBED_")}
    command = [compose, "-f", str(COMPOSE), "--profile", "index", "--profile", "ray", "config", "-q"]
    checked = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
