"""index retrain: an index grown from empty becomes IVF, same ids and documents, nothing re-encoded."""

import faiss
import numpy as np
import pytest

from distilembed.artifacts import read_manifest
from distilembed.errors import UserError
from index.live import LiveIndex
from index.retrain import held_vectors, retrain
from index.store import Document
from index.vectors import add, build_index, plan_index
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
    live.close(checkpoint=False)  # the change log is still pending when retrain starts

    manifest = retrain(tmp_path / "idx", nlist=32, flat_below=100)
    assert (manifest["index_type"], manifest["nlist"], manifest["ntotal"]) == ("ivf", 32, 3000)
    assert manifest["retrained"]["from"] == {"index_type": "flat", "nlist": 0}
    assert read_manifest(tmp_path / "idx")["index_type"] == "ivf"
    live = LiveIndex(tmp_path / "idx")
    assert isinstance(live.index, faiss.IndexIVF) and live.store.changes() == []
    found = [row[0].id for row in live.search(vectors[:50], k=1, nprobe=32)]
    assert found[:3] + found[4:] == [f"doc{i}" for i in range(50) if i != 3]
    assert live.search(unit(5), k=1, nprobe=32)[0][0].id == "late"
    assert live.get("doc7").metadata == {"group": 1}
    live.close()


def test_retrain_can_switch_storage_and_is_refused_beside_a_writer(tmp_path) -> None:
    make_index(tmp_path / "idx")
    writer = LiveIndex(tmp_path / "idx")
    with pytest.raises(UserError, match="already open for writing"):
        retrain(tmp_path / "idx", nlist=32, flat_below=100)
    writer.close()
    with pytest.raises(UserError, match="--storage must be one of"):
        retrain(tmp_path / "idx", storage="pq")
    assert retrain(tmp_path / "idx", nlist=16, storage="sq8", flat_below=100)["index_type"] == "ivf_sq8"
    assert retrain(tmp_path / "idx", nlist=16, flat_below=100)["index_type"] == "ivf_sq8"  # kept
    live = LiveIndex(tmp_path / "idx", writable=False)
    assert isinstance(live.index, faiss.IndexIVFScalarQuantizer) and live.ntotal == 3000
