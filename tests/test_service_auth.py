"""Read and write keys: every route against no key, a wrong key, a read key, a write key and a
rotated (old, still listed) key; the OpenAPI document says which routes need which."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth import KeyRing
from service.settings import Settings
from service.testing import FakeEncoder, FakeIndex

READ, OLD_READ, WRITE, OLD_WRITE = "r-new", "r-old", "w-new", "w-old"
DOC = {"documents": [{"id": "d1", "text": "a first document"}]}
# (method, path, body, needs): every route of the app, in an order where each call can succeed.
ROUTES = [
    ("POST", "/documents", DOC, "write"),
    ("POST", "/v1/embeddings", {"input": "a text"}, "read"),
    ("POST", "/embed", {"inputs": "a text"}, "read"),
    ("POST", "/similarity", {"pairs": [["a", "b"]]}, "read"),
    ("POST", "/search", {"query": "a text"}, "read"),
    ("GET", "/documents/d1", None, "read"),
    ("GET", "/info", None, "read"),
    ("POST", "/index/retrain", {"flat_below": 100}, "write"),
    ("POST", "/index/snapshot", None, "write"),
    ("DELETE", "/documents/d1", None, "write"),
    ("GET", "/health", None, "open"),
    ("GET", "/ready", None, "open"),
    ("GET", "/metrics", None, "open"),
]
KEYS = {
    "none": None,
    "wrong": "not-a-key",
    "read": READ,
    "rotated read": OLD_READ,
    "write": WRITE,
    "rotated write": OLD_WRITE,
}


def expected(needs: str, key: str) -> int:
    if needs == "open":
        return 200
    if key in ("none", "wrong"):
        return 401
    if needs == "write" and "read" in key:
        return 403
    return 200


@pytest.fixture
def keyed(tmp_path) -> TestClient:
    settings = Settings(
        bundle="fake-bundle",
        warmup=False,
        read_keys=f"{READ},{OLD_READ}",
        write_keys=f"{WRITE},{OLD_WRITE}",
        snapshot_dir=tmp_path / "snapshots",
    )
    with TestClient(create_app(settings, FakeEncoder(), FakeIndex()), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("key", list(KEYS))
@pytest.mark.parametrize("header", ["bearer", "x-api-key"])
def test_every_route_with_every_key(keyed, key, header):
    secret = KEYS[key]
    headers = {}
    if secret is not None:
        headers = {"Authorization": f"Bearer {secret}"} if header == "bearer" else {"X-API-Key": secret}
    # The write key creates the document the read routes look up, whatever key is under test.
    keyed.post("/documents", json=DOC, headers={"X-API-Key": WRITE}).raise_for_status()
    for method, path, body, needs in ROUTES:
        r = keyed.request(method, path, json=body, headers=headers)
        assert r.status_code == expected(needs, key), (method, path, key, r.text)
        if r.status_code == 401:
            assert r.json()["type"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
        if r.status_code == 403:
            assert r.json()["type"] == "forbidden"
        assert secret is None or secret not in r.text  # a key is never echoed


def test_the_single_api_key_still_reads_and_writes():
    settings = Settings(bundle="fake-bundle", warmup=False, api_key="legacy")
    with TestClient(create_app(settings, FakeEncoder(), FakeIndex())) as client:
        assert client.post("/documents", json=DOC).status_code == 401
        assert client.post("/documents", json=DOC, headers={"X-API-Key": "legacy"}).status_code == 200
        assert client.post("/search", json={"query": "a"}, headers={"X-API-Key": "legacy"}).status_code == 200


def test_metrics_can_require_a_read_key():
    settings = Settings(bundle="fake-bundle", warmup=False, read_keys=READ, metrics_require_key=True)
    with TestClient(create_app(settings, FakeEncoder())) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"X-API-Key": READ}).status_code == 200
        assert client.get("/health").status_code == client.get("/ready").status_code == 200


def test_openapi_lists_security_and_401_403_only_where_they_apply(keyed):
    paths = keyed.get("/openapi.json").json()["paths"]
    for method, path, _, needs in ROUTES:
        template = "/documents/{doc_id}" if path == "/documents/d1" else path
        operation = paths[template][method.lower()]
        codes = set(operation["responses"])
        assert ("401" in codes) == ("security" in operation) == (needs != "open"), (method, path)
        assert ("403" in codes) == (needs == "write"), (method, path)
    with TestClient(create_app(Settings(bundle="fake-bundle", warmup=False), FakeEncoder())) as open_client:
        for operation in (
            op for item in open_client.get("/openapi.json").json()["paths"].values() for op in item.values()
        ):
            assert "security" not in operation and not {"401", "403"} & set(operation["responses"])


def test_keys_are_secret_and_compared_whole():
    settings = Settings(bundle="fake-bundle", read_keys="abc,def", write_keys="ghi")
    assert "abc" not in repr(settings) and "ghi" not in str(settings.model_dump())
    ring = KeyRing.from_settings(settings)
    for given in ("ab", "abcd", "abc ", "ABC", ""):
        with pytest.raises(Exception, match="missing or unknown"):
            ring.check(given, "read")
    ring.check("def", "read")
    ring.check("ghi", "write")
    with pytest.raises(Exception, match="may read but not write"):
        ring.check("abc", "write")


def test_a_bad_credential_is_not_outvoted_by_a_good_one(keyed):
    for headers in (
        {"Authorization": "Basic dXNlcjpwdw==", "X-API-Key": WRITE},
        {"Authorization": f"Bearer {WRITE}", "X-API-Key": "wrong"},
        {"Authorization": "Bearer", "X-API-Key": READ},
    ):
        assert keyed.post("/search", json={"query": "a"}, headers=headers).status_code == 401, headers
    both = {"Authorization": f"Bearer {WRITE}", "X-API-Key": READ}  # each valid: the weaker one rules
    assert keyed.post("/search", json={"query": "a"}, headers=both).status_code == 200
    assert keyed.post("/documents", json=DOC, headers=both).status_code == 403
