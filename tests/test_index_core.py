"""The Faiss wrapper and the document store, on small synthetic data (fast, no model)."""

import faiss
import numpy as np
import pytest

from distilembed.errors import UserError
from index.store import Document, DocumentStore
from index.vectors import add, build_index, load_index, plan_index, remove, save_index, search


def clustered(n: int, dim: int = 16, centers: int = 50, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(centers, dim))
    points = means[rng.integers(0, centers, size=n)] + 0.15 * rng.normal(size=(n, dim))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def test_plan_index_adapts_to_corpus_size() -> None:
    assert plan_index(500).kind == "flat"
    small = plan_index(20_000)
    assert small.kind == "ivf" and small.nlist == 20_000 // 39 and "lowered" in small.reason
    assert plan_index(100_000) == plan_index(100_000, nlist=1024)
    assert plan_index(100_000).nlist == 1024
    assert plan_index(30, flat_below=10).kind == "flat"  # fewer than 39 points: not even one list


def test_binary_lists_are_planned_at_about_sqrt_n_below_the_lists_asked() -> None:
    """Binary lists scan fast and their float centroids do not, so a small corpus gets fewer of
    them (decision 43); a corpus of 10^7 gets the 1,024 asked for, and other storages are as before."""
    assert [plan_index(n, storage="binary").nlist for n in (12_000, 36_824, 136_824)] == [109, 191, 369]
    assert "sqrt(n)" in plan_index(36_824, storage="binary").reason
    assert plan_index(10**7, storage="binary").nlist == 1024
    assert plan_index(36_824, nlist=64, storage="binary").nlist == 64  # fewer asked: as asked
    assert plan_index(136_824, storage="pq").nlist == plan_index(136_824).nlist == 1024


def test_ivf_keeps_ids_and_nprobe_survives_save_load(tmp_path) -> None:
    vectors = clustered(4000)
    ids = np.arange(4000, dtype=np.int64) * 10 + 7  # arbitrary stable ids
    plan = plan_index(len(vectors), nlist=64, flat_below=1000)
    index = build_index(vectors, plan)
    add(index, vectors, ids, slice_size=1000)
    assert index.ntotal == 4000
    path = tmp_path / "vectors.faiss"
    save_index(index, path)
    loaded = load_index(path, nprobe=5)
    assert faiss.extract_index_ivf(loaded).nprobe == 5
    scores, found = search(loaded, vectors[:50], k=1, nprobe=64)  # probing every list is exact
    assert (found[:, 0] == ids[:50]).all()
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)


def test_sq8_storage_is_4x_smaller_and_keeps_ids_through_save_load_remove(tmp_path) -> None:
    vectors = clustered(4000, dim=64)
    ids = np.arange(4000, dtype=np.int64) + 100
    sizes = {}
    for storage in ("float32", "sq8"):
        plan = plan_index(len(vectors), nlist=32, flat_below=1000, storage=storage)
        index = build_index(vectors, plan)
        add(index, vectors, ids)
        sizes[storage] = len(faiss.serialize_index(index))
    assert plan.index_type == "ivf_sq8" and isinstance(index, faiss.IndexIVFScalarQuantizer)
    # codes: 64 bytes instead of 256 per vector; ids (8 bytes each) and centroids are the same
    assert sizes["sq8"] < 0.4 * sizes["float32"]
    save_index(index, tmp_path / "sq8.faiss")
    loaded = load_index(tmp_path / "sq8.faiss", nprobe=5)
    scores, found = search(loaded, vectors[:50], k=1, nprobe=32)
    assert (found[:, 0] == ids[:50]).all()
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=2e-2)  # one byte per dimension
    assert remove(loaded, [100, 101, 5]) == 2
    assert loaded.ntotal == 3998


def test_plan_index_refuses_unknown_storage() -> None:
    with pytest.raises(UserError, match="float32, sq8, pq, binary"):
        plan_index(100_000, storage="opq")
    assert plan_index(500, storage="sq8").index_type == "flat"  # exact search stays float32


def test_ivf_recall_against_exact_search() -> None:
    vectors = clustered(6000, seed=1)
    queries = clustered(100, seed=2)
    ids = np.arange(6000, dtype=np.int64)
    ivf = build_index(vectors, plan_index(6000, nlist=64, flat_below=1000))
    add(ivf, vectors, ids)
    flat = build_index(vectors, plan_index(6000))
    add(flat, vectors, ids)
    _, exact = search(flat, queries, k=10)
    _, few = search(ivf, queries, k=10, nprobe=1)
    _, many = search(ivf, queries, k=10, nprobe=16)

    def recall(found):
        return np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True)])

    assert recall(many) >= recall(few)
    assert recall(many) > 0.9


def test_remove_ids() -> None:
    vectors = clustered(200)
    index = build_index(vectors, plan_index(200))
    add(index, vectors, np.arange(200, dtype=np.int64))
    assert remove(index, [3, 4, 999]) == 2
    _, found = search(index, vectors[3:4], k=5)
    assert 3 not in found[0] and index.ntotal == 198


def test_store_upsert_replace_delete_and_persist(tmp_path) -> None:
    path = tmp_path / "docs.sqlite"
    store = DocumentStore(path)
    ids, replaced = store.upsert([Document("a", "first", {"lang": "en"}), Document("b", "second")])
    assert replaced == [] and len(set(ids)) == 2
    ids2, replaced2 = store.upsert(
        [Document("a", "first, edited"), Document("c", "third"), Document("c", "third v2")]
    )
    assert ids2[0] == ids[0] and replaced2 == [ids[0]] and ids2[1] == ids2[2]
    assert store.get("a") == Document("a", "first, edited", {})
    assert store.get("c").text == "third v2"  # last occurrence in a batch wins
    assert store.count() == 3
    assert store.delete_logged(["b"]) == {"b": ids[1]} and store.delete_logged(["b"]) == {}
    store.close()
    reopened = DocumentStore(path)
    assert reopened.count() == 2
    docs = reopened.get_many([ids[0], ids2[1], 12345])
    assert {d.id for d in docs.values()} == {"a", "c"}
    assert reopened.get("missing") is None


def test_store_metadata_round_trip(tmp_path) -> None:
    store = DocumentStore(tmp_path / "docs.sqlite")
    meta = {"source": "quora", "tags": ["q", "dup"], "score": 0.5, "name": "Pokémon"}
    store.upsert([Document("x", "text", meta)])
    assert store.get("x").metadata == meta
    with pytest.raises(TypeError):
        store.upsert([Document("y", "text", {"bad": object()})])
    assert store.get("y") is None  # the failed batch left nothing behind
