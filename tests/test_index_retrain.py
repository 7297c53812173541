"""Retraining a live index: an index grown from empty becomes IVF, same ids and documents, nothing
re-encoded, and writes made while it trains are kept."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import faiss
import numpy as np
import pytest

import index.live
import index.retrain
from distilembed.artifacts import read_manifest
from distilembed.errors import BusyError, UserError
from index.live import LiveIndex
from index.store import Document
from index.vectors import add, build_index, held_vectors, plan_index
from tests.test_index_core import clustered
from tests.test_index_live import DIM, make_index, unit


@pytest.mark.parametrize("storage", ["float32", "sq8"])
def test_held_vectors_round_trip(storage: str) -> None:
    vectors = clustered(2000, DIM)
    ids = np.arange(2000, dtype=np.int64) * 3 + 1
    for plan in (plan_index(2000, flat_below=10**9), plan_index(2000, 16, 100, storage)):
        index = build_index(vectors, plan)
        add(index, vectors, ids)
        got_ids, got = held_vectors(index)
        order = np.argsort(got_ids)
        assert (got_ids[order] == ids).all()
        if plan.storage == "float32":
            np.testing.assert_allclose(got[order], vectors, atol=1e-6)
        else:  # decoded from one byte per dimension; rare residuals beyond the trained range clip
            cosines = np.sum(got[order] * vectors, axis=1)
            assert np.median(cosines) > 0.999 and cosines.min() > 0.95
        if isinstance(index, faiss.IndexIVF):
            assert index.direct_map.type == faiss.DirectMap.NoMap  # not saved with a direct map


def test_flat_index_grown_by_upserts_becomes_ivf(tmp_path) -> None:
    vectors = make_index(tmp_path / "idx", flat=True)
    live = LiveIndex(tmp_path / "idx")
    live.upsert([Document("late", "logged, not yet in the snapshot")], unit(5))
    live.delete(["doc3"])
    manifest = live.retrain(nlist=32, flat_below=100)
    assert (manifest["index_type"], manifest["nlist"], manifest["ntotal"]) == ("ivf", 32, 3000)
    assert manifest["retrained"]["from"] == {"index_type": "flat", "nlist": 0}
    assert (live.kind, live.nlist) == ("ivf", 32) and live.store.changes() == []
    live.close()
    assert read_manifest(tmp_path / "idx")["index_type"] == "ivf"
    reopened = LiveIndex(tmp_path / "idx")
    assert isinstance(reopened.index, faiss.IndexIVF)
    found = [row[0].id for row in reopened.search(vectors[:50], k=1, nprobe=32)]
    assert [f for i, f in enumerate(found) if i != 3] == [f"doc{i}" for i in range(50) if i != 3]
    assert found[3] != "doc3"  # deleted before the retrain
    assert reopened.search(unit(5), k=1, nprobe=32)[0][0].id == "late"
    assert reopened.get("doc7").metadata == {"group": 1}


def test_writes_during_training_and_saving_are_kept(tmp_path, monkeypatch) -> None:
    """Searches and writes go on while the new index trains and while it is saved; here they
    write, and even ask for a checkpoint after every change, which must wait for the swap."""
    make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx", checkpoint_every=1)
    real_build, real_save = index.retrain.build_index, index.live.save_index

    def build_while_writing(*args, **kwargs):
        live.upsert([Document("during", "written while the new index trains")], unit(6))
        live.delete(["doc8"])
        with pytest.raises(BusyError):
            live.retrain(nlist=16, flat_below=100)
        assert live.search(unit(6), k=1, nprobe=32)[0][0].id == "during"  # the old index serves
        return real_build(*args, **kwargs)

    def save_while_writing(index_, path):
        live.upsert([Document("saving", "written while the new index is saved")], unit(7))
        real_save(index_, path)

    monkeypatch.setattr(index.retrain, "build_index", build_while_writing)
    monkeypatch.setattr(index.live, "save_index", save_while_writing)
    live.retrain(nlist=16, flat_below=100)
    assert live.nlist == 16 and live.ntotal == 3001
    assert [row[0].id for row in live.search(np.vstack([unit(6), unit(7)]), k=1, nprobe=16)] == [
        "during",
        "saving",
    ]
    assert len(live.store.changes()) == 1  # "saving" is not in the saved file: its log row stays
    monkeypatch.undo()
    live.close()
    reopened = LiveIndex(tmp_path / "idx", writable=False)
    assert [row[0].id for row in reopened.search(np.vstack([unit(6), unit(7)]), k=1, nprobe=16)] == [
        "during",
        "saving",
    ]
    assert reopened.get("doc8") is None and reopened.ntotal == 3001


def test_retrain_switches_storage_and_refuses_bad_input(tmp_path) -> None:
    make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx")
    with pytest.raises(UserError, match="--storage must be one of"):
        live.retrain(storage="opq")
    assert live.retrain(nlist=16, storage="sq8", flat_below=100)["index_type"] == "ivf_sq8"
    assert live.retrain(nlist=16, flat_below=100)["index_type"] == "ivf_sq8"  # kept
    assert isinstance(live.index, faiss.IndexIVFScalarQuantizer) and live.ntotal == 3000
    live.close()
    with pytest.raises(UserError, match="read-only"):
        LiveIndex(tmp_path / "idx", writable=False).retrain()


@pytest.mark.parametrize("die_in", ["save_index", "atomic_write_json"])
def test_kill_9_during_retrain_loses_nothing(tmp_path, die_in: str) -> None:
    """SIGKILL while the new index file is written (the old one stays), or after it replaced the old
    one but before the manifest was updated (the labels are stale until the next retrain)."""
    make_index(tmp_path / "idx", flat=True)
    script = textwrap.dedent(
        f"""
        import os, signal
        import faiss
        import index.live, index.retrain
        from index.live import LiveIndex
        from index.store import Document
        from tests.test_index_live import unit
        live = LiveIndex({str(tmp_path / "idx")!r})
        live.upsert([Document("acked", "acknowledged before the retrain")], unit(9))
        print("acknowledged", flush=True)
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        module = index.live if {die_in!r} == "save_index" else index.retrain
        real = getattr(module, {die_in!r})
        def hooked(*args, **kwargs):
            if {die_in!r} == "save_index" and isinstance(args[0], faiss.IndexIVF):
                die()  # the new index, before it replaces the old file (the snapshot went first)
            if {die_in!r} == "atomic_write_json":
                die()
            return real(*args, **kwargs)
        setattr(module, {die_in!r}, hooked)
        live.retrain(nlist=16, flat_below=100)
        """
    )
    root = Path(__file__).parents[1]
    command = [sys.executable, "-c", script]
    child = subprocess.run(command, capture_output=True, text=True, cwd=root, check=False)
    assert child.returncode == -signal.SIGKILL and "acknowledged" in child.stdout, child.stderr
    live = LiveIndex(tmp_path / "idx")
    assert live.ntotal == 3001 and live.search(unit(9), k=1, nprobe=16)[0][0].id == "acked"
    assert isinstance(live.index, faiss.IndexIVF) == (die_in == "atomic_write_json")
    assert live.kind == "flat"  # the manifest was not rewritten either way
    assert live.retrain(nlist=16, flat_below=100)["index_type"] == "ivf" and live.kind == "ivf"
    live.close()
