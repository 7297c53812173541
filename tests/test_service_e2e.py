"""The service on real parts: no torch on its import path, the real LiveIndex across a restart, the
packaged ``models/default`` bundle end to end, and the ``serve`` command's settings handling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.testing import FakeEncoder
from tests.service_client import empty_index_dir

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "models" / "default"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DISTILEMBED_{name.upper()}", raising=False)


def test_serving_path_imports_no_torch():
    code = (
        "import sys\n"
        "import service.app, service.server, service.cli, service.testing\n"
        "from distilembed.cli import _register\n"
        "_register()\n"
        "service.app.create_app(service.settings.Settings(bundle='models/default'))\n"
        "heavy = {'torch', 'transformers', 'sentence_transformers'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


def test_durable_upsert_survives_restart(tmp_path):
    pytest.importorskip("index.live")
    from index.live import STORE_FILE
    from index.store import DocumentStore

    index_dir = empty_index_dir(tmp_path / "idx", dim=8)
    settings = Settings(bundle="fake-bundle", index_dir=index_dir, warmup=False)
    docs = [{"id": "k1", "text": "a durable cat", "metadata": {"n": 1}}, {"id": "k2", "text": "a dog"}]
    with TestClient(create_app(settings, FakeEncoder())) as client:
        r = client.post("/documents", json={"documents": docs})
        assert r.status_code == 200 and r.json()["added"] == 2
        # acknowledged = committed: a separate reader already sees it, before any checkpoint or close
        store = DocumentStore(index_dir / STORE_FILE)
        assert store.get("k1") is not None
        store.close()
        assert client.delete("/documents/k2").status_code == 200
        assert client.get("/info").json()["index"]["ntotal"] == 1

    with TestClient(create_app(settings, FakeEncoder())) as client:  # a restarted service
        got = client.get("/documents/k1").json()
        assert (got["text"], got["metadata"]) == ("a durable cat", {"n": 1})
        assert client.get("/documents/k2").status_code == 404
        hits = client.post("/search", json={"query": "a durable cat", "top_k": 3}).json()["results"]
        assert [h["id"] for h in hits] == ["k1"] and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
        assert client.post("/search", json={"query": "cat", "filter": {"n": 2}}).json()["results"] == []
        r = client.post("/index/retrain", json={"nlist": 4, "flat_below": 1})  # one document: flat stays
        assert r.status_code == 200 and r.json()["index"]["type"] == "flat"
        assert r.json()["retrained"]["from"] == {"index_type": "flat", "nlist": 0}
        assert client.get("/documents/k1").status_code == 200


def test_dim_mismatch_refuses_to_start(tmp_path):
    pytest.importorskip("index.live")
    index_dir = empty_index_dir(tmp_path / "idx", dim=16)
    app = create_app(Settings(bundle="fake-bundle", index_dir=index_dir, warmup=False), FakeEncoder(dim=8))
    with pytest.raises(Exception, match="16-d"), TestClient(app):
        pass


@pytest.fixture(scope="module")
def real_client(tmp_path_factory):
    if not (BUNDLE / "manifest.json").is_file():
        pytest.skip("models/default bundle not present")
    from index.build import BuildConfig, build
    from index.corpus import CorpusSpec

    corpus = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    rows = [
        {"id": "cat", "text": "A cat is sleeping on the sofa.", "lang": "en"},
        {"id": "stock", "text": "The stock market fell sharply today.", "lang": "en"},
        {"id": "rain", "text": "Heavy rain is expected this weekend.", "lang": "en"},
        {"id": "guitar", "text": "He plays the guitar in a rock band.", "lang": "en"},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path_factory.mktemp("index") / "idx"
    build(
        BuildConfig(bundle=str(BUNDLE), out=str(out), threads=1),
        CorpusSpec(corpus, metadata_columns=("lang",)),
    )
    settings = Settings(bundle=BUNDLE, index_dir=out, threads=1, max_batch=8)
    with TestClient(create_app(settings)) as client:
        yield client


def test_real_bundle_end_to_end(real_client):
    from export.runtime import Encoder, bundle_identity

    texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The weather is cold."]
    body = real_client.post("/v1/embeddings", json={"input": texts}).json()
    served = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    direct = Encoder(BUNDLE, "int8", threads=1).encode(texts)
    assert served.shape == (3, 128)
    np.testing.assert_allclose((served * direct).sum(axis=1), 1.0, atol=1e-5)
    assert body["usage"]["prompt_tokens"] > 3

    scores = real_client.post(
        "/similarity", json={"inputs": {"source_sentence": texts[0], "sentences": texts[1:]}}
    ).json()
    assert scores[0] > scores[1]

    hits = real_client.post("/search", json={"query": "a kitten naps on the couch", "top_k": 2}).json()
    assert hits["results"][0]["id"] == "cat" and hits["results"][0]["metadata"] == {"lang": "en"}

    info = real_client.get("/info").json()
    assert info["dim"] == 128 and info["variant"] == "int8" and info["model"] == "default"
    assert info["bundle_sha256"] == bundle_identity(BUNDLE)  # the manifest's sha256 without int8 ranges
    assert info["index"]["ntotal"] == 4 and info["index"]["type"] == "flat"
    assert real_client.get("/ready").json()["ready"] is True


def test_serve_command_settings(monkeypatch):
    from distilembed.errors import UserError
    from service.settings import load_settings

    monkeypatch.setenv("DISTILEMBED_PORT", "9000")
    monkeypatch.setenv("DISTILEMBED_MAX_BATCH", "16")
    s = load_settings({"max_batch": 4})  # a flag beats the env var
    assert (s.port, s.max_batch) == (9000, 4)
    with pytest.raises(UserError, match="max_batch"):
        load_settings({"max_batch": 0})


def test_stop_signal_turns_readiness_off_before_draining():
    import signal

    import uvicorn

    from service.server import _Server

    app = create_app(Settings(bundle="fake-bundle", warmup=False), FakeEncoder())
    state = app.state.service
    state.ready = True
    server = _Server(uvicorn.Config(app), state)
    server.handle_exit(signal.SIGTERM, None)
    assert state.ready is False and server.should_exit


def test_serve_refuses_a_missing_bundle_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "distilembed.cli", "serve", "--bundle", str(tmp_path / "nope")],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "not a bundle" in result.stderr
    assert "Traceback" not in result.stderr


def test_create_index_serves_an_empty_index_that_takes_upserts(tiny_bundle, tmp_path):
    from distilembed.errors import UserError

    index_dir = tmp_path / "fresh"
    with (
        pytest.raises(UserError, match="--create-index"),
        TestClient(create_app(Settings(bundle=tiny_bundle, index_dir=index_dir, warmup=False))),
    ):
        pass
    assert not index_dir.exists()
    settings = Settings(bundle=tiny_bundle, index_dir=index_dir, create_index=True, threads=1, warmup=False)
    with TestClient(create_app(settings)) as client:
        assert client.get("/info").json()["index"]["ntotal"] == 0
        docs = [{"id": "a", "text": "the cat sleeps ."}, {"id": "b", "text": "stocks fall ."}]
        assert client.post("/documents", json={"documents": docs}).json()["added"] == 2
        hits = client.post("/search", json={"query": "the cat sleeps .", "top_k": 1}).json()["results"]
        assert hits[0]["id"] == "a"
    with TestClient(create_app(settings)) as client:  # restarted: the same index, not a new one
        assert client.get("/info").json()["index"]["ntotal"] == 2
