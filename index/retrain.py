"""``distilembed index retrain``: a new IVF for an index directory, from the vectors it already holds.

Upserts never retrain: an index created empty stays exact (flat) however large it grows, and an IVF
trained on one corpus keeps its centroids when the documents move to another domain. Retraining
re-plans the index for its current size (nlist, or flat below ``flat_below``), trains the centroids
on its own vectors, and re-adds them under the same ids. Nothing is re-encoded: the document store
is untouched. Vectors come back exactly from float32 lists; from sq8 lists they come back decoded
(one byte per dimension), and are quantised again if the new index is sq8.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from faiss.contrib.inspect_tools import get_invlist

from distilembed.artifacts import atomic_write_json, now_iso
from distilembed.errors import UserError
from index.live import INDEX_FILE, LiveIndex
from index.vectors import FLAT_BELOW, STORAGES, add, build_index, plan_index, save_index

log = logging.getLogger(__name__)


def held_vectors(index: faiss.Index) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of every entry of a flat (IDMap2) or IVF index."""
    if isinstance(index, faiss.IndexIVF):
        ids = np.concatenate(
            [np.zeros(0, dtype=np.int64)] + [get_invlist(index.invlists, i)[0] for i in range(index.nlist)]
        )
        # Reconstruct by id (ours are not 0..n-1, so a hash table), then drop the map again.
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        try:
            vectors = index.reconstruct_batch(ids) if len(ids) else np.zeros((0, index.d), np.float32)
        finally:
            index.set_direct_map_type(faiss.DirectMap.NoMap)
        return ids, vectors
    index = faiss.downcast_index(index)
    ids = faiss.vector_to_array(index.id_map).astype(np.int64)
    return ids, faiss.downcast_index(index.index).reconstruct_n(0, index.ntotal)


def retrain(
    directory: str | Path,
    nlist: int = 1024,
    storage: str | None = None,
    flat_below: int = FLAT_BELOW,
    seed: int = 0,
) -> dict[str, Any]:
    """Replace DIR's Faiss file with a freshly trained one holding the same (id, vector) pairs, and
    record it in the manifest. ``storage`` None keeps the current one. Refused while another
    process (the service) has the directory open for writing."""
    start = time.perf_counter()
    live = LiveIndex(directory)
    try:
        live.checkpoint()  # the snapshot holds every acknowledged change; the log is empty
        current = "sq8" if live.kind.endswith("_sq8") else "float32"
        storage = storage or current
        if storage not in STORAGES:
            raise UserError(f"--storage must be one of {', '.join(STORAGES)}, not {storage!r}")
        ids, vectors = held_vectors(live.index)
        plan = plan_index(len(ids), nlist, flat_below, storage)
        log.info("retrain %s: %d vectors, %s -> %s", live.dir, len(ids), live.kind, plan)
        index = build_index(vectors, plan, seed=seed)
        add(index, vectors, ids)
        if index.ntotal != live.index.ntotal:
            raise RuntimeError(f"retrained index holds {index.ntotal} vectors, not {live.index.ntotal}")
        save_index(index, live.dir / INDEX_FILE)
        manifest = live.manifest | {
            "index_type": plan.index_type,
            "nlist": plan.nlist,
            "plan": plan.reason,
            "ntotal": int(index.ntotal),
            "retrained": {
                "at": now_iso(),
                "from": {"index_type": live.kind, "nlist": live.nlist},
                "seconds": round(time.perf_counter() - start, 2),
            },
        }
        # The Faiss file is replaced first: a crash before this line leaves the new index under the
        # old manifest's nlist/type labels (searches still work); running retrain again fixes them.
        atomic_write_json(live.dir / "manifest.json", manifest)
    finally:
        live.close(checkpoint=False)
    return manifest
