"""The service on Ray Serve (``serve --engine ray``).

One local Ray cluster for the module (2 CPUs, a capped object store) runs the app with 2 API
replicas and the index writer, over HTTP on 127.0.0.1; the shared API cases run against it and
against the local app (TestClient) on ``models/default`` and a real index. The forwarding of
writes (``ReplicaIndex``) and the missing-Ray message are tested without Ray.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from distilembed.errors import UserError
from index.live import LiveIndex
from service.app import create_app
from service.settings import Settings
from tests.service_client import error, free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "models" / "default"
LIMITS: dict[str, Any] = {
    "bundle": BUNDLE,
    "threads": 1,
    "max_items": 8,
    "max_chars": 100,
    "max_payload_bytes": 4096,
    "max_top_k": 20,
    "create_index": True,
    "ray_address": None,  # never a cluster from the environment
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DISTILEMBED_{name.upper()}", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def _needs_bundle() -> None:
    if not (BUNDLE / "manifest.json").is_file():
        pytest.skip("models/default bundle not present")


@pytest.fixture(scope="module")
def ray_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app on a local Ray cluster: 2 API replicas (half a CPU each) and the writer."""
    pytest.importorskip("ray")
    _needs_bundle()
    from service import ray_serve

    saved = os.environ.pop("RAY_ADDRESS", None)
    port = free_port()
    index_dir = tmp_path_factory.mktemp("ray") / "index"
    settings = Settings(**LIMITS, index_dir=index_dir, port=port, replicas=2, replica_cpus=0.5)
    try:
        ray_serve.start(settings, num_cpus=2, object_store_memory=100 * 2**20)
        ray_serve.deploy(settings)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base), "the Ray Serve app to answer /ready", timeout=60)
        yield base
    finally:
        ray_serve.stop(settings)
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def _ready(base: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{base}/ready", timeout=5).status_code == 200
    return False


@pytest.fixture(scope="module")
def local_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    _needs_bundle()
    index_dir = tmp_path_factory.mktemp("local") / "index"
    with TestClient(create_app(Settings(**LIMITS, index_dir=index_dir)), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(params=["local", "ray"])
def api(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """The same client interface on both engines."""
    if request.param == "local":
        yield request.getfixturevalue("local_client")
        return
    with httpx.Client(base_url=request.getfixturevalue("ray_base"), timeout=60) as client:
        yield client


# ---- the shared API cases: both engines


def test_embedding_routes(api):
    texts = ["A man is playing a guitar.", "Someone plays an instrument."]
    r = api.post("/v1/embeddings", json={"input": texts, "model": "whatever"})
    assert r.status_code == 200, r.text
    body = r.json()
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (2, 128) and body["model"] == "default"
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 2
    assert float(r.headers["x-took-ms"]) >= 0
    # alone, not beside texts[1]: int8 activations are quantised per batch
    one = np.array(api.post("/v1/embeddings", json={"input": texts[0]}).json()["data"][0]["embedding"])
    r = api.post("/v1/embeddings", json={"input": texts[0], "encoding_format": "base64", "dimensions": 4})
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(raw, one[:4] / np.linalg.norm(one[:4]), atol=1e-5)
    assert np.array(api.post("/embed", json={"inputs": texts}).json()).shape == (2, 128)
    scores = api.post(
        "/similarity", json={"inputs": {"source_sentence": texts[0], "sentences": [texts[0], "It rains."]}}
    ).json()
    assert scores[0] == pytest.approx(1.0, abs=1e-4) and scores[1] < scores[0]


def test_documents_search_get_delete(api, request):
    p = f"docs-{request.node.callspec.id}-"  # ids of their own: the module shares one index
    docs = [
        {"id": p + "cat", "text": "A cat is sleeping on the sofa.", "metadata": {"t": p, "lang": "en"}},
        {"id": p + "stock", "text": "The stock market fell sharply.", "metadata": {"t": p, "lang": "en"}},
        {"id": p + "chat", "text": "Le chat dort sur le canapé.", "metadata": {"t": p, "lang": "fr"}},
    ]
    r = api.post("/documents", json={"documents": docs})
    assert r.status_code == 200 and (r.json()["added"], r.json()["replaced"]) == (3, 0), r.text
    edited = docs[1] | {"text": "Heavy rain is expected this weekend."}
    assert api.post("/documents", json={"documents": [edited]}).json()["replaced"] == 1

    hits = api.post("/search", json={"query": edited["text"], "top_k": 20, "filter": {"t": p}}).json()
    assert hits["results"][0]["id"] == p + "stock"
    assert hits["results"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    french = api.post("/search", json={"query": "cat", "filter": {"t": p, "lang": "fr"}, "with_text": False})
    assert [h["id"] for h in french.json()["results"]] == [p + "chat"]
    assert french.json()["results"][0]["text"] is None
    english = {"filter": {"t": p, "lang": {"$ne": "fr"}}}
    assert api.post("/index/count", json=english).json()["count"] == 2
    assert api.post("/index/fields", json={"field": "t"}).status_code == 200  # to the writer
    assert "t" in api.get("/info").json()["index"]["indexed_fields"]
    assert api.post("/index/count", json=english).json()["count"] == 2
    vector = api.post("/embed", json={"inputs": docs[0]["text"]}).json()[0]
    by_vector = api.post("/search", json={"vector": [3 * x for x in vector], "top_k": 1, "filter": {"t": p}})
    assert by_vector.json()["results"][0]["id"] == p + "cat"

    modes = {"queries": ["a cat on a sofa", "rain this weekend"], "filter": {"t": p}, "fields": ["vector"]}
    for mode in ("lexical", "hybrid"):
        batches = api.post("/search", json=modes | {"mode": mode}).json()["batches"]
        assert [b["results"][0]["id"] for b in batches] == [p + "cat", p + "stock"]
        assert len(batches[0]["results"][0]["vector"]) == 128
    listed = api.get("/documents", params={"limit": 20}).json()
    assert listed["documents"] and all(set(d) == {"id", "text", "metadata"} for d in listed["documents"])

    got = api.get(f"/documents/{p}chat").json()
    assert (got["text"], got["metadata"]) == (docs[2]["text"], {"t": p, "lang": "fr"})
    assert api.delete(f"/documents/{p}chat").json()["deleted"] == p + "chat"
    error(api.get(f"/documents/{p}chat"), 404, "not_found")
    error(api.delete(f"/documents/{p}chat"), 404, "not_found")
    left = api.post("/search", json={"query": "cat", "top_k": 20, "filter": {"t": p}}).json()["results"]
    assert {h["id"] for h in left} == {p + "cat", p + "stock"}
    api.post("/documents", json={"documents": [{"id": p + "a/b c", "text": "x"}]})
    assert api.get(f"/documents/{p}a/b c").json()["id"] == p + "a/b c"


def test_bad_input(api):
    error(api.post("/v1/embeddings", json={"input": ""}), 422, "validation_error")
    error(api.post("/embed", json={"inputs": []}), 422)
    error(api.post("/v1/embeddings", json={"input": ["t"] * 9}), 413, "payload_too_large")
    error(api.post("/documents", json={"documents": [{"id": str(i), "text": "t"} for i in range(9)]}), 413)
    assert "101 characters" in error(api.post("/embed", json={"inputs": ["x" * 101]}), 413)["error"]
    assert api.post("/embed", json={"inputs": ["x" * 101], "truncate": True}).status_code == 200
    error(api.post("/v1/embeddings", json={"input": [1, 2]}), 422)
    error(api.post("/search", json={"query": "a", "topk": 3}), 422)
    r = api.post("/v1/embeddings", content=b'{"input": "a",', headers={"content-type": "application/json"})
    error(r, 400, "invalid_json")
    error(api.post("/v1/embeddings", json={"input": "x" * 5000}), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds on the streamed body
        for _ in range(10):
            yield b"x" * 1000

    r = api.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
    assert "streamed" in error(r, 413, "payload_too_large")["error"]
    assert "top_k" in error(api.post("/search", json={"query": "a", "top_k": 21}), 422)["error"]
    assert "7 dimensions" in error(api.post("/search", json={"vector": [0.1] * 7}), 422)["error"]
    error(api.post("/v1/embeddings", json={"input": "a", "dimensions": 129}), 422)
    error(api.get("/documents/never-added"), 404, "not_found")
    error(api.delete("/documents/never-added"), 404, "not_found")
    error(api.get("/nope"), 404, "not_found")
    error(api.get("/v1/embeddings"), 405, "method_not_allowed")


def test_retrain(api, request):
    p = f"retrain-{request.node.callspec.id}-"
    docs = [{"id": f"{p}{i}", "text": f"document number {i} about topic {i % 5}"} for i in range(48)]
    for lo in range(0, 48, 8):  # 8 documents per request at most here
        assert api.post("/documents", json={"documents": docs[lo : lo + 8]}).status_code == 200
    r = api.post("/index/retrain", json={"nlist": 4, "flat_below": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["index"]["type"] == "ivf" and body["index"]["ntotal"] >= 48
    # /info reads a replica's copy as of its last refresh (every refresh_ms; searches refresh first)
    wait_until(
        lambda: api.get("/info").json()["index"]["type"] == "ivf", "a replica's /info to show the retrain"
    )
    hits = api.post("/search", json={"query": docs[7]["text"], "top_k": 1, "nprobe": 64}).json()["results"]
    assert hits[0]["id"] == f"{p}7"
    error(api.post("/index/retrain", json={"storage": "opq"}), 422, "validation_error")


def test_snapshot(api, request, tmp_path, tmp_path_factory):
    """POST /index/snapshot: on Ray the writer takes it (its lock pins the instant)."""
    from index.snapshot import restore_snapshot

    doc_id = f"snap-{request.node.callspec.id}"
    doc = {"id": doc_id, "text": "A document written before the snapshot."}
    assert api.post("/documents", json={"documents": [doc]}).status_code == 200
    r = api.post("/index/snapshot")
    assert r.status_code == 200, r.text
    # "index-snapshots/<name>": relative to the index's parent, a fixture's temporary directory
    (snapshot,) = {p.resolve() for p in tmp_path_factory.getbasetemp().glob(f"*/{r.json()['path']}")}
    restored = tmp_path / "restored"
    restore_snapshot(snapshot, restored)
    live = LiveIndex(restored, writable=False)
    try:
        assert live.get(doc_id).text == doc["text"] and live.ntotal == r.json()["ntotal"]
    finally:
        live.close(checkpoint=False)


def test_info_metrics_openapi(api):
    api.post("/v1/embeddings", json={"input": "hello"})
    info = api.get("/info").json()
    assert (info["dim"], info["variant"], info["model"]) == (128, "int8", "default")
    assert set(info["index"]) == {"type", "ntotal", "nlist", "nprobe", "dim", "indexed_fields"}
    assert api.get("/ready").json()["ready"] is True and api.get("/health").status_code == 200
    text = api.get("/metrics").text
    for name in (
        "distilembed_request_count_total",
        "distilembed_request_duration_seconds_bucket",
        "distilembed_inference_duration_seconds_count",
        "distilembed_search_duration_seconds_count",
        "distilembed_index_vectors",
        "distilembed_ready 1.0",
    ):
        assert name in text, name
    paths = set(api.get("/openapi.json").json()["paths"])
    assert {"/v1/embeddings", "/search", "/documents", "/documents/{doc_id}", "/index/retrain"} <= paths


# ---- Ray only


def test_replicas_and_one_writer(ray_base):
    from ray import serve

    from service.ray_serve import APP_NAME

    deployments = serve.status().applications[APP_NAME].deployments
    running = {name: d.replica_states.get("RUNNING", 0) for name, d in deployments.items()}
    assert running == {"Api": 2, "IndexWriter": 1}


def test_a_write_is_seen_by_every_later_search(ray_base):
    """Whichever replica takes a request (each one on a new connection), a search sees the writes
    acknowledged before it: searches apply the writer's committed changes first."""
    doc = {"id": "ryw", "text": "Penguins waddle across the frozen beach.", "metadata": {"t": "ryw"}}
    assert httpx.post(f"{ray_base}/documents", json={"documents": [doc]}, timeout=60).status_code == 200
    query = {"query": doc["text"], "top_k": 1, "filter": {"t": "ryw"}}
    for _ in range(10):
        assert httpx.post(f"{ray_base}/search", json=query, timeout=60).json()["results"][0]["id"] == "ryw"
    assert httpx.delete(f"{ray_base}/documents/ryw", timeout=60).status_code == 200
    for _ in range(10):
        assert httpx.post(f"{ray_base}/search", json=query, timeout=60).json()["results"] == []


def test_a_killed_writer_is_restarted_and_loses_nothing(ray_base):
    """kill -9 of the writer: writes answer 503 (or wait) until Serve has restarted it, never 500;
    the new writer takes the lock the kernel released, and every acknowledged write is there."""
    import signal

    from ray import serve

    from service.ray_serve import APP_NAME

    def post(doc_id: str) -> httpx.Response:
        doc = {"id": doc_id, "text": f"A note called {doc_id}.", "metadata": {"t": "kill"}}
        return httpx.post(f"{ray_base}/documents", json={"documents": [doc]}, timeout=60)

    assert post("before-kill").status_code == 200
    writer = serve.get_deployment_handle("IndexWriter", app_name=APP_NAME)
    pid = writer.ready.remote().result()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while (r := post("after-kill")).status_code != 200:
        assert r.status_code == 503 and r.json()["type"] == "unavailable", r.text
        assert time.monotonic() < deadline, "the writer was never restarted"
        time.sleep(0.2)
    assert writer.ready.remote().result() != pid
    query = {"query": "a note", "top_k": 5, "filter": {"t": "kill"}}
    hits = httpx.post(f"{ray_base}/search", json=query, timeout=60).json()["results"]
    assert {h["id"] for h in hits} == {"before-kill", "after-kill"}


def test_sharded_index_on_shard_deployments(ray_base, local_client, tmp_path):
    """A 2-shard index on Ray Serve: one IndexShard deployment per shard, Api replicas holding no
    index; searches (with and without a filter) equal the unsharded index's, writes are refused."""
    from ray import serve

    from index.build import BuildConfig, build
    from index.corpus import CorpusSpec
    from index.shards import shard_index
    from service import ray_serve
    from tests.tiny_models import tiny_sentences

    corpus = tmp_path / "c.jsonl"
    texts = tiny_sentences(600, seed=3)
    corpus.write_text(
        "".join(f'{{"id": "d{i}", "text": "{t}", "n": {i % 3}}}\n' for i, t in enumerate(texts))
    )
    whole = tmp_path / "whole"
    build(
        BuildConfig(bundle=str(BUNDLE), out=str(whole), nlist=8, nprobe=3, flat_below=100),
        CorpusSpec(corpus, metadata_columns=("n",)),
    )
    shard_index(whole, 2, tmp_path / "sharded")
    settings = Settings(
        **LIMITS | {"create_index": False}, index_dir=tmp_path / "sharded", replicas=2, replica_cpus=0.5
    )
    serve.run(ray_serve.build_app(settings), name="sharded", route_prefix="/sharded")
    try:
        running = {
            name: d.replica_states.get("RUNNING", 0)
            for name, d in serve.status().applications["sharded"].deployments.items()
        }
        assert running == {"Api": 2, "IndexShard-0": 1, "IndexShard-1": 1}
        unsharded = TestClient(create_app(Settings(**LIMITS, index_dir=whole)), raise_server_exceptions=False)
        with unsharded, httpx.Client(base_url=f"{ray_base}/sharded", timeout=60) as sharded:
            for query in (texts[5], texts[77], "a guitar on the table"):
                for where in (None, {"n": 1}, {"$or": [{"n": 0}, {"n": {"$gt": 1}}]}):
                    body = {"query": query, "top_k": 10, "filter": where}
                    want, got = (c.post("/search", json=body) for c in (unsharded, sharded))
                    assert got.status_code == 200, got.text
                    pairs = [
                        [(h["id"], round(h["score"], 5)) for h in r.json()["results"]] for r in (want, got)
                    ]
                    assert pairs[0] == pairs[1] and len(pairs[0]) == 10
            for where in (None, {"n": {"$ne": 1}}):
                counts = [
                    c.post("/index/count", json={"filter": where}).json()["count"]
                    for c in (unsharded, sharded)
                ]
                assert counts[0] == counts[1] == (600 if where is None else 400)
            for mode in ("lexical", "hybrid"):
                body = {"query": texts[77], "mode": mode, "top_k": 5, "fields": ["vector"]}
                hits = sharded.post("/search", json=body).json()["results"]
                assert "d77" in [h["id"] for h in hits] and len(hits[0]["vector"]) == 128
            seen, cursor = [], None
            while cursor is not None or not seen:
                page = sharded.get(
                    "/documents", params={"limit": 20} | ({"cursor": cursor} if cursor else {})
                )
                seen, cursor = seen + [d["id"] for d in page.json()["documents"]], page.json()["next_cursor"]
            assert sorted(seen) == sorted(f"d{i}" for i in range(600))
            error(sharded.post("/index/fields", json={"field": "n"}), 409)
            assert sharded.get("/documents/d77").json()["text"] == texts[77]
            assert sharded.get("/documents/nope").status_code == 404
            info = sharded.get("/info").json()["index"]
            assert (info["type"], info["ntotal"]) == ("ivf_sharded", 600)
            error(sharded.post("/search", json={"query": "x", "filter": {"n": [1, 2]}}), 422)
            doc = {"id": "new", "text": "a new text"}
            assert error(sharded.post("/documents", json={"documents": [doc]}), 409)["error"].count(
                "read-only"
            )
    finally:
        serve.delete("sharded")


def test_a_running_serve_keeps_its_http_port_and_the_url_says_which(ray_base, caplog):
    """Serve's HTTP options are the cluster's: another --port does not move it, and the URL the
    command prints is the one that answers."""
    from service import ray_serve

    port = int(ray_base.rsplit(":", 1)[1])
    with caplog.at_level(logging.WARNING, logger="distilembed.service"):
        url = ray_serve.start_serve(Settings(**LIMITS, port=free_port()))
    assert url == ray_base and _ready(url)
    assert f"already runs on this cluster, on 127.0.0.1:{port}" in caplog.text


def test_app_builder_and_options():
    pytest.importorskip("ray")
    from ray.serve import Application

    from service.ray_serve import api_options, app_builder, replica_settings

    assert isinstance(app_builder({"bundle": str(BUNDLE), "replicas": "3", "index_dir": "idx"}), Application)
    with pytest.raises(UserError, match="autoscale_max"):
        app_builder({"replicas": "3", "autoscale_max": "2"})
    s = replica_settings(Settings(bundle="models/default", replicas=2, autoscale_max=6, replica_cpus=2))
    assert s.bundle.is_absolute() and s.threads == 2
    options = api_options(s)
    assert options["autoscaling_config"] == {
        "min_replicas": 2, "initial_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 2.0,
    }  # fmt: skip
    assert "num_replicas" not in options and options["ray_actor_options"] == {"num_cpus": 2}
    assert api_options(Settings(replicas=3))["num_replicas"] == 3
