"""Writes forwarded to one index writer (``ReplicaIndex``), searches forwarded to shard deployments
(``ShardHandle``), and ``serve --engine ray``'s setup, without a Ray cluster: the app on a replica
whose writer is an in-process ``LiveIndex``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from distilembed.errors import BusyError, UserError
from index.live import LiveIndex
from index.searcher import SEARCHES, WRITES
from index.store import Document
from service.app import create_app
from service.replica_index import ReplicaIndex, run_call, unwrap
from service.settings import Settings
from service.testing import FakeEncoder, FakeIndex
from tests.service_client import empty_index_dir, wait_until

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DISTILEMBED_{name.upper()}", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[TestClient, LiveIndex, ReplicaIndex]]:
    """The app on a ReplicaIndex whose writer is an in-process LiveIndex on the same directory."""
    directory = empty_index_dir(tmp_path / "idx", dim=8)
    writer = LiveIndex(directory)
    local = LiveIndex(directory, writable=False)
    index = ReplicaIndex(local, lambda method, args: run_call(writer, WRITES, method, *args), refresh_ms=0)
    settings = Settings(bundle="fake-bundle", index_dir=directory, warmup=False)
    with TestClient(create_app(settings, FakeEncoder(), index), raise_server_exceptions=False) as client:
        yield client, writer, index
    writer.close()


def test_writes_go_to_the_writer_and_errors_keep_their_status(replicated, monkeypatch):
    client, writer, index = replicated
    docs = [{"id": "a", "text": "a cat"}, {"id": "b", "text": "a dog"}]
    assert client.post("/documents", json={"documents": docs}).json()["added"] == 2
    assert writer.ntotal == index.ntotal == 2  # the replica caught up with its own write
    assert client.post("/search", json={"query": "a cat", "top_k": 1}).json()["results"][0]["id"] == "a"
    assert client.delete("/documents/b").status_code == 200 and writer.get("b") is None

    def busy(*_: Any) -> None:
        raise BusyError("a retrain is already running")

    monkeypatch.setattr(writer, "retrain", busy)
    r = client.post("/index/retrain", json={})
    assert (r.status_code, r.json()["type"], r.json()["error"]) == (
        409,
        "conflict",
        "a retrain is already running",
    )

    def refuse(*_: Any) -> None:
        raise UserError("no room")

    monkeypatch.setattr(writer, "upsert", refuse)
    r = client.post("/documents", json={"documents": docs})
    assert (r.status_code, r.json()["type"], r.json()["error"]) == (422, "validation_error", "no room")


def test_a_write_from_elsewhere_reaches_searches(replicated):
    """The writer took a write through another replica: this one's next search sees it."""
    client, writer, _ = replicated
    writer.upsert([Document("w", "a fox")], FakeEncoder().encode(["a fox"]))
    writer.checkpoint()  # and even folded it into a new snapshot file
    assert client.post("/search", json={"query": "a fox", "top_k": 1}).json()["results"][0]["id"] == "w"


def test_a_replica_answers_every_search_mode_and_lists_documents(tmp_path):
    """The new searches on a replica see the writer's writes: hybrid and vectors after a refresh,
    lexical and the listing from SQLite."""
    directory = empty_index_dir(tmp_path / "idx", dim=8, lexical=True)
    writer = LiveIndex(directory)
    index = ReplicaIndex(
        LiveIndex(directory, writable=False), lambda m, a: run_call(writer, WRITES, m, *a), 0
    )
    with TestClient(create_app(Settings(bundle="b", warmup=False), FakeEncoder(), index)) as client:
        docs = [Document("r", "a rare zyxwv"), Document("c", "a cat")]
        writer.upsert(docs, FakeEncoder().encode([d.text for d in docs]))  # through another replica
        assert index.lexical and [h.id for h in index.search_lexical("zyxwv")] == ["r"]
        hybrid = client.post("/search", json={"query": "zyxwv", "mode": "hybrid", "fields": ["vector"]})
        assert hybrid.json()["results"][0]["id"] == "r", hybrid.text
        assert hybrid.json()["results"][0]["vector"] == pytest.approx(
            FakeEncoder().encode(["a rare zyxwv"])[0]
        )
        listed = client.get("/documents", params={"limit": 1}).json()
        assert [d["id"] for d in listed["documents"]] == ["r"] and listed["next_cursor"]
    writer.close()


def test_background_refresh(tmp_path):
    """Without refresh-on-search the copy catches up within refresh_ms (polled with a deadline)."""
    directory = empty_index_dir(tmp_path / "idx", dim=8)
    writer = LiveIndex(directory)
    index = ReplicaIndex(
        LiveIndex(directory, writable=False),
        lambda m, a: run_call(writer, WRITES, m, *a),
        20,
        refresh_on_search=False,
    )
    writer.upsert([Document("x", "x")], FakeEncoder().encode(["x"]))
    wait_until(lambda: index.ntotal == 1, "the background refresh to apply the write")
    index.close()
    assert index._thread is not None and not index._thread.is_alive()
    writer.close()


def test_outcomes_cross_as_values():
    class Target:
        def delete(self, ids: list[str]) -> list[str]:
            return ids

        def retrain(self) -> None:
            raise BusyError("busy")

        def count(self, where: dict[str, Any] | None = None) -> int:
            raise UserError(f"bad filter {where}")

    assert run_call(Target(), WRITES, "delete", ["a"]) == ("ok", ["a"])
    assert run_call(Target(), WRITES, "retrain") == ("busy", "busy")
    assert run_call(Target(), SEARCHES, "count", where={"n": []}) == ("user", "bad filter {'n': []}")
    with pytest.raises(BusyError, match="busy"):
        unwrap(("busy", "busy"))
    with pytest.raises(ValueError, match="'search' is not one of add_field_index"):
        run_call(Target(), WRITES, "search")
    with pytest.raises(ValueError, match="'delete' is not one of count, get, list_documents, search"):
        run_call(Target(), SEARCHES, "delete", ["a"])


def test_every_searcher_and_index_method_is_named_once() -> None:
    """The names that cross to a shard or to the writer are the protocol's methods."""
    from index.searcher import IndexLike, Searcher

    def methods(cls: type) -> set[str]:
        return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}

    assert methods(Searcher) == SEARCHES
    assert methods(IndexLike) >= WRITES and not WRITES & SEARCHES


def test_shard_handles_forward_the_searcher_calls():
    """What an Api replica calls on a shard deployment, over a stand-in for its handle."""
    pytest.importorskip("ray")
    from service.ray_serve import ShardHandle

    class Handle:  # DeploymentHandle's shape: handle.read.remote(...).result()
        def __init__(self, index: FakeIndex) -> None:
            self.read = self
            self.index = index

        def remote(self, method: str, args: tuple, kwargs: dict) -> Any:
            outcome = run_call(self.index, SEARCHES, method, *args, **kwargs)
            return type("Response", (), {"result": lambda _: outcome})()

    index, encoder = FakeIndex(), FakeEncoder()
    docs = [Document("a", "a cat", {"n": 1}), Document("b", "a dog", {"n": 2})]
    index.upsert(docs, encoder.encode([d.text for d in docs]))
    shard = ShardHandle(Handle(index))
    assert [h.id for h in shard.search(encoder.encode(["a cat"]), 1)[0]] == ["a"]
    assert shard.count({"n": 2}) == 1 and shard.count(where=None) == 2
    assert shard.get("b") == docs[1] and shard.get("nope") is None
    assert [h.id for h in shard.search_lexical("cat", 2, where={"n": 1})] == ["a"]
    hybrid = shard.search_hybrid(encoder.encode(["a dog"])[0], "dog", 1, fusion="weighted")
    assert [(h.id, h.matched) for h in hybrid] == [("b", ("dense", "lexical"))]
    assert set(shard.vectors(["a", "nope"])) == {"a"}
    assert [d.id for _, d in shard.list_documents(1, 5)] == ["b"]  # after int id 1: the second
    with pytest.raises(UserError, match="fusion"):
        shard.search_hybrid(encoder.encode(["a dog"])[0], "dog", fusion="max")
    with pytest.raises(UserError, match="filter"):
        shard.count({"n": {"$nope": 1}})


def test_engine_ray_without_ray_says_how_to_install():
    code = (
        "import sys\n"
        "sys.modules['ray'] = None\n"  # as if the [ray] extra were not installed
        "sys.argv = ['distilembed', 'serve', '--engine', 'ray']\n"
        "from distilembed.cli import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'distilembed[ray]'" in lines[0]


def test_local_cluster_environment_follows_the_settings() -> None:
    from service.ray_serve import local_cluster_env

    base = Settings(bundle="b")
    assert local_cluster_env(base)["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert local_cluster_env(base)["RAY_SERVE_HAPROXY_METRICS_ENABLED"] == "0"
    assert float(local_cluster_env(base)["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 30
    metrics = base.model_copy(update={"ray_haproxy_metrics": True})
    assert local_cluster_env(metrics)["RAY_SERVE_HAPROXY_METRICS_ENABLED"] == "1"
    assert local_cluster_env(base.model_copy(update={"ray_haproxy": False})) == {}
