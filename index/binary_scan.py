"""The Hamming scan of binary lists, by Faiss's counting search rather than the lists' own heap.

Binary lists are an ``IndexIVFSpectralHash`` (``index/vectors.binary_lists``, decision 40). Its own
search keeps a heap of the k best per query, and with k = ``rescore_k`` (20-50) candidates from a few
hundred codes that heap is most of the scan. Faiss's ``IndexBinaryIVF`` can instead count
Hamming distances (0..d) into buckets, exact top k without a heap, so this module scans the same
lists through an ``IndexBinaryIVF`` that shares them (not a copy: upserts and deletes show at once):

1. the float centroids choose the lists, as the index's own search would (its quantizer);
2. the index encodes the queries exactly as it encoded the documents (``encode_vectors``);
3. the binary view counts, in blocks of ``BLOCK`` queries.

Two Faiss 1.15 details: its counting search reads ``max_codes`` 0 (no limit) as a budget of zero
codes and answers -1 for every neighbour (``list_size_max = max_codes - nscan``), so a huge budget is
passed; and it allocates ``queries x (d + 1) x k`` ids at once, hence the blocks. Measured on Quora
(36,824 documents, nprobe 8, k 50; docs/decisions.md, 42): 1.3 us per query against the heap's 3.8.
"""

from __future__ import annotations

import threading
import weakref

import faiss
import numpy as np

BLOCK = 64  # queries per counting call: its buffers stay small (64 x 129 x 50 ids = 3.3 MB at 128-d)
NO_BUDGET = 1 << 40  # max_codes: Faiss 1.15's counting search scans nothing at 0

_views: weakref.WeakKeyDictionary[faiss.Index, tuple[int, faiss.IndexBinaryIVF]] = weakref.WeakKeyDictionary()
_views_lock = threading.Lock()


def countable(index: faiss.Index) -> bool:
    """Binary lists as ``index build`` makes them: a bit per dimension, thresholds at 0 (the codes do
    not depend on the list, so one query code serves every list)."""
    return (
        isinstance(index, faiss.IndexIVFSpectralHash)
        and index.threshold_type == faiss.IndexIVFSpectralHash.Thresh_global
        and index.nbit == index.d
    )


def binary_view(index: faiss.IndexIVFSpectralHash) -> faiss.IndexBinaryIVF:
    """An ``IndexBinaryIVF`` over ``index``'s own inverted lists (shared, not owned), made once per
    index object and again if the index's lists object is replaced."""
    lists = int(index.invlists.this)
    with _views_lock:
        cached = _views.get(index)
        if cached is not None and cached[0] == lists:
            return cached[1]
        unused = faiss.IndexBinaryFlat(index.d)  # never searched: the float centroids choose the lists
        view = faiss.IndexBinaryIVF(unused, index.d, index.nlist)
        view.replace_invlists(index.invlists, False)
        view.is_trained = True
        view.use_heap = False
        view.referenced_objects = [unused]
        _views[index] = (lists, view)
        return view


def query_codes(index: faiss.IndexIVFSpectralHash, queries: np.ndarray) -> np.ndarray:
    """The queries' sign bits as ``index`` encodes its documents (the global threshold ignores the list)."""
    codes = np.empty((len(queries), index.code_size), dtype=np.uint8)
    lists = np.zeros(len(queries), dtype=np.int64)
    index.encode_vectors(
        len(queries), faiss.swig_ptr(queries), faiss.swig_ptr(lists), faiss.swig_ptr(codes), False
    )
    return codes


def hamming_search(
    index: faiss.IndexIVFSpectralHash, queries: np.ndarray, k: int, nprobe: int
) -> tuple[np.ndarray, np.ndarray]:
    """(Hamming distances int32, ids), each (n_queries, k), best first; missing neighbours are -1
    with distance ``d``. ``queries`` is float32, C-contiguous."""
    nprobe = max(1, min(nprobe, index.nlist))
    _, lists = index.quantizer.search(queries, nprobe)
    lists = np.ascontiguousarray(lists, dtype=np.int64)
    codes = query_codes(index, queries)
    coarse = np.zeros(lists.shape, dtype=np.int32)  # read by the scan, unused with a global threshold
    distances = np.empty((len(queries), k), dtype=np.int32)
    ids = np.empty((len(queries), k), dtype=np.int64)
    params = faiss.SearchParametersIVF(nprobe=nprobe, max_codes=NO_BUDGET)
    view = binary_view(index)
    for start in range(0, len(queries), BLOCK):
        stop = min(start + BLOCK, len(queries))
        view.search_preassigned_c(
            stop - start,
            faiss.swig_ptr(codes[start:stop]),
            k,
            faiss.swig_ptr(lists[start:stop]),
            faiss.swig_ptr(coarse[start:stop]),
            faiss.swig_ptr(distances[start:stop]),
            faiss.swig_ptr(ids[start:stop]),
            False,
            params,
        )
    return np.where(ids >= 0, distances, index.d), ids
