"""Shared by the service's HTTP tests (a pytest plugin, tests/conftest.py): small settings, a clean
``DISTILEMBED_*`` environment, in-process clients on the fake encoder that fail the test if any
request reached the catch-all 500 handler, and ``distilembed serve`` in a child process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.testing import FakeEncoder


def error(response: httpx.Response | Any, status: int, kind: str | None = None) -> dict:
    """The body of an error response, checked: the status, the three keys every error carries and
    (when given) its ``type``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "type", "took_ms"}, body
    if kind is not None:
        assert body["type"] == kind
    return body


def empty_index_dir(directory: Path, dim: int, lexical: bool = False) -> Path:
    """An empty built index directory (flat), as ``index build`` leaves it, for a fake ``dim``-d encoder
    (``lexical``: with the lexical table that lexical and hybrid searches need)."""
    from distilembed.artifacts import atomic_write_json
    from index.live import INDEX_FILE, STORE_FILE
    from index.store import DocumentStore
    from index.vectors import IndexPlan, build_index, save_index

    directory.mkdir(parents=True)
    store = DocumentStore(directory / STORE_FILE)
    if lexical:
        store.enable_lexical()
    store.close()
    save_index(
        build_index(np.zeros((1, dim), np.float32), IndexPlan("flat", 0, "test")), directory / INDEX_FILE
    )
    manifest = {"kind": "index", "dim": dim, "index_type": "flat", "nlist": 0, "nprobe": 1, "bundle": {}}
    manifest["lexical"] = lexical
    atomic_write_json(directory / "manifest.json", manifest)
    return directory


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_settings(**overrides: Any) -> Settings:
    base = {
        "bundle": "fake-bundle",
        "warmup": False,
        "max_items": 8,
        "max_chars": 100,
        "max_queue": 64,
        "max_batch": 4,
        "max_wait_ms": 0,
        "max_payload_bytes": 4096,
        "max_top_k": 20,
    }
    return Settings(**(base | overrides))


@pytest.fixture
def clean_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DISTILEMBED_{name.upper()}", raising=False)


@pytest.fixture
def make_client() -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(encoder: Any = None, index: Any = None, **overrides: Any) -> TestClient:
        app = create_app(make_settings(**overrides), encoder or FakeEncoder(), index)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        registry = client.app.state.service.metrics.registry
        client.__exit__(None, None, None)
        assert registry.get_sample_value("distilembed_internal_errors_total") == 0


ROOT = Path(__file__).resolve().parents[1]


def wait_until(
    condition: Callable[[], bool], what: str, thread: threading.Thread | None = None, timeout: float = 30
) -> None:
    """Poll a condition with a deadline (a server's state, seen from outside)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if thread is not None:
            thread.join(0.02)
        else:
            time.sleep(0.02)


@contextmanager
def serve_process(args: list[str], port: int) -> Iterator[subprocess.Popen[str]]:
    """``distilembed serve ARGS --port PORT`` in a child process, yielded once ``/ready`` answers
    200; stopped (SIGTERM) on exit if it is still running."""
    cmd = [sys.executable, "-m", "distilembed.cli", "serve", *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def ready() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, "the service to be ready", timeout=120)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
