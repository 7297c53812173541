"""Incremental updates on a built index: durability, replay after a crash, filters, refusals."""

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from distilembed.artifacts import atomic_write_json
from distilembed.errors import UserError
from index.integrity import RESCORE_FILE
from index.live import INDEX_FILE, STORE_FILE, LiveIndex, open_for_bundle
from index.rescore import write_rows
from index.store import Document, DocumentStore
from index.vectors import RESCORED, add, build_index, plan_index, save_index
from tests.test_index_core import clustered

DIM = 16


def make_index(
    directory: Path, n: int = 3000, nlist: int = 32, flat: bool = False, storage: str = "float32"
) -> np.ndarray:
    """A built index dir of ``n`` clustered vectors with ids doc0..; returns the vectors."""
    directory.mkdir(parents=True)
    vectors = clustered(n, DIM)
    plan = plan_index(n, nlist=nlist, flat_below=10**9 if flat else 100, storage=storage)
    store = DocumentStore(directory / STORE_FILE)
    ids, _ = store.upsert([Document(f"doc{i}", f"text {i}", {"group": i % 3}) for i in range(n)])
    store.close()
    index = build_index(vectors, plan)
    add(index, vectors, np.asarray(ids, dtype=np.int64))
    save_index(index, directory / INDEX_FILE)
    if plan.storage in RESCORED:
        write_rows(directory / RESCORE_FILE, np.asarray(ids, dtype=np.int64), vectors, DIM)
    manifest = {"kind": "index", "dim": DIM, "index_type": plan.index_type, "nlist": plan.nlist, "nprobe": 5}
    atomic_write_json(directory / "manifest.json", manifest | {"bundle": {"manifest_sha256": "abc"}})
    return vectors


def unit(seed: int, n: int = 1) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("flat", "storage"),
    [(False, "float32"), (True, "float32"), (False, "sq8"), (False, "pq"), (False, "binary")],
)
def test_upsert_replace_delete_then_search(tmp_path, flat, storage) -> None:
    make_index(tmp_path / "idx", flat=flat, storage=storage)
    live = LiveIndex(tmp_path / "idx")
    new = unit(1)
    assert live.upsert([Document("new", "a new doc", {"group": 9})], new) == (1, 0)
    assert live.search(new, k=1, nprobe=32)[0][0].id == "new"
    replacement = unit(2)
    assert live.upsert([Document("doc5", "doc five, edited")], replacement) == (0, 1)
    hit = live.search(replacement, k=1, nprobe=32)[0][0]
    tolerance = 2e-2 if storage == "sq8" else 1e-5  # sq8: one byte per dimension; pq, binary: rescored
    assert (hit.id, hit.text) == ("doc5", "doc five, edited")
    assert hit.score == pytest.approx(1.0, abs=tolerance)
    assert live.delete(["doc5", "never-existed"]) == ["doc5"]
    assert all(h.id != "doc5" for h in live.search(replacement, k=20, nprobe=32)[0])
    assert live.ntotal == 3000 and live.get("doc5") is None


def test_acknowledged_writes_survive_kill_9(tmp_path) -> None:
    """A child process upserts and deletes, reports success, then is SIGKILLed before any checkpoint."""
    make_index(tmp_path / "idx")
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import numpy as np
        from index.live import LiveIndex
        from index.store import Document
        live = LiveIndex({str(tmp_path / "idx")!r})
        rng = np.random.default_rng(7)
        v = rng.normal(size=(50, {DIM})).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        live.upsert([Document(f"new{{i}}", f"new {{i}}") for i in range(50)], v)
        live.delete(["doc1", "doc2"])
        print("acknowledged", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        check=False,
    )
    assert child.returncode == -signal.SIGKILL and "acknowledged" in child.stdout
    live = LiveIndex(tmp_path / "idx")
    assert live.ntotal == 3000 + 50 - 2
    rng = np.random.default_rng(7)
    v = rng.normal(size=(50, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    assert [h[0].id for h in live.search(v, k=1, nprobe=32)] == [f"new{i}" for i in range(50)]
    assert live.get("doc1") is None and live.get("new49").text == "new 49"


def test_checkpoint_folds_the_log_and_replay_is_idempotent(tmp_path) -> None:
    make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx")
    live.upsert([Document("x", "x")], unit(3))
    live.delete(["doc0"])
    # A crash after the snapshot was written but before the log was dropped replays it again.
    save_index(live.index, tmp_path / "idx" / INDEX_FILE)
    live.close(checkpoint=False)  # the crash
    again = LiveIndex(tmp_path / "idx")
    assert again.ntotal == live.ntotal == 3000
    assert again.search(unit(3), k=1, nprobe=32)[0][0].id == "x"
    again.close()
    assert DocumentStore(tmp_path / "idx" / STORE_FILE).changes() == []
    reopened = LiveIndex(tmp_path / "idx")
    assert reopened.ntotal == 3000 and reopened.get("doc0") is None


def test_automatic_checkpoint(tmp_path) -> None:
    make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx", checkpoint_every=10)
    live.upsert([Document(f"n{i}", "t") for i in range(12)], unit(4, 12))
    assert live.store.changes() == []  # folded into the Faiss file
    assert LiveIndex(tmp_path / "idx", writable=False).ntotal == 3012


def test_one_writer_per_directory(tmp_path) -> None:
    """A second writer would checkpoint without the first one's vectors and drop their log rows."""
    make_index(tmp_path / "idx")
    writer = LiveIndex(tmp_path / "idx")
    with pytest.raises(UserError, match=r"already open for writing \(pid \d+\)"):
        LiveIndex(tmp_path / "idx")
    writer.upsert([Document("x", "x")], unit(3))
    reader = LiveIndex(tmp_path / "idx", writable=False)  # replays the writer's logged change
    assert reader.search(unit(3), k=1, nprobe=32)[0][0].id == "x"
    with pytest.raises(UserError, match="read-only"):
        reader.delete(["x"])
    reader.close()
    assert len(DocumentStore(tmp_path / "idx" / STORE_FILE).changes()) == 1  # a reader never checkpoints
    writer.close()
    after = LiveIndex(tmp_path / "idx")
    assert after.search(unit(3), k=1, nprobe=32)[0][0].id == "x" and after.store.changes() == []


def test_metadata_filter(tmp_path) -> None:
    vectors = make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx")
    hits = live.search(vectors[:5], k=10, nprobe=32, where={"group": 1})
    assert all(h.metadata["group"] == 1 for row in hits for h in row)
    assert hits[1][0].id == "doc1"  # doc1 is in group 1 and is its own nearest neighbour
    assert live.search(vectors[:2], k=10, where={"group": 7}) == [[], []]


def test_refusals(tmp_path) -> None:
    make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx")
    with pytest.raises(UserError, match="16-d"):
        live.upsert([Document("a", "a")], np.zeros((1, 8), dtype=np.float32))
    with pytest.raises(UserError, match="shape"):
        live.upsert([Document("a", "a"), Document("b", "b")], unit(1))
    with pytest.raises(UserError, match="16-d"):
        live.search(np.zeros((1, 8), dtype=np.float32))
    live.close()
    with pytest.raises(UserError, match="8-d vectors"):
        open_for_bundle(tmp_path / "idx", dim=8)
    with pytest.raises(UserError, match="another bundle"):
        open_for_bundle(tmp_path / "idx", dim=DIM, bundle_sha256="def")
    opened = open_for_bundle(tmp_path / "idx", dim=DIM, bundle_sha256="abc")
    assert opened.dim == DIM and opened.writable  # the refused opens released the writer lock
    opened.close()
    with pytest.raises(UserError, match="not an index"):
        LiveIndex(tmp_path)
    assert LiveIndex(tmp_path / "idx").ntotal == 3000  # the refusals changed nothing


def test_try_search_answers_now_or_not_at_all(tmp_path) -> None:
    """The search the event loop and the encoder threads run: the same hits as ``search``; None while
    another thread holds the index or when it would scan more vectors than allowed."""
    make_index(tmp_path / "idx", nlist=32)
    live = LiveIndex(tmp_path / "idx")
    query = unit(3)  # one row
    assert live.try_search(query, 7, max_scanned=10_000) == live.search(query, 7)
    assert live.try_search(query, 7, max_scanned=3000 * 5 // 32 - 1) is None  # 5 of 32 lists
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with live._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=writer)
    thread.start()
    held.wait()
    try:
        assert live.try_search(query, 7, max_scanned=10_000) is None
    finally:
        release.set()
        thread.join()
    several = unit(4, n=3)
    assert live.try_search(several, 7, max_scanned=10_000) == live.search(several, 7)
    live.close()


def test_try_search_waits_for_another_bounded_search_but_never_for_a_writer(tmp_path) -> None:
    make_index(tmp_path / "idx", nlist=32)
    live = LiveIndex(tmp_path / "idx")
    query = unit(5)
    held, release = threading.Event(), threading.Event()

    def holder(bounded: bool) -> None:
        with live._lock:
            live._bounded += bounded  # as try_search marks its own hold
            held.set()
            release.wait()
            live._bounded -= bounded

    for bounded in (False, True):
        held.clear()
        release.clear()
        thread = threading.Thread(target=holder, args=(bounded,))
        thread.start()
        held.wait()
        timer = threading.Timer(0.05, release.set)  # frees the index while try_search may wait 30 s
        timer.start()
        try:
            found = live.try_search(query, 7, max_scanned=10_000, peer_wait=30.0)
        finally:
            release.set()
            thread.join()
            timer.cancel()
        assert found == (live.search(query, 7) if bounded else None)
    live.close()
