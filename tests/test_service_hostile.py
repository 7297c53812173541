"""Hostile requests: metadata that would poison reads, JSON nested past the parser, anonymous bodies
on keyed servers, 500s and 503s, and answers that could name the server's paths. Every error is
JSON in the usual shape, and no request reaches the catch-all 500 handler (``make_client`` checks).
On a real server, and the compose file: tests/test_service_hostile_server.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from index.live import STORE_FILE, LiveIndex
from index.store import Document, DocumentStore
from service.app import create_app
from service.errors import PathScrubber
from service.metadata import PLACEHOLDER_KEY, RETURNABLE_DEPTH
from service.settings import Settings
from service.testing import FakeEncoder, FakeIndex
from tests.service_client import empty_index_dir, error, make_settings

pytestmark = pytest.mark.usefixtures("clean_service_env")
MIB = 1024 * 1024
FINE = {"id": "fine", "text": "a fine document", "metadata": {"lang": "en"}}


def deep(levels: int, kind: str = "dict") -> dict[str, Any]:
    """Metadata ``levels`` deep (the object itself is level 1): objects ``{"a": ...}``, or one object
    holding lists ``[[...]]``."""
    if kind == "dict":
        inner: dict[str, Any] = {"a": 1}
        for _ in range(levels - 1):
            inner = {"a": inner}
        return inner
    nested: list[Any] = []
    for _ in range(levels - 2):
        nested = [nested]
    return {"a": nested}


def nested_text(depth: int, kind: str) -> str:
    """JSON text ``depth`` containers deep, without building it in Python (too deep for ``json``)."""
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


def upsert_text(metadata: str) -> str:
    """An upsert body around the JSON text of one document's metadata value ``m``."""
    return '{"documents": [{"id": "d", "text": "x", "metadata": {"m": ' + metadata + "}}]}"


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client(index=FakeIndex(), max_payload_bytes=2 * MIB)


def upsert(client: TestClient, metadata: Any) -> Any:
    """A fine document first, then one with ``metadata``: errors must name the second."""
    doc = {"id": "bad", "text": "a hostile document", "metadata": metadata}
    return client.post("/documents", json={"documents": [FINE, doc]})


# ---- metadata limits at the door

A9 = ".a" * 8
OUT_OF_RANGE = "a number outside int64's range (-2**63 .. 2**63-1)"
SCHEMA, TOTAL = (422, "validation_error"), (413, "payload_too_large")  # totals: beyond JSON Schema


@pytest.mark.parametrize(
    ("metadata", "answer", "message"),
    [
        (deep(9), SCHEMA, f"documents.1.metadata{A9}: nested 9 levels deep; the limit is 8"),
        (
            deep(9, "list"),
            SCHEMA,
            "documents.1.metadata.a.0.0.0.0.0.0.0: nested 9 levels deep; the limit is 8",
        ),
        ({"k" * 257: 1}, SCHEMA, "documents.1.metadata: a key of 257 characters; the limit is 256"),
        (
            {"a b": {"c": "x" * 8193}},
            SCHEMA,
            'documents.1.metadata."a b".c: a string of 8193 characters; the limit is 8192',
        ),
        ({"n": 2**63}, SCHEMA, f"documents.1.metadata.n: {OUT_OF_RANGE}"),
        ({"n": [-(2**63) - 1]}, SCHEMA, f"documents.1.metadata.n.0: {OUT_OF_RANGE}"),
        ({"f": -1e19}, SCHEMA, f"documents.1.metadata.f: {OUT_OF_RANGE}"),
        (
            {"a": {f"k{i}": i for i in range(200)}, "b": [{f"k{i}": i for i in range(55)}]},
            TOTAL,
            "documents.1.metadata: more than 256 keys, counted over every nested object",
        ),
        (
            {"l": list(range(4096))},
            TOTAL,
            "documents.1.metadata: more than 4096 values (every key's value and list item)",
        ),
        (
            {"s": ["x" * 8000] * 9},
            TOTAL,
            "documents.1.metadata: 72034 bytes as compact JSON; the limit is 65536",
        ),
    ],
)
def test_metadata_over_a_limit_is_refused_naming_the_place(client, metadata, answer, message):
    assert error(upsert(client, metadata), *answer)["error"] == message
    assert client.get("/documents/bad").status_code == client.get("/documents/fine").status_code == 404


def test_metadata_at_every_limit_is_stored_and_returned(client):
    at_limits = [
        deep(8),
        deep(8, "list"),
        {"k" * 256: "x" * 8192, "n": [2**63 - 1, -(2**63)], "f": [9.2e18, -0.5], "t": True, "z": None},
        {"l": list(range(4095))},
    ]
    for metadata in at_limits:
        assert upsert(client, metadata).status_code == 200
        assert client.get("/documents/bad").json()["metadata"] == metadata
        found = client.post("/search", json={"query": "a hostile document", "top_k": 2}).json()["results"]
        assert metadata in [hit["metadata"] for hit in found]


def test_strict_json_and_long_keys_are_named_without_echoing_them(client):
    raw = '{"documents": [{"id": "a", "text": "x", "metadata": {"%s": {"k": NaN}}}]}' % ("é" * 40)
    r = client.post("/documents", content=raw.encode(), headers={"content-type": "application/json"})
    body = error(r, 422, "validation_error")
    where = 'documents.0.metadata."' + "é" * 32 + '"….k'
    assert body["error"] == f"{where}: must be strict JSON text, and this holds NaN or Infinity"
    raw = '{"documents": [{"id": "a", "text": "x", "metadata": {"a\\nb": {"\\ud800": 1}}}]}'
    r = client.post("/documents", content=raw.encode(), headers={"content-type": "application/json"})
    assert error(r, 422)["error"] == (
        'documents.0.metadata."a\\nb": must be strict JSON text, and this holds a lone surrogate (in a key)'
    )


def test_the_limits_follow_the_settings_and_are_published(make_client):
    client = make_client(index=FakeIndex(), max_metadata_depth=2, max_metadata_keys=3)
    assert upsert(client, {"a": {"b": 1}}).status_code == 200
    r = upsert(client, {"a": {"b": []}})
    assert error(r, 422)["error"] == "documents.1.metadata.a.b: nested 3 levels deep; the limit is 2"
    assert "more than 3 keys" in error(upsert(client, {"a": {"b": 1, "c": 2, "d": 3}}), 413)["error"]
    limits = client.get("/info").json()["limits"]
    assert limits["max_metadata_depth"] == 2 and limits["max_metadata_keys"] == 3
    assert limits["max_metadata_bytes"] == 65536 and limits["max_metadata_string_chars"] == 8192
    components = client.get("/openapi.json").json()["components"]["schemas"]
    metadata = components["DocumentIn"]["properties"]["metadata"]
    assert metadata["description"].startswith("At most 2 levels deep")
    assert metadata["maxProperties"] == 3 and metadata["propertyNames"] == {"maxLength": 256}
    assert metadata["additionalProperties"] == {"$ref": "#/components/schemas/MetadataLevel2"}
    level2 = components["MetadataLevel2"]["anyOf"]  # a list or an object at level 2 holds scalars only
    scalar = {"$ref": "#/components/schemas/MetadataScalar"}
    assert level2[1]["items"] == level2[2]["additionalProperties"] == scalar
    assert "MetadataLevel3" not in components


def test_no_setting_admits_metadata_too_deep_to_return():
    assert Settings(max_metadata_depth=RETURNABLE_DEPTH).max_metadata_depth == RETURNABLE_DEPTH
    with pytest.raises(ValueError, match="max_metadata_depth"):
        Settings(max_metadata_depth=RETURNABLE_DEPTH + 1)


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("depth", [300, 100_000])
def test_json_nested_past_any_limit_is_a_4xx_on_every_body_route(client, kind, depth):
    inner = nested_text(depth, kind)
    bodies = {
        "/documents": upsert_text(inner),
        "/v1/embeddings": '{"input": ' + inner + "}",
        "/search": '{"query": "x", "filter": ' + inner + "}",
        "/index/retrain": '{"nlist": ' + inner + "}",
    }
    for path, raw in bodies.items():
        r = client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and set(r.json()) == {"error", "type", "took_ms"}, (path, r.text)
    assert client.get("/documents/d").status_code == 404
    assert client.get("/health").status_code == 200


# ---- documents stored before the limits


def test_a_stored_document_too_deep_to_return_comes_back_as_a_placeholder(make_client, tmp_path, caplog):
    index_dir = empty_index_dir(tmp_path / "idx", dim=8)
    texts = ["a deep document", "a plain document"]
    store = DocumentStore(index_dir / STORE_FILE)  # the HTTP checks are not on this path
    docs = [Document("deep", texts[0], deep(300)), Document("plain", texts[1], {"lang": "en"})]
    store.upsert(docs, FakeEncoder().encode(texts))
    store.close()
    client = make_client(index_dir=index_dir)
    with caplog.at_level(logging.WARNING, logger="distilembed.service"):
        got = client.get("/documents/deep")
        found = client.post("/search", json={"query": "a deep document"})
    assert got.status_code == found.status_code == 200, (got.text, found.text)
    assert set(got.json()["metadata"]) == {PLACEHOLDER_KEY} and got.json()["text"] == texts[0]
    hits = {hit["id"]: hit["metadata"] for hit in found.json()["results"]}
    assert set(hits["deep"]) == {PLACEHOLDER_KEY} and hits["plain"] == {"lang": "en"}
    assert any("'deep'" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# ---- 503s


def test_every_503_carries_retry_after_and_the_document_says_so():
    app = create_app(make_settings(), FakeEncoder())
    client = TestClient(app)  # the lifespan has not run: not ready
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["ready"] is False and r.headers["retry-after"] == "1"
    assert error(client.get("/info"), 503, "unavailable") and client.get("/info").headers["retry-after"]
    with client:
        paths = client.get("/openapi.json").json()["paths"]
    operations = [op for item in paths.values() for op in item.values()]
    answers = [op["responses"]["503"] for op in operations if "503" in op["responses"]]
    assert len(answers) >= 10 and all("Retry-After" in answer["headers"] for answer in answers)


# ---- answers name no path on the server


def test_no_answer_names_an_absolute_server_path(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)  # configured through a link: given and resolved paths differ
    index_dir = empty_index_dir(tmp_path / "link" / "idx", dim=8)
    encoder = FakeEncoder()
    encoder.bundle = tmp_path / "link" / "bundle"
    settings = make_settings(index_dir=index_dir, bundle=encoder.bundle)
    bodies = []
    with TestClient(create_app(settings, encoder)) as client:
        bodies.append(client.get("/info").text)
        assert client.get("/info").json()["bundle"] == "bundle"
        snapshot = client.post("/index/snapshot")
        assert snapshot.json()["path"] == f"idx-snapshots/{snapshot.json()['name']}"
        assert (real / snapshot.json()["path"]).is_dir()
        live = client.app.state.service.index
        assert live._retraining.acquire(blocking=False)  # as if a retrain were running
        try:
            retrain = client.post("/index/retrain", json={})
            busy_snapshot = client.post("/index/snapshot")
        finally:
            live._retraining.release()
        assert error(retrain, 409, "conflict")["error"] == "idx: a retrain is already running"
        assert error(busy_snapshot, 409, "conflict")["error"].startswith("idx: a retrain is running")
        bodies += [snapshot.text, retrain.text, busy_snapshot.text]
    read_only = LiveIndex(index_dir, writable=False)
    with TestClient(create_app(settings, FakeEncoder(), read_only)) as client:
        refused = client.post("/documents", json={"documents": [FINE]})
        assert error(refused, 422, "validation_error")["error"] == "idx was opened read-only"
        bodies.append(refused.text)
    for body in bodies:
        assert str(tmp_path) not in body and str(tmp_path.resolve()) not in body, body


def test_the_scrubber_replaces_whole_paths_only(tmp_path):
    scrub = PathScrubber([tmp_path / "idx", tmp_path / "idx-snapshots"])
    base = str(tmp_path)
    assert scrub(f"index {base}/idx: busy") == "index idx: busy"
    assert scrub(f"output exists: {base}/idx-snapshots/s1") == "output exists: idx-snapshots/s1"
    assert scrub(f"'{base}/idx.tmp-1' and {base}/idxs") == f"'idx.tmp-1' and {base}/idxs"
    assert scrub(f"x{base}/idx") == f"x{base}/idx"  # inside a longer path: not this directory
    assert PathScrubber([])("nothing /to/do") == "nothing /to/do"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "live").symlink_to(tmp_path / "elsewhere")  # named as configured, found as resolved too
    assert PathScrubber([tmp_path / "live"])(f"{tmp_path.resolve()}/elsewhere/x") == "live/x"


# ---- keys before the body


@pytest.fixture
def keyed(make_client) -> TestClient:
    return make_client(index=FakeIndex(), read_keys="r-key", write_keys="w-key")


def test_a_request_without_a_key_is_refused_before_its_body_is_read(keyed):
    bad_json = {"content": b'{"documents": [', "headers": {"content-type": "application/json"}}
    error(keyed.post("/documents", **bad_json), 401, "unauthorized")
    error(keyed.post("/search", **bad_json), 401, "unauthorized")
    oversize = b"x" * (4096 + 1)  # over max_payload_bytes: 413 comes only after the key check
    r = keyed.post("/v1/embeddings", content=oversize, headers={"content-type": "application/json"})
    assert error(r, 401, "unauthorized") and r.headers["www-authenticate"] == "Bearer"
    consumed = []

    def body() -> Any:
        consumed.append(True)
        yield b'{"input": "never read"}'

    r = keyed.post("/v1/embeddings", content=body(), headers={"content-type": "application/json"})
    assert error(r, 401, "unauthorized") and consumed == []
    read = {"X-API-Key": "r-key", "content-type": "application/json"}
    error(keyed.post("/documents", content=b"{", headers=read), 403, "forbidden")
    error(keyed.delete("/documents/x"), 401, "unauthorized")
    error(keyed.get("/documents/a/b"), 401, "unauthorized")
    write = {"X-API-Key": "w-key", "content-type": "application/json"}
    error(keyed.post("/documents", content=b"{", headers=write), 400, "invalid_json")  # then the body
    error(keyed.get("/no-such-route"), 404, "not_found")
    assert keyed.get("/health").status_code == keyed.get("/openapi.json").status_code == 200
    registry = keyed.app.state.service.metrics.registry
    labels = {"route": "/documents", "status": "401"}
    assert registry.get_sample_value("distilembed_request_count_total", labels) == 1
