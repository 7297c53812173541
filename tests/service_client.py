"""Shared by the service's HTTP tests (a pytest plugin, tests/conftest.py): small settings, a clean
``DISTILEMBED_*`` environment, and in-process clients on the fake encoder that fail the test if any
request reached the catch-all 500 handler."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.testing import FakeEncoder


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
