"""The counting scan of binary lists (index/binary_scan.py) answers what the lists' own heap search
answers, sees writes made after its view was built, and survives the index being freed."""

from __future__ import annotations

import gc

import faiss
import numpy as np
import pytest
from faiss.contrib.inspect_tools import get_invlist

from index.binary_scan import BLOCK, NO_BUDGET, binary_view, countable, hamming_search, query_codes
from index.vectors import binary_lists, search, signs

DIM, NLIST = 64, 16


def _lists(rng: np.random.Generator, n: int = 2000) -> tuple[faiss.IndexIVFSpectralHash, np.ndarray]:
    centres = rng.standard_normal((20, DIM))
    vectors = (centres[rng.integers(0, 20, n)] + 0.7 * rng.standard_normal((n, DIM))).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = binary_lists(DIM, NLIST)
    index.train(vectors)
    index.add_with_ids(vectors, np.arange(n, dtype=np.int64))
    return index, vectors


def _heap_search(index: faiss.IndexIVFSpectralHash, queries: np.ndarray, k: int, nprobe: int):
    """Faiss's own search of the lists (a heap per query): the reference."""
    distances, ids = index.search(queries, k, params=faiss.SearchParametersIVF(nprobe=nprobe))
    return distances.astype(np.int64), ids


@pytest.mark.parametrize(("k", "nprobe"), [(1, 1), (10, 3), (50, 8), (300, 4)])
def test_counting_finds_the_heap_s_distances_and_the_same_ids_below_the_last(k: int, nprobe: int) -> None:
    rng = np.random.default_rng(k + nprobe)
    index, vectors = _lists(rng)
    queries = vectors[: 2 * BLOCK + 7] + 0.2 * rng.standard_normal((2 * BLOCK + 7, DIM)).astype(np.float32)
    queries = np.ascontiguousarray(queries / np.linalg.norm(queries, axis=1, keepdims=True))
    counted, ids = hamming_search(index, queries, k, nprobe)
    heap, heap_ids = _heap_search(index, queries, k, nprobe)
    missing = heap_ids < 0  # k 300 at nprobe 4 can exceed the codes of the probed lists
    assert np.array_equal(ids < 0, missing)
    assert np.array_equal(np.where(missing, DIM, counted), np.where(missing, DIM, heap))
    assert (np.diff(counted, axis=1) >= 0).all()  # best first
    for row_ids, row_heap, row_dist in zip(ids, heap_ids, counted, strict=True):
        last = row_dist[row_ids >= 0].max(initial=0)
        # ties at the k-th distance may keep different ids; every id strictly inside is the heap's
        assert set(row_ids[row_dist < last]) == set(row_heap[row_dist < last])
    # and each distance is the Hamming distance between the codes the index stores
    stored = {int(i): code for i, code in zip(ids[0], _stored_codes(index, ids[0]), strict=True) if i >= 0}
    own = query_codes(index, queries[:1])[0]
    for i, code in stored.items():
        assert int(np.unpackbits(own ^ code).sum()) == counted[0][list(ids[0]).index(i)]


def _stored_codes(index: faiss.IndexIVFSpectralHash, wanted: np.ndarray) -> list[np.ndarray]:
    found: dict[int, np.ndarray] = {}
    for list_no in range(index.nlist):
        ids, codes = get_invlist(index.invlists, list_no)
        found.update({int(i): code for i, code in zip(ids, codes, strict=True)})
    return [found.get(int(i), np.zeros(index.code_size, np.uint8)) for i in wanted]


def test_search_scores_are_the_cosine_estimate_of_the_lists() -> None:
    index, vectors = _lists(np.random.default_rng(1))
    scores, ids = search(index, vectors[:5], 3, nprobe=4)
    distances, same = hamming_search(index, np.ascontiguousarray(vectors[:5]), 3, 4)
    assert np.array_equal(ids, same)
    np.testing.assert_allclose(scores, 1.0 - 2.0 * distances / DIM)
    assert (ids[:, 0] == np.arange(5)).all()  # each vector's own code is at distance 0


def test_the_view_sees_writes_made_after_it_was_built() -> None:
    index, vectors = _lists(np.random.default_rng(2))
    queries = np.ascontiguousarray(vectors[:4])
    view = binary_view(index)
    index.remove_ids(np.arange(4, dtype=np.int64))
    _, ids = hamming_search(index, queries, 5, NLIST)
    assert not np.isin(ids, np.arange(4)).any()
    index.add_with_ids(queries, np.arange(9000, 9004, dtype=np.int64))
    _, ids = hamming_search(index, queries, 1, NLIST)
    assert ids[:, 0].tolist() == [9000, 9001, 9002, 9003]
    assert binary_view(index) is view  # one view per index object


def test_a_replaced_lists_object_gets_a_new_view_and_a_freed_index_frees_its_view() -> None:
    index, vectors = _lists(np.random.default_rng(3))
    first = binary_view(index)
    copy = faiss.deserialize_index(faiss.serialize_index(index))
    assert binary_view(copy) is not first
    empty = faiss.ArrayInvertedLists(NLIST, index.code_size)  # kept alive here: the index does not own it
    index.replace_invlists(empty, False)
    assert binary_view(index) is not first
    _, ids = hamming_search(index, np.ascontiguousarray(vectors[:2]), 3, NLIST)
    assert (ids == -1).all()  # the new, empty lists
    del index, first
    gc.collect()
    _, ids = hamming_search(copy, np.ascontiguousarray(vectors[:2]), 1, NLIST)
    assert ids[:, 0].tolist() == [0, 1]


def test_only_sign_lists_at_a_global_threshold_are_counted() -> None:
    index, _ = _lists(np.random.default_rng(4))
    assert countable(index)
    index.threshold_type = faiss.IndexIVFSpectralHash.Thresh_centroid
    assert not countable(index)
    assert not countable(faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, NLIST))


def test_faiss_counting_search_still_needs_a_code_budget() -> None:
    """Why NO_BUDGET (index/binary_scan.py): Faiss 1.15's counting search over binary IVF lists reads
    max_codes 0, "no limit", as a budget of nothing and answers -1 for every neighbour. When this
    fails, Faiss has fixed it and the budget can go."""
    vectors = np.random.default_rng(6).standard_normal((500, DIM)).astype(np.float32)
    index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(DIM), DIM, 4)
    index.train(signs(vectors))
    index.add_with_ids(signs(vectors), np.arange(len(vectors)))
    index.use_heap = False
    _, ids = index.search(signs(vectors[:5]), 5, params=faiss.SearchParametersIVF(nprobe=4))
    assert (ids == -1).all()
    _, ids = index.search(
        signs(vectors[:5]), 5, params=faiss.SearchParametersIVF(nprobe=4, max_codes=NO_BUDGET)
    )
    assert ids[:, 0].tolist() == [0, 1, 2, 3, 4]
