"""A read-only LiveIndex catching up with a writer on the same directory (LiveIndex.refresh).

One process holds both; every refresh is an explicit call, and the races with a checkpoint are
forced by running the writer's checkpoint from inside the reader's refresh at the racy step.
"""

from pathlib import Path

import numpy as np
import pytest

from index.live import INDEX_FILE, LiveIndex
from index.store import Document
from tests.test_index_live import make_index, unit


@pytest.fixture
def pair(tmp_path: Path):
    make_index(tmp_path / "idx", n=2000)
    writer = LiveIndex(tmp_path / "idx")
    reader = LiveIndex(tmp_path / "idx", writable=False)
    yield writer, reader
    reader.close()
    writer.close()


def top1(index: LiveIndex, vectors: np.ndarray) -> list[str | None]:
    return [row[0].id if row else None for row in index.search(vectors, k=1, nprobe=32)]


def same_answers(writer: LiveIndex, reader: LiveIndex, queries: np.ndarray) -> None:
    assert reader.ntotal == writer.ntotal
    got = reader.search(queries, k=5, nprobe=32)
    want = writer.search(queries, k=5, nprobe=32)
    assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in want]


def test_refresh_applies_upserts_replacements_and_deletes(pair) -> None:
    writer, reader = pair
    new, moved = unit(1), unit(2)
    writer.upsert([Document("new", "a new doc")], new)
    writer.upsert([Document("doc5", "doc five, moved")], moved)
    writer.delete(["doc7"])
    # documents come from SQLite (current at once); the vectors wait for a refresh
    assert reader.get("new").text == "a new doc" and reader.get("doc7") is None
    assert top1(reader, new) != ["new"]
    assert reader.refresh() == 3
    assert top1(reader, np.vstack([new, moved])) == ["new", "doc5"]
    assert reader.ntotal == 2000 and reader.refresh() == 0
    same_answers(writer, reader, unit(3, 20))


def test_refresh_after_a_checkpoint_reloads_the_snapshot(pair) -> None:
    writer, reader = pair
    writer.upsert([Document("a", "a")], unit(1))
    assert reader.refresh() == 1
    writer.upsert([Document("b", "b")], unit(2))
    writer.delete(["a", "doc1"])
    writer.checkpoint()  # a new file; the log rows it covers are dropped
    assert writer.store.changes() == []
    writer.upsert([Document("c", "c")], unit(3))  # logged after the checkpoint
    before = reader._snapshot
    assert reader.refresh() == 1  # reloaded, then the one remaining row
    assert reader._snapshot != before
    assert top1(reader, np.vstack([unit(2), unit(3)])) == ["b", "c"]
    assert "a" not in {h.id for h in reader.search(unit(1), k=10, nprobe=32)[0]}
    same_answers(writer, reader, unit(4, 20))


def test_checkpoint_between_file_read_and_log_read_is_retried(pair, monkeypatch) -> None:
    """The reader loads the file, the writer checkpoints (dropping rows the loaded file lacks),
    then the reader reads the log: the file moved, so it loads again."""
    writer, reader = pair
    writer.upsert([Document("x", "x")], unit(1))
    writer.checkpoint()
    writer.upsert([Document("y", "y")], unit(2))
    real = reader._changes_after
    calls: list[int] = []

    def racing(seq: int):
        calls.append(seq)
        if len(calls) == 1:
            writer.upsert([Document("z", "z")], unit(3))
            writer.checkpoint()  # covers y and z; their rows are gone from the log
            assert writer.store.changes() == []
        return real(seq)

    monkeypatch.setattr(reader, "_changes_after", racing)
    reader.refresh()
    assert len(calls) >= 2  # the first log read was refused
    assert top1(reader, np.vstack([unit(1), unit(2), unit(3)])) == ["x", "y", "z"]
    same_answers(writer, reader, unit(4, 20))


def test_checkpoint_during_the_fast_path_falls_back_to_a_reload(pair, monkeypatch) -> None:
    writer, reader = pair
    real = reader._changes_after
    done: list[bool] = []

    def racing(seq: int):
        if not done:  # the reader saw its file unchanged, then this checkpoint lands
            done.append(True)
            writer.upsert([Document("p", "p")], unit(5))
            writer.checkpoint()
        return real(seq)

    monkeypatch.setattr(reader, "_changes_after", racing)
    reader.refresh()
    assert top1(reader, unit(5)) == ["p"]
    same_answers(writer, reader, unit(6, 20))


def test_refresh_follows_a_retrain(pair) -> None:
    writer, reader = pair
    writer.upsert([Document("r", "r")], unit(7))
    manifest = writer.retrain(nlist=8, storage="sq8", flat_below=10)
    assert manifest["index_type"] == "ivf_sq8" and reader.kind == "ivf"
    writer.upsert([Document("s", "s")], unit(8))  # after the swap: in the log only
    reader.refresh()
    assert (reader.kind, reader.nlist) == ("ivf_sq8", 8)
    assert reader.manifest["index_type"] == "ivf_sq8"
    assert top1(reader, np.vstack([unit(7), unit(8)])) == ["r", "s"]
    same_answers(writer, reader, unit(9, 20))


def test_a_reader_opened_during_a_checkpoint_is_consistent(tmp_path, monkeypatch) -> None:
    """Opening read-only uses the same consistent load as a refresh."""
    make_index(tmp_path / "idx", n=500, flat=True)
    writer = LiveIndex(tmp_path / "idx")
    writer.upsert([Document("u", "u")], unit(1))
    real_changes_after = LiveIndex._changes_after
    raced: list[bool] = []

    def racing(self: LiveIndex, seq: int):
        if not self.writable and not raced:
            raced.append(True)
            writer.upsert([Document("v", "v")], unit(2))
            writer.checkpoint()
        return real_changes_after(self, seq)

    monkeypatch.setattr(LiveIndex, "_changes_after", racing)
    reader = LiveIndex(tmp_path / "idx", writable=False)
    assert raced and top1(reader, np.vstack([unit(1), unit(2)])) == ["u", "v"]
    reader.close()
    writer.close()


def test_writer_refresh_is_a_no_op_and_readers_never_write(pair) -> None:
    writer, reader = pair
    writer.upsert([Document("w", "w")], unit(1))
    assert writer.refresh() == 0
    stat = (reader.dir / INDEX_FILE).stat()
    reader.refresh()
    reader.checkpoint()
    assert (reader.dir / INDEX_FILE).stat() == stat and len(writer.store.changes()) == 1
