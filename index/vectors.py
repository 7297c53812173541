"""Faiss wrapper: inner product on L2-normalised vectors, IVF (nlist 1024 by default) with stable
int64 ids, nprobe applied at load and per query (Faiss saves nprobe as 1)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from faiss.contrib.inspect_tools import get_invlist

from distilembed.artifacts import FILE_MODE
from distilembed.errors import UserError

log = logging.getLogger(__name__)
MIN_POINTS_PER_LIST = 39  # Faiss warns below this many training points per centroid
FLAT_BELOW = 10_000  # under this many vectors exact search is fast and IVF only loses recall
STORAGES = ("float32", "sq8")


@dataclass(frozen=True)
class IndexPlan:
    kind: str  # "ivf" | "flat"
    nlist: int
    reason: str
    storage: str = "float32"  # how IVF lists hold vectors: float32, or sq8 (one byte per dimension)

    @property
    def index_type(self) -> str:
        """What the manifest and /info call it: "flat", "ivf" or "ivf_sq8"."""
        return f"{self.kind}_sq8" if self.storage == "sq8" else self.kind


def check_storage(storage: str) -> str:
    if storage not in STORAGES:
        raise UserError(f"--storage must be one of {', '.join(STORAGES)}, not {storage!r}")
    return storage


def on_disk(index: faiss.Index) -> bool:
    """Whether an IVF index's lists live in a memory-mapped file (read-only here)."""
    try:
        lists = faiss.extract_index_ivf(index).invlists
    except RuntimeError:
        return False
    return isinstance(faiss.downcast_InvertedLists(lists), faiss.OnDiskInvertedLists)


def storage_of(index: faiss.Index) -> str:
    """How ``index`` holds its vectors: "sq8" for scalar-quantised IVF lists, else "float32"."""
    return "sq8" if isinstance(index, faiss.IndexIVFScalarQuantizer) else "float32"


def plan_index(
    n: int, nlist: int = 1024, flat_below: int = FLAT_BELOW, storage: str = "float32"
) -> IndexPlan:
    """IVF with the requested nlist if the corpus can train it, else a smaller nlist or flat."""
    check_storage(storage)
    if n < flat_below:
        return IndexPlan("flat", 0, f"{n} vectors < {flat_below}: exact search, float32")
    fitted = min(nlist, n // MIN_POINTS_PER_LIST)
    if fitted < 1:
        return IndexPlan("flat", 0, f"{n} vectors: too few to train one list, exact search")
    if fitted < nlist:
        reason = f"nlist lowered {nlist} -> {fitted} to keep >= {MIN_POINTS_PER_LIST} points/list"
        return IndexPlan("ivf", fitted, reason, storage)
    return IndexPlan("ivf", nlist, "as requested", storage)


def new_ivf(dim: int, nlist: int, storage: str = "float32") -> faiss.IndexIVF:
    """An untrained inner-product IVF. ``sq8`` stores each dimension (of the residual to the list's
    centroid) in one byte, 4x less memory than float32. Its per-dimension ranges are learnt in
    ``train``; values of later vectors outside them are clipped (docs/decisions.md, 19)."""
    quantizer = faiss.IndexFlatIP(dim)
    if storage == "sq8":
        return faiss.IndexIVFScalarQuantizer(
            quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
    return faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)


def build_index(
    vectors: np.ndarray, plan: IndexPlan, seed: int = 0, train_size: int | None = None
) -> faiss.Index:
    """An empty, trained index (IVF trained on a random sample of ``vectors``)."""
    dim = vectors.shape[1]
    if plan.kind == "flat":
        return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    index = new_ivf(dim, plan.nlist, plan.storage)
    size = min(len(vectors), train_size or 64 * plan.nlist)
    sample = np.random.default_rng(seed).choice(len(vectors), size=size, replace=False)
    index.train(np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32))
    return index


def held_vectors(index: faiss.Index) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of every entry of a flat (IDMap2) or IVF index; from sq8 lists the vectors
    come back decoded (one byte per dimension)."""
    if isinstance(index, faiss.IndexIVF):
        lists = [get_invlist(index.invlists, i)[0] for i in range(index.nlist)]
        ids = np.concatenate([np.zeros(0, dtype=np.int64), *lists])
        # Reconstruct by id (ours are not 0..n-1, so a hash table), then drop the map again.
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        try:
            vectors = index.reconstruct_batch(ids) if len(ids) else np.zeros((0, index.d), np.float32)
        finally:
            index.set_direct_map_type(faiss.DirectMap.NoMap)
        return ids, vectors
    mapped = faiss.downcast_index(index)  # a view: ``index`` must stay referenced (it owns the C++ object)
    ids = faiss.vector_to_array(mapped.id_map).astype(np.int64)
    return ids, faiss.downcast_index(mapped.index).reconstruct_n(0, mapped.ntotal)


def add(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, slice_size: int = 65_536) -> None:
    for lo in range(0, len(ids), slice_size):
        index.add_with_ids(
            np.ascontiguousarray(vectors[lo : lo + slice_size], dtype=np.float32),
            np.ascontiguousarray(ids[lo : lo + slice_size], dtype=np.int64),
        )


def remove(index: faiss.Index, ids: list[int]) -> int:
    if not ids:
        return 0
    return int(index.remove_ids(np.asarray(ids, dtype=np.int64)))


def set_nprobe(index: faiss.Index, nprobe: int) -> None:
    try:
        faiss.extract_index_ivf(index).nprobe = nprobe
    except RuntimeError:  # flat index: nothing to probe
        return


def search(
    index: faiss.Index, queries: np.ndarray, k: int, nprobe: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each (n_queries, k); missing neighbours have id -1."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if nprobe is not None and isinstance(index, faiss.IndexIVF):
        return index.search(queries, k, params=faiss.SearchParametersIVF(nprobe=nprobe))
    return index.search(queries, k)


def save_index(index: faiss.Index, path: Path) -> None:
    """Write to a temp file beside ``path``, fsync, rename: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 would hide the index from a container's other uid
    os.close(fd)
    try:
        faiss.write_index(index, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def c_stdout_to_stderr() -> Iterator[None]:
    """Send what Faiss's C++ code prints to stdout (on-disk lists report their file moves and
    sizes with printf) to stderr, keeping stdout for the CLI's own output."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def load_index(path: Path, nprobe: int) -> faiss.Index:
    """Read an index; IVF lists kept on disk (``index build --on-disk``) are memory-mapped from the
    ``.ivfdata`` file beside it, whatever directory it was built in."""
    with c_stdout_to_stderr():
        index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR)
    set_nprobe(index, nprobe)
    return index
