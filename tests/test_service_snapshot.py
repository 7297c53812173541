"""POST /index/snapshot on a service that keeps writing: the restored copy holds every write
acknowledged before the request and none sent after its answer."""

from __future__ import annotations

import threading
from pathlib import Path

from fastapi.testclient import TestClient

from index.live import LiveIndex
from index.snapshot import restore_snapshot
from service.app import create_app
from service.settings import Settings
from service.testing import FakeEncoder
from tests.service_client import empty_index_dir


def test_snapshot_route_during_writes_restores_exactly(tmp_path: Path) -> None:
    index_dir = empty_index_dir(tmp_path / "idx", dim=8)
    settings = Settings(bundle="fake-bundle", index_dir=index_dir, warmup=False)
    acked: list[int] = []
    enough, stop, failures = threading.Event(), threading.Event(), []

    with TestClient(create_app(settings, FakeEncoder())) as client:

        def write() -> None:
            i = 0
            while not stop.is_set():
                r = client.post("/documents", json={"documents": [{"id": f"w{i}", "text": f"written {i}"}]})
                if r.status_code != 200:
                    failures.append(r.text)
                    return
                acked.append(i)
                if len(acked) >= 20:
                    enough.set()
                i += 1

        writer = threading.Thread(target=write)
        writer.start()
        assert enough.wait(60), failures
        before = len(acked)
        r = client.post("/index/snapshot")
        after = len(acked)
        assert enough.is_set()
        while len(acked) < after + 5 and not failures:  # writes sent after the answer, to check
            writer.join(0.01)
        stop.set()
        writer.join()
        assert r.status_code == 200 and not failures, (r.text, failures)
        body = r.json()
        assert body["bytes"] > 0 and body["ntotal"] >= before
        # beside the index, by default; named relative to the snapshot directory's parent
        assert body["path"] == f"idx-snapshots/{body['name']}"

    restored = restore_snapshot(tmp_path / body["path"], tmp_path / "restored")
    assert restored["ntotal"] == body["ntotal"]
    live = LiveIndex(tmp_path / "restored", writable=False)
    try:
        assert all(live.get(f"w{i}") is not None for i in range(before))
        # w{after} may have been in flight; every later write was sent after the answer
        assert all(live.get(f"w{i}") is None for i in range(after + 1, len(acked)))
        # a write acknowledged while the request ran may fall on either side of the instant it pins
        assert live.ntotal == body["ntotal"] and before <= live.ntotal <= after + 1
    finally:
        live.close(checkpoint=False)


def test_snapshot_route_without_an_index_or_on_a_sharded_one(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(bundle="fake-bundle", warmup=False), FakeEncoder())) as client:
        r = client.post("/index/snapshot")
        assert r.status_code == 404 and r.json()["type"] == "no_index"
