"""Compressed lists (pq, binary) with rescoring: exact scores, and every index operation keeps the
rescoring file right (checkpoint, replay, retrain, refresh, snapshot, shards, integrity)."""

import gc
import inspect
from dataclasses import replace

import faiss
import numpy as np
import pytest

from distilembed.artifacts import read_manifest
from distilembed.errors import UserError
from index.build import BuildConfig, build
from index.cli import build_command
from index.integrity import RESCORE_FILE
from index.live import INDEX_FILE, LiveIndex
from index.rescore import DEFAULT_RESCORE_K, top_k
from index.shards import open_sharded, shard_index
from index.snapshot import restore_snapshot
from index.store import Document
from index.vectors import copy_index, ids_of, load_index, new_ivf, save_index, search, signs, storage_of
from index.verify import verify_index
from service.testing import FakeEncoder
from tests.test_index_build import _cli, _corpus
from tests.test_index_live import DIM, make_index, unit

STORAGES = ["pq", "binary"]


def test_signs_are_packed_sign_bits_most_significant_first() -> None:
    row = np.array([[0.5, -1.0, 0.0, 2.0, -0.1, 0.3, 0.1, -2.0, 1.0, 1.0, -1.0, -1.0, 0, 0, 0, 0.2]])
    # bits: 1 0 0 1 0 1 1 0 | 1 1 0 0 0 0 0 1 (zero is not positive)
    assert signs(row).tolist() == [[0b10010110, 0b11000001]]


def test_build_defaults_to_the_library_rescore_k() -> None:
    assert inspect.signature(build_command).parameters["rescore_k"].default == DEFAULT_RESCORE_K
    assert BuildConfig.__dataclass_fields__["rescore_k"].default == DEFAULT_RESCORE_K


def test_top_k_hand_case() -> None:
    scores = np.array([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 0.1]], dtype=np.float32)
    ids = np.array([[10, 11, 12, -1], [20, 21, 22, 23]])
    got_scores, got_ids = top_k(scores, ids, 2)
    assert got_ids.tolist() == [[11, 12], [22, 20]]  # id -1 never wins, whatever its score
    np.testing.assert_allclose(got_scores, [[0.9, 0.5], [0.8, 0.3]])
    _, short = top_k(scores[:, :1], np.array([[-1], [20]]), 3)
    assert short.tolist() == [[-1], [20]]


def _hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamming distances between the sign bits of ``a`` and ``b`` (broadcast, last axis)."""
    return ((a > 0) != (b > 0)).sum(axis=-1)


def test_binary_lists_hold_the_sign_bits_of_rotated_vectors_under_float_centroids() -> None:
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((3000, 64)).astype(np.float32)
    index = new_ivf(64, 32, "binary")
    index.train(vectors)
    index.add_with_ids(vectors, np.arange(len(vectors)))
    assert index.code_size == 8 and isinstance(faiss.downcast_index(index.quantizer), faiss.IndexFlatIP)
    rotation = faiss.downcast_VectorTransform(index.vt)
    rotated = rotation.apply(vectors)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=1), np.linalg.norm(vectors, axis=1), rtol=1e-4)
    queries = vectors[:10] + 0.5 * rng.standard_normal((10, 64)).astype(np.float32)
    scores, ids = search(index, queries, 20, nprobe=32)  # every list: the Hamming ranking itself
    distances = _hamming(rotation.apply(queries)[:, None, :], rotated[ids])
    np.testing.assert_allclose(scores, 1.0 - 2.0 * distances / 64)
    every = _hamming(rotation.apply(queries)[:, None, :], rotated[None, :, :])
    assert (distances[:, 0] == every.min(axis=1)).all()
    assert storage_of(index) == "binary"
    floats = new_ivf(64, 32, "float32")
    floats.train(vectors)  # the same k-means: binary lists are the float32 lists, holding sign bits
    np.testing.assert_array_equal(index.quantizer.reconstruct_n(0, 32), floats.quantizer.reconstruct_n(0, 32))


def test_a_copy_of_binary_lists_owns_its_rotation() -> None:
    """``faiss.clone_index`` shares the rotation by pointer, so freeing both copies crashes."""
    vectors = np.random.default_rng(7).standard_normal((2000, 64)).astype(np.float32)
    index = new_ivf(64, 16, "binary")
    index.train(vectors)
    index.add_with_ids(vectors, np.arange(len(vectors)))
    expected = search(index, vectors[:5], 3, nprobe=4)
    copy = copy_index(index)
    del index
    gc.collect()
    got = search(copy, vectors[:5], 3, nprobe=4)
    np.testing.assert_array_equal(got[1], expected[1])


def _binary_ivf(rng: np.random.Generator) -> tuple[faiss.IndexBinaryIVF, np.ndarray]:
    """Binary lists as built before decision 40: Hamming centroids too (faiss.IndexBinaryIVF)."""
    vectors = rng.standard_normal((3000, 64)).astype(np.float32)
    index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(64), 64, 32)
    index.train(signs(vectors))
    index.add_with_ids(signs(vectors), np.arange(len(vectors)))
    return index, vectors


def test_older_binary_lists_load_search_take_writes_and_retrain_to_the_new_form(tmp_path) -> None:
    vectors = make_index(tmp_path / "idx", storage="binary")
    ids = ids_of(load_index(tmp_path / "idx" / INDEX_FILE, 5))
    older = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(DIM), DIM, 32)
    older.train(signs(vectors))
    older.add_with_ids(signs(vectors), np.sort(ids))
    save_index(older, tmp_path / "idx" / INDEX_FILE)
    live = LiveIndex(tmp_path / "idx", rescore_k=3001)
    assert isinstance(live.index, faiss.IndexBinaryIVF) and storage_of(live.index) == "binary"
    assert [row[0].id for row in live.search(vectors[:20], k=1)] == [f"doc{i}" for i in range(20)]
    live.upsert([Document("late", "late")], unit(5))
    assert live.search(unit(5), k=1)[0][0].id == "late"
    assert live.retrain(nlist=16, flat_below=100)["index_type"] == "ivf_binary"
    assert isinstance(live.index, faiss.IndexIVFSpectralHash)
    assert [row[0].id for row in live.search(vectors[:20], k=1, nprobe=16)] == [f"doc{i}" for i in range(20)]
    assert live.search(unit(5), k=1, nprobe=16)[0][0].id == "late"


def test_binary_lists_are_chosen_by_counting_with_the_heap_s_distances() -> None:
    rng = np.random.default_rng(5)
    index, vectors = _binary_ivf(rng)
    queries = vectors[:40] + 0.3 * rng.standard_normal((40, 64)).astype(np.float32)
    heap_distances, _ = index.search(signs(queries), 20, params=faiss.SearchParametersIVF(nprobe=8))
    scores, ids = search(index, queries, 20, nprobe=8)
    assert faiss.downcast_IndexBinary(index.quantizer).use_heap is False
    np.testing.assert_allclose(scores, 1.0 - 2.0 * heap_distances / 64)
    assert (ids >= 0).all()


@pytest.mark.parametrize("storage", STORAGES)
def test_rescored_scores_are_exact_and_all_candidates_give_exact_search(tmp_path, storage) -> None:
    vectors = make_index(tmp_path / "idx", storage=storage)
    live = LiveIndex(tmp_path / "idx", rescore_k=3000, writable=False)
    queries = vectors[:40] + 0.1 * unit(3, 40)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    hits = live.search(queries, k=10, nprobe=32)
    assert [[h.id for h in row] for row in hits] == [[f"doc{i}" for i in row] for row in exact]
    for q, row in zip(queries, hits, strict=True):
        ids = [int(h.id[3:]) for h in row]
        np.testing.assert_allclose([h.score for h in row], vectors[ids] @ q, rtol=1e-5, atol=1e-6)
    per_call = LiveIndex(tmp_path / "idx", writable=False).search(queries, k=10, nprobe=32, rescore_k=3000)
    assert [[h.id for h in row] for row in per_call] == [[h.id for h in row] for row in hits]
    few = LiveIndex(tmp_path / "idx", rescore_k=50, writable=False).search(queries, k=10, nprobe=32)
    recall = np.mean([len({h.id for h in a} & {h.id for h in b}) for a, b in zip(few, hits, strict=True)])
    assert recall > 5  # of 10: 50 candidates of 3,000 by a code of 16 bytes or bits keep most


@pytest.mark.parametrize("storage", STORAGES)
def test_writes_reach_the_rescoring_file_at_checkpoint_and_survive_a_crash(tmp_path, storage) -> None:
    make_index(tmp_path / "idx", storage=storage)
    live = LiveIndex(tmp_path / "idx")
    new, moved = unit(1), unit(2)
    live.upsert([Document("new", "new"), Document("doc7", "moved")], np.vstack([new, moved]))
    live.delete(["doc9"])
    live.close(checkpoint=False)  # as if killed: the changes are only in the log
    replayed = LiveIndex(tmp_path / "idx")
    assert replayed.rescorer is not None and len(replayed.rescorer.fresh) == 3
    for vector, doc in ((new, "new"), (moved, "doc7")):
        hit = replayed.search(vector, k=1, nprobe=32)[0][0]
        assert hit.id == doc and hit.score == pytest.approx(1.0, abs=1e-5)
    replayed.close()  # checkpoints: the rows go into a new rescoring file
    files = read_manifest(tmp_path / "idx")["files"]
    assert "sha256" in files[RESCORE_FILE] and "replacing" not in files[RESCORE_FILE]
    reopened = LiveIndex(tmp_path / "idx", writable=False)
    assert reopened.rescorer is not None and reopened.rescorer.fresh == {}
    np.testing.assert_allclose(reopened.rescorer.vectors(np.array([3001]))[0], new[0])
    assert reopened.search(moved, k=1, nprobe=32)[0][0].score == pytest.approx(1.0, abs=1e-5)
    assert reopened.get("doc9") is None and verify_index(tmp_path / "idx")["ntotal"] == 3000


@pytest.mark.parametrize("storage", STORAGES)
def test_filtered_search_scores_every_allowed_document(tmp_path, storage) -> None:
    vectors = make_index(tmp_path / "idx", storage=storage)
    live = LiveIndex(tmp_path / "idx", writable=False)
    query = unit(4)
    hits = live.search(query, k=5, where={"group": 2})[0]
    allowed = np.arange(2, 3000, 3)
    best = allowed[np.argsort(-(vectors[allowed] @ query[0]))[:5]]
    assert [h.id for h in hits] == [f"doc{i}" for i in best]


def test_retrain_moves_between_float_and_compressed_lists(tmp_path) -> None:
    vectors = make_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx", rescore_k=3001)  # every candidate: exact, whatever the codes
    query = vectors[:20]
    assert live.retrain(nlist=16, storage="binary", flat_below=100)["index_type"] == "ivf_binary"
    assert isinstance(live.index, faiss.IndexIVFSpectralHash) and (tmp_path / "idx" / RESCORE_FILE).is_file()
    live.upsert([Document("late", "late")], unit(5))
    assert live.retrain(nlist=16, storage="pq", pq=(8, 4), flat_below=100)["index_type"] == "ivf_pq"
    assert (live.index.pq.M, live.index.pq.nbits) == (8, 4)
    assert [row[0].id for row in live.search(query, k=1, nprobe=16)] == [f"doc{i}" for i in range(20)]
    assert live.search(unit(5), k=1, nprobe=16)[0][0].score == pytest.approx(1.0, abs=1e-5)
    manifest = live.retrain(nlist=16, storage="float32", flat_below=100)
    assert manifest["index_type"] == "ivf" and RESCORE_FILE not in manifest["files"]
    assert live.rescorer is None and not (tmp_path / "idx" / RESCORE_FILE).exists()
    found = live.search(vectors[:20], k=1, nprobe=16)
    assert [row[0].id for row in found] == [f"doc{i}" for i in range(20)]
    live.close()
    assert verify_index(tmp_path / "idx")["ntotal"] == 3001


@pytest.mark.parametrize("storage", STORAGES)
def test_reader_refresh_follows_checkpoints(tmp_path, storage) -> None:
    make_index(tmp_path / "idx", storage=storage)
    writer, reader = LiveIndex(tmp_path / "idx"), LiveIndex(tmp_path / "idx", writable=False)
    writer.upsert([Document("a", "a")], unit(6))
    assert reader.refresh() == 1 and reader.search(unit(6), k=1, nprobe=32)[0][0].id == "a"
    writer.checkpoint()
    writer.upsert([Document("b", "b")], unit(7))
    reader.refresh()  # a new snapshot: both files reloaded, the rest of the log replayed
    assert reader.rescorer is not None and set(reader.rescorer.fresh) == {3002}
    for seed, doc in ((6, "a"), (7, "b")):
        assert reader.search(unit(seed), k=1, nprobe=32)[0][0].score == pytest.approx(1.0, abs=1e-5)
        assert reader.search(unit(seed), k=1, nprobe=32)[0][0].id == doc
    writer.close()


@pytest.mark.parametrize("storage", STORAGES)
def test_snapshot_restore_and_shards_carry_the_rescoring_file(tmp_path, storage) -> None:
    make_index(tmp_path / "idx", storage=storage)
    live = LiveIndex(tmp_path / "idx")
    live.upsert([Document("a", "a")], unit(6))
    snapshot = live.snapshot(tmp_path / "snap")
    assert f"index/{RESCORE_FILE}" in snapshot["files"]
    restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    restored = LiveIndex(tmp_path / "restored", writable=False, rescore_k=3001)
    assert restored.search(unit(6), k=1, nprobe=32)[0][0].score == pytest.approx(1.0, abs=1e-5)
    live.close()
    shard_index(tmp_path / "idx", 2, tmp_path / "shards")
    sharded = open_sharded(tmp_path / "shards", DIM, None, 32, rescore_k=3001)  # exact: all candidates
    queries = unit(8, 10)
    whole = [[h.id for h in row] for row in restored.search(queries, k=5, nprobe=32)]
    assert [[h.id for h in row] for row in sharded.search(queries, k=5)] == whole
    sharded.close()
    per_call = open_sharded(tmp_path / "shards", DIM, None, 32)  # the manifests' candidates ...
    assert [[h.id for h in row] for row in per_call.search(queries, k=5, rescore_k=3001)] == whole
    per_call.close()  # ... or all of them, asked for by the call


def test_a_truncated_rescoring_file_is_refused_in_one_line(tmp_path) -> None:
    make_index(tmp_path / "idx", storage="pq")
    live = LiveIndex(tmp_path / "idx")
    live.upsert([Document("a", "a")], unit(6))
    live.close()  # a checkpoint records the checksums
    path = tmp_path / "idx" / RESCORE_FILE
    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(UserError, match=f"{RESCORE_FILE} is .* bytes, the manifest records"):
        LiveIndex(tmp_path / "idx", writable=False)


def test_footprint_counts_codes_and_ids(tmp_path) -> None:
    make_index(tmp_path / "pq", storage="pq")
    make_index(tmp_path / "bin", storage="binary")
    make_index(tmp_path / "float")
    pq, binary = LiveIndex(tmp_path / "pq").footprint(), LiveIndex(tmp_path / "bin").footprint()
    centroids = {"centroid_bytes": 32 * 4 * DIM}  # make_index: 32 lists, float centroids for every storage
    on_disk = {"rescore_bytes_per_doc_on_disk": 4 * DIM}
    assert pq == {"memory_bytes_per_doc": 16 + 8} | on_disk | centroids
    assert binary == {"memory_bytes_per_doc": DIM / 8 + 8} | on_disk | centroids
    assert LiveIndex(tmp_path / "float").footprint() == {"memory_bytes_per_doc": 4 * DIM + 8} | centroids
    make_index(tmp_path / "flat", flat=True)
    assert LiveIndex(tmp_path / "flat").footprint() == {"memory_bytes_per_doc": 4 * DIM}


def test_build_writes_compressed_lists_and_refuses_bad_combinations(tiny_bundle, tmp_path) -> None:
    spec = _corpus(tmp_path)
    cfg = BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx"), nlist=4, flat_below=100)
    manifest = build(replace(cfg, storage="pq", pq_m=4, pq_bits=6, rescore_k=30), spec)
    assert (manifest["index_type"], manifest["pq"], manifest["rescore_k"]) == (
        "ivf_pq",
        {"m": 4, "bits": 6},
        30,
    )
    assert RESCORE_FILE in manifest["files"] and LiveIndex(tmp_path / "idx").rescore_k == 30
    args = ("build", "--bundle", str(tiny_bundle), "--corpus", str(spec.path), "--nlist", "4")
    for extra, message in (
        (("--storage", "pq", "--on-disk"), "--on-disk keeps float32 or sq8 lists"),
        (("--storage", "pq", "--pq-m", "7"), "--pq-m must divide the dimension"),
    ):
        refused = _cli(*args, "--out", str(tmp_path / "x"), *extra)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.parametrize("storage", STORAGES)
def test_service_searches_and_writes_compressed_lists(tmp_path, make_client, storage) -> None:
    make_index(tmp_path / "idx", storage=storage)
    encoder = FakeEncoder(dim=DIM)
    client = make_client(encoder=encoder, index=LiveIndex(tmp_path / "idx"), nprobe=32)
    docs = [{"id": "cat", "text": "the cat sat on the mat", "metadata": {"lang": "en"}}]
    assert client.post("/documents", json={"documents": docs}).status_code == 200
    hit = client.post("/search", json={"query": "the cat sat on the mat", "top_k": 3}).json()["results"][0]
    assert hit["id"] == "cat" and hit["score"] == pytest.approx(1.0, abs=1e-5)  # rescored: exact
    only = client.post("/search", json={"query": "mat", "filter": {"lang": "en"}}).json()["results"]
    assert [h["id"] for h in only] == ["cat"]
    assert client.get("/info").json()["index"]["type"] == f"ivf_{storage}"
    assert client.delete("/documents/cat").status_code == 200
    after = client.post("/search", json={"query": "the cat sat on the mat", "top_k": 3}).json()["results"]
    assert all(h["id"] != "cat" for h in after)
