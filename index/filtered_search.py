"""Search with a metadata filter: the plan that keeps a filter's cost near its matches' cost.

1. **Post-filter.** Search without the filter for ``OVERFETCH x k`` candidates and keep those that
   pass (one SQL query over the candidates' ids). When ``k`` pass, they are exactly the top-k that
   a search restricted to the matching documents would find in the same lists: any better match
   would have ranked among the candidates. A filter that half the documents pass costs one wider
   search.
2. **Pre-filter**, for the queries that came short (a selective filter): the matching ids from the
   store (a payload index lookup when the fields are indexed), then a search restricted to them.
   An IVF probes ``nprobe * ntotal / matches`` lists, capped at all of them, so that a query sees
   about as many matching candidates as an unfiltered one sees documents; compressed lists score
   every match exactly (index/rescore.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import faiss
import numpy as np

from index.filters import Node
from index.rescore import top_k
from index.vectors import is_ivf, search

if TYPE_CHECKING:
    from index.live import LiveIndex

OVERFETCH = 10


def vector_search(
    live: LiveIndex,
    queries: np.ndarray,
    k: int,
    nprobe: int,
    *,
    allowed: np.ndarray | None = None,
    rescore_k: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each (n_queries, k), -1 where fewer were found; ``allowed``: only these ids."""
    if live.rescorer is not None:
        return live.rescorer.search(live.index, queries, k, nprobe, allowed=allowed, rescore_k=rescore_k)
    if allowed is None:
        return search(live.index, queries, k, nprobe)
    selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
    if is_ivf(live.index):
        params: faiss.SearchParameters = faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)
    else:
        params = faiss.SearchParameters(sel=selector)
    return live.index.search(np.ascontiguousarray(queries, dtype=np.float32), k, params=params)


def filtered_search(
    live: LiveIndex, queries: np.ndarray, k: int, nprobe: int, node: Node, *, rescore_k: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The top-k of each query among the documents that pass ``node`` (caller holds the lock)."""
    ntotal = live.ntotal
    out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    out_ids = np.full((len(queries), k), -1, dtype=np.int64)
    if ntotal == 0:
        return out_scores, out_ids
    wide = min(ntotal, k * OVERFETCH)
    scores, ids = vector_search(live, queries, wide, nprobe, rescore_k=rescore_k)
    candidates = np.unique(ids[ids >= 0])
    passing = live.store.which_match(node, candidates.tolist()) if len(candidates) else set()
    short = []
    for row, (row_scores, row_ids) in enumerate(zip(scores, ids, strict=True)):
        kept = [col for col, i in enumerate(row_ids) if i in passing][:k]
        out_scores[row, : len(kept)], out_ids[row, : len(kept)] = row_scores[kept], row_ids[kept]
        # every document was a candidate (an exact index that returned them all): nothing missed
        exhaustive = not is_ivf(live.index) and wide == ntotal
        if len(kept) < k and not exhaustive:
            short.append(row)
    if not short:
        return out_scores, out_ids
    allowed = live.store.ids_matching(node)
    if len(allowed) == 0:
        return out_scores, out_ids
    if is_ivf(live.index):
        nlist = faiss.extract_index_ivf(live.index).nlist
        nprobe = min(max(nlist, nprobe), math.ceil(nprobe * ntotal / len(allowed)))
    scores, ids = top_k(
        *vector_search(live, queries[short], k, nprobe, allowed=allowed, rescore_k=rescore_k), k
    )
    found = ids.shape[1]  # fewer than k columns when fewer documents match
    out_scores[short, :found], out_ids[short, :found] = scores, ids
    return out_scores, out_ids
