"""Snapshots of a live index: consistent while it is written, checked on restore, taken from
another process than the writer, and refused where they cannot be exact."""

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import index.live
import index.retrain
import index.snapshot
from distilembed.artifacts import atomic_write_json, read_manifest
from distilembed.errors import BusyError, UserError
from index.integrity import INDEX_FILE, IVFDATA_FILE, STORE_FILE
from index.live import LiveIndex
from index.snapshot import SNAPSHOT_KIND, restore_snapshot, take_snapshot
from index.store import Document
from index.verify import verify_index
from tests.test_index_integrity import cli, flip_byte, sealed_index, truncate
from tests.test_index_live import unit

Op = tuple[str, int]  # ("up", i): document w{i} upserted; ("del", i): doc{i} deleted


class Writer(threading.Thread):
    """Upserts a new document, then deletes an original one, over and over; records each write
    once it is acknowledged (returned)."""

    def __init__(self, live: LiveIndex) -> None:
        super().__init__(daemon=True)
        self.live, self.ops, self.errors = live, [], []
        self.stop, self.progress = threading.Event(), threading.Condition()

    def _acked(self, op: Op) -> None:
        with self.progress:
            self.ops.append(op)
            self.progress.notify_all()

    def run(self) -> None:
        try:
            i = 0
            while not self.stop.is_set():
                self.live.upsert([Document(f"w{i}", f"written {i}")], unit(1000 + i))
                self._acked(("up", i))
                self.live.delete([f"doc{i}"])
                self._acked(("del", i))
                i += 1
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)
            with self.progress:
                self.progress.notify_all()

    def wait_for(self, count: int) -> None:
        with self.progress:
            assert self.progress.wait_for(lambda: len(self.ops) >= count or self.errors, timeout=120)
        assert not self.errors, self.errors


def visible(restored: LiveIndex, op: Op) -> bool:
    kind, i = op
    return restored.get(f"w{i}") is not None if kind == "up" else restored.get(f"doc{i}") is None


def test_snapshot_holds_the_writes_acknowledged_before_it_and_none_after(tmp_path, monkeypatch) -> None:
    sealed_index(tmp_path / "idx", n=2000)
    live = LiveIndex(tmp_path / "idx", checkpoint_every=5)  # the file is replaced during the snapshot
    writer = Writer(live)
    writer.start()
    writer.wait_for(10)
    real_backup = index.snapshot._backup

    def backup_while_writing(source, dest: Path) -> None:  # the Faiss file is pinned by now
        writer.wait_for(len(writer.ops) + 30)
        real_backup(source, dest)

    monkeypatch.setattr(index.snapshot, "_backup", backup_while_writing)
    before = len(writer.ops)
    snap = live.snapshot(tmp_path / "snap")
    after = len(writer.ops)
    writer.wait_for(after + 4)
    writer.stop.set()
    writer.join()
    assert snap["kind"] == SNAPSHOT_KIND and snap["faiss_file"] == "hard link"
    assert 0 < snap["blocking_seconds"] < snap["seconds"]
    linked = (tmp_path / "snap" / "index" / INDEX_FILE).stat().st_ino
    assert linked != (tmp_path / "idx" / INDEX_FILE).stat().st_ino  # checkpoints replaced it meanwhile
    live.close()

    restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    restored = LiveIndex(tmp_path / "restored", writable=False)
    seen = [visible(restored, op) for op in writer.ops]
    kept = sum(seen)
    assert seen == [True] * kept + [False] * (len(seen) - kept)  # exactly a prefix of the writes
    assert after - before >= 30  # written while the snapshot was taken
    assert before <= kept <= after + 1  # all acknowledged before the call, none after it returned
    upserted = [i for kind, i in writer.ops[:kept] if kind == "up"]
    deleted = kept - len(upserted)
    assert restored.ntotal == snap["ntotal"] == 2000 + len(upserted) - deleted
    hits = restored.search(np.vstack([unit(1000 + i) for i in upserted]), k=1, nprobe=32)
    assert [row[0].id for row in hits] == [f"w{i}" for i in upserted]
    restored.close()
    assert verify_index(tmp_path / "restored")["ntotal"] == snap["ntotal"]


def test_a_reader_snapshot_pins_again_when_a_checkpoint_lands(tmp_path, monkeypatch) -> None:
    sealed_index(tmp_path / "idx", n=1000)
    writer = LiveIndex(tmp_path / "idx")
    writer.upsert([Document("early", "early")], unit(1))
    real_identity = index.snapshot.file_identity
    calls: list[Path] = []

    def racing(path: Path):
        calls.append(path)
        if len(calls) == 1:  # after the file was opened and the read transaction began
            writer.upsert([Document("raced", "written and checkpointed during the pin")], unit(2))
            writer.checkpoint()
        return real_identity(path)

    monkeypatch.setattr(index.snapshot, "file_identity", racing)
    snap = LiveIndex(tmp_path / "idx", writable=False).snapshot(tmp_path / "snap")
    assert len(calls) == 2 and snap["source"]["pinned_by"] == "reader"
    writer.close()
    restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    restored = LiveIndex(tmp_path / "restored", writable=False)
    assert restored.ntotal == 1002 and restored.get("raced") is not None
    assert restored.search(np.vstack([unit(1), unit(2)]), k=1, nprobe=32)[1][0].id == "raced"


def tamper_manifest(snap: Path) -> None:
    manifest = read_manifest(snap)
    manifest["files"][f"index/{INDEX_FILE}"]["sha256"] = "0" * 64
    atomic_write_json(snap / "manifest.json", manifest)


def tamper_index_manifest(snap: Path) -> None:
    manifest = read_manifest(snap / "index")
    atomic_write_json(snap / "index" / "manifest.json", manifest | {"nprobe": 64})


TAMPERING = {
    "byte changed": (lambda s: flip_byte(s / "index" / INDEX_FILE), r"index/vectors\.faiss has sha256"),
    "store truncated": (
        lambda s: truncate(s / "index" / STORE_FILE),
        r"index/docs\.sqlite is [\d,]+ bytes, the manifest records [\d,]+ \(truncated\?\)",
    ),
    "checksum edited": (
        tamper_manifest,
        r"index/vectors\.faiss has sha256 \w+\.\.\., the manifest records 0{16}",
    ),
    "index manifest edited": (
        tamper_index_manifest,
        r"index/manifest\.json is [\d,]+ bytes|index/manifest\.json has",
    ),
    "file removed": (lambda s: (s / "index" / STORE_FILE).unlink(), r"index/docs\.sqlite is missing"),
}


@pytest.mark.parametrize("tampering", list(TAMPERING))
def test_restore_refuses_a_tampered_snapshot(tmp_path, tampering: str) -> None:
    sealed_index(tmp_path / "idx", n=1000)
    live = LiveIndex(tmp_path / "idx")
    snap = live.snapshot(tmp_path / "snap", link=False)  # tampering must not reach the index
    assert snap["faiss_file"] == "copy"
    live.close()
    apply, message = TAMPERING[tampering]
    apply(tmp_path / "snap")
    with pytest.raises(UserError, match=message) as refused:
        restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    assert "\n" not in str(refused.value) and str(refused.value).startswith(f"snapshot {tmp_path / 'snap'}: ")
    assert not (tmp_path / "restored").exists() and not list(tmp_path.glob(".restored*"))
    with pytest.raises(UserError, match=message):
        verify_index(tmp_path / "snap")
    result = cli("restore", str(tmp_path / "snap"), "--out", str(tmp_path / "restored"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert LiveIndex(tmp_path / "idx", writable=False).ntotal == 1000  # the source is untouched


def test_snapshot_cli_while_a_writer_holds_the_lock_then_restore(tmp_path) -> None:
    sealed_index(tmp_path / "idx", n=1000)
    writer = LiveIndex(tmp_path / "idx")  # as a service holds it
    writer.upsert([Document("acked", "in the log, not yet in the Faiss file")], unit(3))
    writer.delete(["doc1"])
    taken = cli("snapshot", "--index", str(tmp_path / "idx"), "--out", str(tmp_path / "snap"))
    assert taken.returncode == 0, taken.stderr
    line = json.loads(taken.stdout)
    assert line["ntotal"] == 1000 and line["snapshot"] == str(tmp_path / "snap")
    writer.upsert([Document("late", "after the snapshot")], unit(4))

    restored = tmp_path / "restored"
    done = cli("restore", str(tmp_path / "snap"), "--out", str(restored))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ntotal"] == 1000
    checked = cli("verify", str(restored))
    assert checked.returncode == 0 and json.loads(checked.stdout)["documents"] == 1000
    live = LiveIndex(restored)
    assert live.get("acked") is not None and live.get("doc1") is None and live.get("late") is None
    assert live.search(unit(3), k=1, nprobe=32)[0][0].id == "acked"
    again = cli("restore", str(tmp_path / "snap"), "--out", str(restored), "--overwrite")
    assert again.returncode == 2 and "already open for writing" in again.stderr  # live holds it
    live.close()

    refused = cli("restore", str(tmp_path / "snap"), "--out", str(restored))
    assert refused.returncode == 2 and "output exists" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    (restored / "stray").write_text("replaced with the directory")
    assert cli("restore", str(tmp_path / "snap"), "--out", str(restored), "--overwrite").returncode == 0
    assert not (restored / "stray").exists() and LiveIndex(restored, writable=False).ntotal == 1000
    writer.close()


def test_snapshot_waits_for_no_retrain_and_refuses_a_taken_output(tmp_path, monkeypatch) -> None:
    sealed_index(tmp_path / "idx", n=2000, flat=True)
    live = LiveIndex(tmp_path / "idx")
    real_build = index.retrain.build_index
    refused: list[str] = []

    def build_then_snapshot(*args, **kwargs):
        with pytest.raises(BusyError, match="a retrain is running") as busy:
            live.snapshot(tmp_path / "during")
        refused.append(str(busy.value))
        return real_build(*args, **kwargs)

    monkeypatch.setattr(index.retrain, "build_index", build_then_snapshot)
    live.retrain(nlist=16, flat_below=100)
    assert refused and not (tmp_path / "during").exists() and not list(tmp_path.glob(".during*"))
    snap = live.snapshot(tmp_path / "after")
    assert snap["index_type"] == "ivf" and read_manifest(tmp_path / "after" / "index")["nlist"] == 16
    with pytest.raises(UserError, match="output exists"):
        live.snapshot(tmp_path / "after")
    with pytest.raises(UserError, match="not an index directory"):
        take_snapshot(tmp_path, tmp_path / "other")
    live.close()


def test_an_on_disk_index_snapshots_and_restores(tiny_bundle, tmp_path) -> None:
    from index.build import BuildConfig, build
    from index.corpus import CorpusSpec
    from tests.tiny_models import tiny_sentences

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny_sentences(300, seed=8)) + "\n")
    cfg = BuildConfig(
        bundle=str(tiny_bundle), out=str(tmp_path / "idx"), nlist=4, flat_below=100, on_disk=True
    )
    build(cfg, CorpusSpec(corpus))
    source = LiveIndex(tmp_path / "idx", writable=False)
    snap = source.snapshot(tmp_path / "snap")
    assert set(snap["files"]) == {
        f"index/{n}" for n in ("manifest.json", INDEX_FILE, STORE_FILE, IVFDATA_FILE)
    }
    restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    (tmp_path / "idx").rename(tmp_path / "moved")  # the restored lists are its own, not the source's
    report = verify_index(tmp_path / "restored")
    assert report["files"][IVFDATA_FILE] == "sha256 ok" and report["ntotal"] == 300
    restored = LiveIndex(tmp_path / "restored", writable=False)
    queries = np.random.default_rng(5).normal(size=(8, restored.dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    got = restored.search(queries, k=5)
    want = source.search(queries, k=5)
    assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in want]


def test_a_damaged_index_is_not_snapshot(tmp_path) -> None:
    sealed_index(tmp_path / "idx", n=1000)
    live = LiveIndex(tmp_path / "idx")
    flip_byte(tmp_path / "idx" / INDEX_FILE)  # damaged after its check at open
    with pytest.raises(
        UserError, match=r"vectors\.faiss has sha256 .*no snapshot of a damaged index is taken"
    ):
        live.snapshot(tmp_path / "snap")
    assert not (tmp_path / "snap").exists() and not list(tmp_path.glob(".snap*"))
    live.close(checkpoint=False)
