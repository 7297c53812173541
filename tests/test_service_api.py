"""HTTP API of the service on a fake encoder and a fake index (fast, offline)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient

from index.store import Document
from service.app import create_app
from service.settings import Settings
from service.testing import FakeEncoder, FakeIndex
from tests.service_client import error, make_settings

pytestmark = pytest.mark.usefixtures("clean_service_env")


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client(index=FakeIndex())


# ---- happy paths


def test_openai_embeddings_float_and_usage(client):
    texts = ["a cat sat", "dogs bark loudly"]
    r = client.post("/v1/embeddings", json={"input": texts, "model": "whatever"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "fake-bundle"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (2, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, FakeEncoder().encode(texts), atol=1e-6)
    assert body["usage"] == {"prompt_tokens": 3 + 2 + 3 + 2, "total_tokens": 10}
    assert body["took_ms"] >= 0 and float(r.headers["x-took-ms"]) >= 0


def test_openai_embeddings_base64_and_dimensions(client):
    plain = client.post("/v1/embeddings", json={"input": "a cat sat"}).json()["data"][0]["embedding"]
    r = client.post(
        "/v1/embeddings", json={"input": "a cat sat", "encoding_format": "base64", "dimensions": 4}
    )
    assert r.status_code == 200, r.text
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    expected = np.array(plain[:4]) / np.linalg.norm(plain[:4])
    np.testing.assert_allclose(raw, expected, atol=1e-6)
    full = client.post("/v1/embeddings", json={"input": "a cat sat", "encoding_format": "base64"}).json()
    np.testing.assert_allclose(
        np.frombuffer(base64.b64decode(full["data"][0]["embedding"]), dtype="<f4"), plain, atol=1e-7
    )


def test_tei_embed(client):
    r = client.post("/embed", json={"inputs": "one text"})
    assert r.status_code == 200 and len(r.json()) == 1 and len(r.json()[0]) == 8
    r = client.post("/embed", json={"inputs": ["x " * 200], "truncate": True})  # over the char limit, cut
    assert r.status_code == 200, r.text


def test_similarity_both_modes(client):
    r = client.post(
        "/similarity", json={"inputs": {"source_sentence": "a b c", "sentences": ["a b c", "x y"]}}
    )
    assert r.status_code == 200, r.text
    scores = r.json()
    vectors = FakeEncoder().encode(["a b c", "x y"])
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert scores[1] == pytest.approx(float(vectors[0] @ vectors[1]), abs=1e-5)
    r = client.post("/similarity", json={"pairs": [["a b c", "x y"], ["x y", "x y"]]})
    assert r.json() == pytest.approx([scores[1], 1.0], abs=1e-5)


def test_documents_search_get_delete(client):
    docs = [
        {"id": "d1", "text": "the cat sat on the mat", "metadata": {"lang": "en"}},
        {"id": "d2", "text": "dogs bark at night", "metadata": {"lang": "en"}},
        {"id": "d3", "text": "le chat dort", "metadata": {"lang": "fr"}},
    ]
    r = client.post("/documents", json={"documents": docs})
    assert r.status_code == 200 and (r.json()["added"], r.json()["replaced"]) == (3, 0)
    r = client.post("/documents", json={"documents": [docs[0] | {"text": "the cat sat on the mat!"}]})
    assert (r.json()["added"], r.json()["replaced"]) == (0, 1)

    r = client.post("/search", json={"query": "the cat sat on the mat!", "top_k": 2})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results[0]["id"] == "d1" and results[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert results[0]["metadata"] == {"lang": "en"} and len(results) == 2 and r.json()["took_ms"] >= 0

    index = client.app.state.service.index
    r = client.post(
        "/search", json={"query": "cat", "filter": {"lang": "fr"}, "nprobe": 3, "with_text": False}
    )
    assert [h["id"] for h in r.json()["results"]] == ["d3"] and r.json()["results"][0]["text"] is None
    assert index.searches[-1] == {"k": 10, "nprobe": 3, "where": {"lang": "fr"}, "rescore_k": None}
    assert client.post("/search", json={"query": "cat", "rescore_k": 40}).status_code == 200
    assert index.searches[-1]["rescore_k"] == 40

    vector = FakeEncoder().encode(["dogs bark at night"])[0] * 3.0  # scaled: the service normalises it
    r = client.post("/search", json={"vector": vector.tolist(), "top_k": 1})
    assert r.json()["results"][0]["id"] == "d2"
    assert r.json()["results"][0]["score"] == pytest.approx(1.0, abs=1e-5)

    r = client.get("/documents/d3")
    assert (
        r.status_code == 200 and r.json()["text"] == "le chat dort" and r.json()["metadata"] == {"lang": "fr"}
    )
    assert client.delete("/documents/d3").json()["deleted"] == "d3"
    error(client.get("/documents/d3"), 404, "not_found")


def test_index_retrain(make_client):
    index = FakeIndex()
    client = make_client(index=index)
    docs = [{"id": f"d{i}", "text": f"document {i}"} for i in range(40)]
    for lo in range(0, 40, 8):  # the test settings take 8 items per request
        assert client.post("/documents", json={"documents": docs[lo : lo + 8]}).status_code == 200
    r = client.post("/index/retrain", json={"nlist": 4, "storage": "sq8", "flat_below": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["index"] == {
        "type": "ivf_sq8", "ntotal": 40, "nlist": 1, "nprobe": 1, "dim": 8, "indexed_fields": []
    }  # fmt: skip
    assert body["retrained"]["from"] == {"index_type": "flat", "nlist": 0}
    assert client.get("/info").json()["index"]["type"] == "ivf_sq8"
    bad = client.post("/index/retrain", json={"storage": "opq"})
    assert bad.status_code == 422 and bad.json()["type"] == "validation_error"
    index.busy = True
    busy = client.post("/index/retrain", json={})
    assert busy.status_code == 409 and busy.json()["type"] == "conflict"
    assert "already running" in busy.json()["error"]


def test_document_ids_with_slashes(client):
    client.post("/documents", json={"documents": [{"id": "a/b c", "text": "x"}]})
    assert client.get("/documents/a/b c").json()["id"] == "a/b c"


def test_info_metrics_openapi(client):
    client.post("/v1/embeddings", json={"input": "hello"})
    info = client.get("/info").json()
    assert info["dim"] == 8 and info["max_seq_len"] == 16 and info["variant"] == "fake"
    assert info["trained_widths"] == [8]  # a bundle without Matryoshka widths: its dim only
    assert info["index"] == {
        "type": "flat", "ntotal": 0, "nlist": 0, "nprobe": 1, "dim": 8, "indexed_fields": []
    }  # fmt: skip
    assert info["limits"]["max_items"] == 8 and "python" in info["versions"]
    text = client.get("/metrics").text
    for name in (
        'distilembed_request_count_total{route="/v1/embeddings",status="200"} 1.0',
        "distilembed_request_duration_seconds_bucket",
        "distilembed_queue_duration_seconds_count 1.0",
        "distilembed_tokenization_duration_seconds_count 1.0",
        "distilembed_inference_duration_seconds_count 1.0",
        "distilembed_batch_size_bucket",
        "distilembed_queue_depth 0.0",
        "distilembed_search_duration_seconds_count",
        "distilembed_index_vectors 0.0",
        "distilembed_process_resident_memory_bytes",
        "distilembed_bundle_size_bytes",
    ):
        assert name in text, name
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {
        "/v1/embeddings", "/embed", "/similarity", "/search", "/documents", "/documents/{doc_id}",
        "/health", "/ready", "/info", "/metrics",
    } <= paths  # fmt: skip


# ---- bad input: one test per case, JSON {error, type}, never a 500


def test_empty_string_and_empty_list(client):
    error(client.post("/v1/embeddings", json={"input": ""}), 422, "validation_error")
    error(client.post("/v1/embeddings", json={"input": []}), 422)
    error(client.post("/v1/embeddings", json={"input": ["ok", ""]}), 422)
    error(client.post("/embed", json={"inputs": []}), 422)
    error(client.post("/similarity", json={"pairs": []}), 422)
    error(client.post("/documents", json={"documents": []}), 422)


def test_too_many_items_is_413(client):
    error(client.post("/v1/embeddings", json={"input": ["t"] * 9}), 413, "payload_too_large")
    error(client.post("/embed", json={"inputs": ["t"] * 9}), 413)
    error(client.post("/similarity", json={"pairs": [["a", "a"]] * 5}), 413)  # 10 texts sent
    docs = [{"id": str(i), "text": "t"} for i in range(9)]
    error(client.post("/documents", json={"documents": docs}), 413)


def test_text_over_char_limit(client):
    """A size limit JSON Schema cannot state (``truncate`` lifts it): 413, as TEI answers."""
    body = error(client.post("/v1/embeddings", json={"input": "x" * 101}), 413, "payload_too_large")
    assert "101 characters" in body["error"]
    error(client.post("/embed", json={"inputs": ["x" * 101]}), 413)
    error(client.post("/search", json={"query": "x" * 101}), 413)
    assert client.post("/embed", json={"inputs": ["x" * 101], "truncate": True}).status_code == 200


def test_wrong_types(client):
    error(client.post("/v1/embeddings", json={"input": 5}), 422)
    error(client.post("/v1/embeddings", json={"input": [1, 2]}), 422)
    error(client.post("/v1/embeddings", json={"input": "a", "encoding_format": "int8"}), 422)
    error(client.post("/embed", json={"inputs": "a", "normalize": "maybe"}), 422)
    error(
        client.post(
            "/similarity",
            json={"inputs": {"source_sentence": "a", "sentences": ["b"]}, "pairs": [["a", "b"]]},
        ),
        422,
    )
    error(client.post("/search", json={"query": "a", "vector": [0.1] * 8}), 422)
    error(client.post("/search", json={"query": "a", "filter": {"k": [1, 2]}}), 422)
    error(client.post("/documents", json={"documents": [{"id": 3, "text": "a"}]}), 422)
    error(client.post("/v1/embeddings", json=["not", "an", "object"]), 422)


def test_unknown_fields(client):
    assert client.post("/embed", json={"inputs": "a", "truncation_direction": "Right"}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": "a", "user": "u1"}).status_code == 200
    error(client.post("/search", json={"query": "a", "topk": 3}), 422)  # a typo on our own API


def test_invalid_json(client):
    r = client.post("/v1/embeddings", content=b'{"input": "a",', headers={"content-type": "application/json"})
    error(r, 400, "invalid_json")
    r = client.post("/v1/embeddings", content=b'{"input": "a"}', headers={"content-type": "text/plain"})
    assert "application/json" in error(r, 415, "unsupported_media_type")["error"]
    error(client.post("/search", content=b"query=a"), 415)  # a form body, as curl -d sends


DOC = '{"documents": [{"id": "a", "text": "x", "metadata": %s}]}'


@pytest.mark.parametrize(
    ("path", "raw", "message"),
    [
        ("/documents", DOC % r'{"\ud800": 1}', "metadata: must be strict JSON text, and this holds a lone"),
        ("/documents", DOC % r'{"k": ["\udfff"]}', "lone surrogate"),
        ("/documents", DOC % '{"k": NaN}', "NaN or Infinity"),
        ("/documents", DOC % '{"k": 1e999}', "NaN or Infinity"),
        ("/search", r'{"query": "x", "filter": {"\ud800": 1}}', "filter.\\ud800: holds a lone surrogate"),
        ("/search", '{"query": "x", "filter": {"k": -Infinity}}', "filter.k: numbers are finite"),
        ("/search", '{"vector": [NaN, 0, 0, 0, 0, 0, 0, 0]}', "vector: must hold finite numbers"),
    ],
)
def test_what_strict_json_cannot_hold_is_422(client, path, raw, message):
    """Python's JSON parser lets NaN, Infinity and lone surrogates through; stored metadata and filters
    must survive as strict UTF-8 JSON (SQLite refused the surrogates with a 500, NaN came back null)."""
    r = client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    assert message in error(r, 422, "validation_error")["error"]


def test_payload_limit_from_content_length_and_stream(client):
    big = {"input": "x" * 5000}
    error(client.post("/v1/embeddings", json=big), 413, "payload_too_large")

    def chunks():  # no Content-Length: the limit is enforced on the streamed body
        for _ in range(10):
            yield b"x" * 1000

    r = client.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
    assert "streamed" in error(r, 413, "payload_too_large")["error"]
    registry = client.app.state.service.metrics.registry
    labels = {"route": "/v1/embeddings", "status": "413"}  # labelled by route though refused before routing
    assert registry.get_sample_value("distilembed_request_count_total", labels) == 2


def test_top_k_out_of_range(client):
    error(client.post("/search", json={"query": "a", "top_k": 0}), 422)
    body = error(client.post("/search", json={"query": "a", "top_k": 21}), 422)
    assert "top_k" in body["error"]
    error(client.post("/search", json={"query": "a", "nprobe": 0}), 422)
    error(client.post("/search", json={"query": "a", "rescore_k": 0}), 422)
    error(client.post("/search", json={"query": "a", "rescore_k": 2.5}), 422)


def test_dimensions_over_model_dim(client):
    error(client.post("/v1/embeddings", json={"input": "a", "dimensions": 9}), 422)
    error(client.post("/v1/embeddings", json={"input": "a", "dimensions": 0}), 422)


def test_vector_of_wrong_dim(client):
    body = error(client.post("/search", json={"vector": [0.1] * 7}), 422, "validation_error")
    assert "7 dimensions" in body["error"]
    client.post("/documents", json={"documents": [{"id": "z", "text": "a zero test"}]}).raise_for_status()
    zero = client.post("/search", json={"vector": [0.0] * 8})  # schema-valid: every score is 0
    assert zero.status_code == 200 and [h["score"] for h in zero.json()["results"]] == [0.0]
    huge = client.post("/search", json={"vector": [1e300] * 8})  # normalised without overflow
    assert huge.status_code == 200 and huge.json()["results"][0]["id"] == "z"


def test_unknown_document_id(client):
    error(client.get("/documents/nope"), 404, "not_found")
    error(client.delete("/documents/nope"), 404, "not_found")


def test_no_index_configured(make_client):
    client = make_client()
    error(client.post("/search", json={"query": "a"}), 404, "no_index")
    error(client.get("/documents/x"), 404, "no_index")
    assert client.post("/v1/embeddings", json={"input": "a"}).status_code == 200
    assert client.get("/info").json()["index"] is None


def test_api_key(make_client):
    client = make_client(index=FakeIndex(), api_key="s3cret")
    error(client.post("/v1/embeddings", json={"input": "a"}), 401, "unauthorized")
    r = client.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer wrong"})
    assert error(r, 401) and r.headers["www-authenticate"] == "Bearer"
    error(client.get("/documents/x", headers={"X-API-Key": "wrong"}), 401)
    error(client.get("/info"), 401)
    ok = client.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert client.post("/search", json={"query": "a"}, headers={"X-API-Key": "s3cret"}).status_code == 200
    for open_path in ("/health", "/metrics", "/ready"):
        assert client.get(open_path).status_code == 200


def test_unknown_route_and_method(client):
    error(client.get("/nope"), 404, "not_found")
    embeddings = client.get("/v1/embeddings")
    error(embeddings, 405, "method_not_allowed")
    assert embeddings.headers["allow"] == "POST"
    document = client.post("/documents/x")  # its GET and DELETE are in two included routers
    error(document, 405, "method_not_allowed")
    assert document.headers["allow"] == "DELETE, GET"


def test_cors(make_client):
    client = make_client(cors_origins="https://a.example, https://b.example")
    r = client.options(
        "/v1/embeddings",
        headers={"Origin": "https://b.example", "Access-Control-Request-Method": "POST"},
    )
    assert r.headers["access-control-allow-origin"] == "https://b.example"


def test_genuine_bug_is_500_json():
    encoder = FakeEncoder()
    encoder.fail_with = RuntimeError("boom")
    app = create_app(make_settings(), encoder)
    with TestClient(app, raise_server_exceptions=False) as client:
        error(client.post("/v1/embeddings", json={"input": "a"}), 500, "internal_error")
        registry = app.state.service.metrics.registry
        assert registry.get_sample_value("distilembed_internal_errors_total") == 1
        assert registry.get_sample_value(
            "distilembed_request_count_total", {"route": "/v1/embeddings", "status": "500"}
        )


# ---- lifecycle


def test_readiness_lifecycle_and_warmup():
    encoder, index = FakeEncoder(), FakeIndex()
    index.upsert([Document("a", "x")], encoder.encode(["x"]))
    encoder.calls.clear()
    app = create_app(make_settings(warmup=True, max_batch=4, workers=1), encoder, index)
    client = TestClient(app)
    assert client.get("/ready").status_code == 503  # lifespan not started
    with client:
        r = client.get("/ready")
        assert r.status_code == 200 and r.json()["ready"] is True
        assert encoder.calls == [1, 4]  # warm-up ran before ready: one short text, one full batch
        assert "distilembed_index_vectors 1.0" in client.get("/metrics").text
        assert client.get("/health").json()["status"] == "ok"
    state = app.state.service
    assert state.ready is False and index.closed
    assert not any(t.is_alive() for t in state.batcher._threads)


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("DISTILEMBED_MAX_BATCH", "7")
    monkeypatch.setenv("DISTILEMBED_CORS_ORIGINS", "https://x.example,https://y.example")
    monkeypatch.setenv("DISTILEMBED_API_KEY", "k")
    monkeypatch.setenv("DISTILEMBED_INDEX_DIR", "")
    s = Settings()
    assert s.max_batch == 7 and s.cors_origins == ["https://x.example", "https://y.example"]
    assert s.api_key is not None and s.api_key.get_secret_value() == "k" and s.index_dir is None
    with pytest.raises(ValueError, match="max_items"):
        Settings(max_items=10, max_queue=5)


def test_info_lists_trained_widths_and_any_width_is_served(make_client):
    """A Matryoshka bundle's manifest names its trained widths; /info reports them, and
    ``dimensions`` serves any width from 1 to dim, trained or not (unit length, the first N coordinates)."""
    encoder = FakeEncoder()
    encoder.manifest["trained_widths"] = [8, 4, 2]
    client = make_client(encoder=encoder)
    assert client.get("/info").json()["trained_widths"] == [8, 4, 2]
    full = np.array(client.post("/v1/embeddings", json={"input": "a cat sat"}).json()["data"][0]["embedding"])
    for width in (4, 2, 3, 1):  # trained and untrained widths
        body = client.post("/v1/embeddings", json={"input": "a cat sat", "dimensions": width}).json()
        cut = np.array(body["data"][0]["embedding"])
        assert cut.shape == (width,) and np.linalg.norm(cut) == pytest.approx(1.0, abs=1e-6)
        np.testing.assert_allclose(cut, full[:width] / np.linalg.norm(full[:width]), atol=1e-6)
