"""The Hamming scan of binary lists by Faiss's counting search, not their heap (docs/decisions.md,
42: 1.3 us per query against 3.8): an ``IndexBinaryIVF`` sharing the lists counts distances into
buckets. Faiss 1.15's counting search reads ``max_codes`` 0 as a budget of zero codes, and allocates
``queries x (d + 1) x k`` ids at once, hence blocks of ``BLOCK`` queries.
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
    """Binary lists as ``index build`` makes them: a bit per dimension, one threshold (0) for all lists."""
    return (
        isinstance(index, faiss.IndexIVFSpectralHash)
        and index.threshold_type == faiss.IndexIVFSpectralHash.Thresh_global
        and index.nbit == index.d
    )


def binary_view(index: faiss.IndexIVFSpectralHash) -> faiss.IndexBinaryIVF:
    """An ``IndexBinaryIVF`` sharing ``index``'s lists, made again when its lists object is replaced."""
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
    """(int32 Hamming distances, ids), best first; a missing neighbour is -1 at distance ``d``."""
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
        block = [faiss.swig_ptr(a[start : start + BLOCK]) for a in (codes, lists, coarse, distances, ids)]
        view.search_preassigned_c(min(BLOCK, len(queries) - start), block[0], k, *block[1:], False, params)
    return np.where(ids >= 0, distances, index.d), ids
