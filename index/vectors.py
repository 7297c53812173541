"""Faiss wrapper: inner product on L2-normalised vectors, IVF (nlist 1024 by default) with stable
int64 ids, nprobe applied at load and per query (Faiss saves nprobe as 1)."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from distilembed.artifacts import FILE_MODE
from distilembed.errors import UserError
from index.binary_scan import countable, hamming_search

log = logging.getLogger(__name__)
MIN_POINTS_PER_LIST = 39  # Faiss warns below this many training points per centroid
FLAT_BELOW = 10_000  # under this many vectors exact search is fast and IVF only loses recall
STORAGES = ("float32", "sq8", "pq", "binary")
RESCORED = ("pq", "binary")  # lists too coarse to rank by: candidates are rescored (index/rescore.py)
BINARY_MAGIC = b"IB"  # the first bytes of every Faiss binary index file (binary lists before decision 40)
# Binary lists are Faiss's IndexIVFSpectralHash with a global threshold at 0: bit i of a vector is
# floor(2 (R x)_i / period) mod 2 for Faiss's fixed random rotation R, so with a period far above
# any |coordinate| it is 1 exactly where (R x)_i < 0: the sign bits of the rotated vector.
SIGN_PERIOD = 1e6


@dataclass(frozen=True)
class IndexPlan:
    kind: str  # "ivf" | "flat"
    nlist: int
    reason: str
    # float32; sq8 (a byte a dimension); pq (pq_m codes of pq_bits bits); binary (a bit a dimension)
    storage: str = "float32"
    pq_m: int = 16
    pq_bits: int = 8

    @property
    def index_type(self) -> str:
        """What the manifest and /info call it: "flat", "ivf", "ivf_sq8", "ivf_pq" or "ivf_binary"."""
        return self.kind if self.kind == "flat" or self.storage == "float32" else f"ivf_{self.storage}"


def check_storage(storage: str, dim: int | None = None, pq_m: int = 16, pq_bits: int = 8) -> str:
    if storage not in STORAGES:
        raise UserError(f"--storage must be one of {', '.join(STORAGES)}, not {storage!r}")
    if dim is not None and storage == "binary" and dim % 8:
        raise UserError(f"--storage binary needs a dimension that is a multiple of 8, not {dim}")
    if dim is not None and storage == "pq" and (pq_m < 1 or dim % pq_m):
        raise UserError(f"--pq-m must divide the dimension {dim}, not {pq_m}")
    if storage == "pq" and not 1 <= pq_bits <= 16:
        raise UserError(f"--pq-bits must be between 1 and 16, not {pq_bits}")
    return storage


def is_binary(index: faiss.Index | faiss.IndexBinary) -> bool:
    """A Faiss binary index: binary lists before decision 40 (they load, search and take upserts)."""
    return isinstance(index, faiss.IndexBinary)


def has_binary_lists(index: faiss.Index | faiss.IndexBinary) -> bool:
    """Whether the lists hold sign bits (either form): scores are 1 - 2 x Hamming / d."""
    return isinstance(index, faiss.IndexBinary | faiss.IndexIVFSpectralHash)


def binary_lists(dim: int, nlist: int) -> faiss.IndexIVFSpectralHash:
    """An untrained IVF holding ``dim`` sign bits per vector under float centroids (decision 40)."""
    index = faiss.IndexIVFSpectralHash(faiss.IndexFlatIP(dim), dim, nlist, dim, SIGN_PERIOD)
    index.threshold_type = faiss.IndexIVFSpectralHash.Thresh_global
    index.cp.spherical = True  # as Faiss trains an inner-product IVF: the float32 lists' centroids
    return index


def copy_index(index: faiss.Index | faiss.IndexBinary) -> faiss.Index | faiss.IndexBinary:
    """A deep copy by serialisation: ``clone_index`` shares an IndexIVFSpectralHash's rotation."""
    if is_binary(index):
        return faiss.deserialize_index_binary(faiss.serialize_index_binary(index))
    return faiss.deserialize_index(faiss.serialize_index(index))


def signs(vectors: np.ndarray) -> np.ndarray:
    """The sign bits of each row, 8 to a byte, most significant first: what binary lists hold."""
    return np.packbits(np.asarray(vectors) > 0, axis=1)


def on_disk(index: faiss.Index) -> bool:
    """Whether an IVF index's lists live in a memory-mapped file (read-only here)."""
    lists = faiss.downcast_InvertedLists(index.invlists) if isinstance(index, faiss.IndexIVF) else None
    return isinstance(lists, faiss.OnDiskInvertedLists)


def storage_of(index: faiss.Index) -> str:
    """How ``index`` holds its vectors: "sq8", "pq", "binary" or "float32"."""
    if has_binary_lists(index):
        return "binary"
    if isinstance(index, faiss.IndexIVFPQ):
        return "pq"
    return "sq8" if isinstance(index, faiss.IndexIVFScalarQuantizer) else "float32"


def is_ivf(index: faiss.Index) -> bool:
    return isinstance(index, faiss.IndexIVF | faiss.IndexBinaryIVF)


def describe(index: faiss.Index) -> tuple[str, int]:
    """(index type as the manifest names it, nlist) of a loaded index."""
    if not is_ivf(index):
        return "flat", 0
    return IndexPlan("ivf", int(index.nlist), "", storage_of(index)).index_type, int(index.nlist)


def default_nprobe(storage: str) -> int:
    """Lists searched per query by default: 8 for rescored lists (more lists buy recall cheaply:
    Quora MRR@10 95.1%, 96.4%, 97.6% of exact at nprobe 5, 8, 16; docs/decisions.md, 40, 43), else 5."""
    return 8 if storage in RESCORED else 5


def default_pq_m(dim: int) -> int:
    """Codes per vector by default: one per 8 dimensions, or the nearest smaller divisor of ``dim``."""
    return max(m for m in range(1, max(1, dim // 8) + 1) if dim % m == 0)


def pq_shape(index: faiss.Index) -> tuple[int, int]:
    """(m, bits) of a PQ index's codes; the defaults for its dimension for any other."""
    if isinstance(index, faiss.IndexIVFPQ):
        return int(index.pq.M), int(index.pq.nbits)
    return default_pq_m(index.d), IndexPlan.pq_bits


def bytes_per_vector(index: faiss.Index) -> float:
    """Memory a vector takes in the lists: its code plus its 8-byte id (flat: code only)."""
    return float(index.code_size + 8) if is_ivf(index) else 4.0 * index.d


def centroid_bytes(index: faiss.Index | faiss.IndexBinary) -> int:
    """Memory the coarse centroids take (flat: 0): 4 x d bytes a list, d / 8 for older binary lists."""
    if not is_ivf(index):
        return 0
    downcast = faiss.downcast_IndexBinary if is_binary(index) else faiss.downcast_index
    quantizer = downcast(index.quantizer)
    return int(quantizer.ntotal * quantizer.code_size)


def binary_nlist(n: int) -> int:
    """About sqrt(n): below ~1M vectors fewer, longer binary lists are faster and no worse, their
    scan costing ~1 ns a code while the coarse step scans every centroid (docs/decisions.md, 43)."""
    return max(1, math.isqrt(n))


def plan_index(
    n: int,
    nlist: int = 1024,
    flat_below: int = FLAT_BELOW,
    storage: str = "float32",
    pq: tuple[int, int] = (16, 8),
) -> IndexPlan:
    """IVF with ``nlist`` lists if the corpus can train them, else fewer or flat; ``pq``: (m, bits)."""
    check_storage(storage, pq_m=pq[0], pq_bits=pq[1])
    if n < flat_below:
        return IndexPlan("flat", 0, f"{n} vectors < {flat_below}: exact search, float32")
    fitted = min(nlist, n // MIN_POINTS_PER_LIST)
    if fitted < 1:
        return IndexPlan("flat", 0, f"{n} vectors: too few to train one list, exact search")
    if storage == "pq" and n < 2 ** pq[1]:  # k-means needs a point per code
        return IndexPlan(
            "flat", 0, f"{n} vectors: too few to train {2 ** pq[1]}-code PQ codebooks, exact search"
        )
    why = f" to keep >= {MIN_POINTS_PER_LIST} points/list"
    if storage == "binary" and (fewer := binary_nlist(n)) < fitted:
        fitted, why = fewer, ", about sqrt(n): binary lists scan fast, the centroids do not"
    reason = f"nlist lowered {nlist} -> {fitted}{why}" if fitted < nlist else "as requested"
    return IndexPlan("ivf", fitted, reason, storage, *pq)


def new_ivf(dim: int, nlist: int, storage: str = "float32", pq: tuple[int, int] = (16, 8)) -> faiss.Index:
    """An untrained inner-product IVF: ``sq8`` a byte per dimension of the residual (later values
    clipped, docs/decisions.md, 19), ``pq`` m codes of it, ``binary`` sign bits (both rescored)."""
    if storage == "binary":
        return binary_lists(dim, nlist)
    quantizer, metric = faiss.IndexFlatIP(dim), faiss.METRIC_INNER_PRODUCT
    if storage == "pq":
        return faiss.IndexIVFPQ(quantizer, dim, nlist, *pq, metric)
    if storage == "sq8":
        return faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, metric)
    return faiss.IndexIVFFlat(quantizer, dim, nlist, metric)


def build_index(
    vectors: np.ndarray, plan: IndexPlan, seed: int = 0, train_size: int | None = None
) -> faiss.Index:
    """An empty, trained index (IVF trained on a random sample of ``vectors``)."""
    dim = vectors.shape[1]
    if plan.kind == "flat":
        return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    index = new_ivf(dim, plan.nlist, plan.storage, (plan.pq_m, plan.pq_bits))
    size = min(len(vectors), train_size or 64 * plan.nlist)
    sample = np.random.default_rng(seed).choice(len(vectors), size=size, replace=False)
    rows = np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32)
    index.train(signs(rows) if is_binary(index) else rows)
    return index


def ids_of(index: faiss.Index) -> np.ndarray:
    """The ids an index holds (IVF lists or an IDMap), without decoding any vector."""
    if isinstance(index, faiss.IndexIVF | faiss.IndexBinaryIVF):
        lists = index.invlists
        parts = [np.zeros(0, dtype=np.int64)]
        for number in range(index.nlist):
            size = lists.list_size(number)
            if size:
                pointer = lists.get_ids(number)
                parts.append(faiss.rev_swig_ptr(pointer, size).copy())
                lists.release_ids(number, pointer)
        return np.concatenate(parts)
    mapped = faiss.downcast_index(index)
    return faiss.vector_to_array(mapped.id_map).astype(np.int64)


def held_vectors(index: faiss.Index) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of a flat (IDMap2) or IVF index (sq8: decoded); not for binary lists."""
    if has_binary_lists(index):
        raise UserError("binary lists hold sign bits only: read the vectors from the rescoring file")
    ids = ids_of(index)
    if isinstance(index, faiss.IndexIVF):
        # Reconstruct by id (ours are not 0..n-1, so a hash table), then drop the map again.
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        try:
            vectors = index.reconstruct_batch(ids) if len(ids) else np.zeros((0, index.d), np.float32)
        finally:
            index.set_direct_map_type(faiss.DirectMap.NoMap)
        return ids, vectors
    mapped = faiss.downcast_index(index)  # a view: ``index`` must stay referenced (it owns the C++ object)
    return ids, faiss.downcast_index(mapped.index).reconstruct_n(0, mapped.ntotal)


def add(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, slice_size: int = 65_536) -> None:
    for lo in range(0, len(ids), slice_size):
        rows = np.ascontiguousarray(vectors[lo : lo + slice_size], dtype=np.float32)
        index.add_with_ids(
            signs(rows) if is_binary(index) else rows,
            np.ascontiguousarray(ids[lo : lo + slice_size], dtype=np.int64),
        )


def remove(index: faiss.Index, ids: list[int]) -> int:
    if not ids:
        return 0
    return int(index.remove_ids(np.asarray(ids, dtype=np.int64)))


def set_nprobe(index: faiss.Index, nprobe: int) -> None:
    if is_ivf(index):  # a flat index has nothing to probe
        index.nprobe = nprobe


def search(
    index: faiss.Index, queries: np.ndarray, k: int, nprobe: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), -1 for a missing neighbour; binary lists score 1 - 2 * Hamming distance / d."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if countable(index):
        distances, ids = hamming_search(index, queries, k, index.nprobe if nprobe is None else nprobe)
    else:
        params = faiss.SearchParametersIVF(nprobe=nprobe) if nprobe is not None and is_ivf(index) else None
        # An older binary IVF's lists, by counting, not a heap (decision 36); a flag Faiss does not save.
        if isinstance(index, faiss.IndexBinaryIVF):
            quantizer = faiss.downcast_IndexBinary(index.quantizer)
            if isinstance(quantizer, faiss.IndexBinaryFlat):
                quantizer.use_heap = False
        distances, ids = index.search(signs(queries) if is_binary(index) else queries, k, params=params)
    if has_binary_lists(index):
        return (1.0 - 2.0 * distances / index.d).astype(np.float32), ids
    return distances, ids


def save_index(index: faiss.Index, path: Path) -> None:
    """Write to a temp file beside ``path``, fsync, rename: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 would hide the index from a container's other uid
    os.close(fd)
    mapped = isinstance(index, faiss.IndexIVF) and index.direct_map.type != faiss.DirectMap.NoMap
    try:
        if mapped:  # a direct map kept for returning vectors (index/browse.py) is memory, not the file
            index.set_direct_map_type(faiss.DirectMap.NoMap)
        (faiss.write_index_binary if is_binary(index) else faiss.write_index)(index, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        if mapped:
            index.set_direct_map_type(faiss.DirectMap.Hashtable)


@contextmanager
def c_stdout_to_stderr() -> Iterator[None]:
    """Send what Faiss's C++ code prints to stdout to stderr: stdout is the CLI's output."""
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
    """Read an index; lists kept on disk (``--on-disk``) are mapped from the ``.ivfdata`` beside it."""
    with open(path, "rb") as handle:
        binary = handle.read(len(BINARY_MAGIC)) == BINARY_MAGIC
    with c_stdout_to_stderr():
        if binary:
            index = faiss.read_index_binary(str(path))
        else:
            index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR)
    set_nprobe(index, nprobe)
    return index
