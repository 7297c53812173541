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
from faiss.contrib.inspect_tools import get_invlist

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
    # How IVF lists hold vectors: float32; sq8 (a byte per dimension); pq (pq_m codes of pq_bits
    # bits); binary (a sign bit per dimension, Hamming distance, under float centroids).
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
    """A Faiss binary index (Hamming centroids too): how binary lists were built before decision 40.
    Such files still load, search and take upserts; a retrain rebuilds them as ``binary_lists``."""
    return isinstance(index, faiss.IndexBinary)


def has_binary_lists(index: faiss.Index | faiss.IndexBinary) -> bool:
    """Whether the lists hold sign bits (either form): scores are 1 - 2 x Hamming / d."""
    return isinstance(index, faiss.IndexBinary | faiss.IndexIVFSpectralHash)


def binary_lists(dim: int, nlist: int) -> faiss.IndexIVFSpectralHash:
    """An untrained IVF whose lists hold ``dim`` sign bits per vector (``dim / 8`` bytes), under
    float centroids: a query probes the lists a float IVF would, and scans them by Hamming distance
    (docs/decisions.md, 40)."""
    index = faiss.IndexIVFSpectralHash(faiss.IndexFlatIP(dim), dim, nlist, dim, SIGN_PERIOD)
    index.threshold_type = faiss.IndexIVFSpectralHash.Thresh_global
    index.cp.spherical = True  # as Faiss trains an inner-product IVF: the float32 lists' centroids
    return index


def copy_index(index: faiss.Index | faiss.IndexBinary) -> faiss.Index | faiss.IndexBinary:
    """A deep copy through Faiss's own serialisation: ``clone_index`` copies an
    IndexIVFSpectralHash's rotation by pointer, and both copies would free it."""
    if is_binary(index):
        return faiss.deserialize_index_binary(faiss.serialize_index_binary(index))
    return faiss.deserialize_index(faiss.serialize_index(index))


def signs(vectors: np.ndarray) -> np.ndarray:
    """The sign bits of each row packed 8 to a byte, most significant first (sentence-transformers'
    ``quantize_embeddings(..., "ubinary")``): what binary lists hold."""
    return np.packbits(np.asarray(vectors) > 0, axis=1)


def on_disk(index: faiss.Index) -> bool:
    """Whether an IVF index's lists live in a memory-mapped file (read-only here)."""
    if is_binary(index):
        return False
    try:
        lists = faiss.extract_index_ivf(index).invlists
    except RuntimeError:
        return False
    return isinstance(faiss.downcast_InvertedLists(lists), faiss.OnDiskInvertedLists)


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
    """Lists searched per query by default: 8 for the rescored lists (pq, binary), whose candidates
    are rescored, so more lists buy recall cheaply (bench/binary_lists.py, 136,824 documents, 1,024
    binary lists: Quora MRR@10 rescored 95.1% of the teacher's exact search at nprobe 5, 96.4% at 8,
    97.6% at 16, at 8.9x / 8.8x / 6.2x the teacher's IVF speed; docs/decisions.md, 40, 43); 5 for
    float32 and sq8."""
    return 8 if storage in RESCORED else 5


def default_pq_m(dim: int) -> int:
    """Codes per vector by default: one per 8 dimensions (16 bytes at 128-d), or the nearest
    smaller divisor of ``dim``."""
    return max(m for m in range(1, max(1, dim // 8) + 1) if dim % m == 0)


def pq_shape(index: faiss.Index) -> tuple[int, int]:
    """(m, bits) of a PQ index's codes; the defaults for its dimension for any other."""
    if isinstance(index, faiss.IndexIVFPQ):
        return int(index.pq.M), int(index.pq.nbits)
    return default_pq_m(index.d), IndexPlan.pq_bits


def bytes_per_vector(index: faiss.Index) -> float:
    """Memory a vector takes in the lists: its code plus its 8-byte id (flat: code only)."""
    if is_ivf(index):
        return float(index.code_size + 8)
    return 4.0 * index.d


def centroid_bytes(index: faiss.Index | faiss.IndexBinary) -> int:
    """Memory the IVF's coarse centroids take, whatever the number of documents (flat: 0): 4 x d
    bytes per list for float centroids (every storage now), d / 8 for older binary lists'."""
    if not is_ivf(index):
        return 0
    downcast = faiss.downcast_IndexBinary if is_binary(index) else faiss.downcast_index
    quantizer = downcast(index.quantizer)
    return int(quantizer.ntotal * quantizer.code_size)


def binary_nlist(n: int) -> int:
    """The most binary lists worth having for ``n`` vectors: about sqrt(n). Their counting scan costs
    ~1 ns a code while the coarse step compares every query with every float centroid, so below
    ~1M vectors fewer, longer lists are faster and no worse (docs/decisions.md, 43)."""
    return max(1, math.isqrt(n))


def plan_index(
    n: int,
    nlist: int = 1024,
    flat_below: int = FLAT_BELOW,
    storage: str = "float32",
    pq: tuple[int, int] = (16, 8),
) -> IndexPlan:
    """IVF with the requested nlist if the corpus can train it, else a smaller nlist or flat.
    ``pq``: (m, bits) of pq storage."""
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
    if storage == "binary" and (fewer := binary_nlist(n)) < fitted:
        fitted = fewer
        reason = (
            f"nlist lowered {nlist} -> {fitted}, about sqrt(n): binary lists scan fast, the centroids do not"
        )
        return IndexPlan("ivf", fitted, reason, storage, *pq)
    if fitted < nlist:
        reason = f"nlist lowered {nlist} -> {fitted} to keep >= {MIN_POINTS_PER_LIST} points/list"
        return IndexPlan("ivf", fitted, reason, storage, *pq)
    return IndexPlan("ivf", nlist, "as requested", storage, *pq)


def new_ivf(dim: int, nlist: int, storage: str = "float32", pq: tuple[int, int] = (16, 8)) -> faiss.Index:
    """An untrained inner-product IVF. ``sq8`` stores each dimension (of the residual to the list's
    centroid) in one byte, 4x less memory than float32. Its per-dimension ranges are learnt in
    ``train``; values of later vectors outside them are clipped (docs/decisions.md, 19). ``pq``
    stores m codes of the residual, ``binary`` sign bits (``binary_lists``): both rank only
    roughly and are rescored (index/rescore.py)."""
    if storage == "binary":
        return binary_lists(dim, nlist)
    quantizer = faiss.IndexFlatIP(dim)
    if storage == "pq":
        m, bits = pq
        return faiss.IndexIVFPQ(quantizer, dim, nlist, m, bits, faiss.METRIC_INNER_PRODUCT)
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
    index = new_ivf(dim, plan.nlist, plan.storage, (plan.pq_m, plan.pq_bits))
    size = min(len(vectors), train_size or 64 * plan.nlist)
    sample = np.random.default_rng(seed).choice(len(vectors), size=size, replace=False)
    rows = np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32)
    index.train(signs(rows) if is_binary(index) else rows)
    return index


def held_vectors(index: faiss.Index) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of every entry of a flat (IDMap2) or IVF index; from sq8 lists the vectors
    come back decoded (one byte per dimension). Not for binary lists: their vectors are the
    rescoring file's (index/rescore.py)."""
    if has_binary_lists(index):
        raise UserError("binary lists hold sign bits only: read the vectors from the rescoring file")
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
    if isinstance(index, faiss.IndexBinaryIVF):
        index.nprobe = nprobe
        return
    try:
        faiss.extract_index_ivf(index).nprobe = nprobe
    except RuntimeError:  # flat index: nothing to probe
        return


def search(
    index: faiss.Index, queries: np.ndarray, k: int, nprobe: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each (n_queries, k); missing neighbours have id -1. Binary lists score
    1 - 2 * Hamming distance / d, the cosine of the sign vectors' angle estimate."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if countable(index):
        distances, ids = hamming_search(index, queries, k, index.nprobe if nprobe is None else nprobe)
    else:
        params = faiss.SearchParametersIVF(nprobe=nprobe) if nprobe is not None and is_ivf(index) else None
        if is_binary(index):
            count_coarse_hamming(index)
        distances, ids = index.search(signs(queries) if is_binary(index) else queries, k, params=params)
    if has_binary_lists(index):
        return (1.0 - 2.0 * distances / index.d).astype(np.float32), ids
    return distances, ids


def count_coarse_hamming(index: faiss.IndexBinary) -> None:
    """Let a binary IVF pick its nearest lists by counting Hamming distances (0..d) instead of
    keeping a heap: the same lists, 1.5-1.7x faster over 1,024 centroids (docs/decisions.md, 36).
    Faiss does not store the flag in the file, so every search sets it. Only the coarse step of these
    older files; today's binary lists count in their scan too (index/binary_scan.py)."""
    if isinstance(index, faiss.IndexBinaryIVF):
        quantizer = faiss.downcast_IndexBinary(index.quantizer)
        if isinstance(quantizer, faiss.IndexBinaryFlat):
            quantizer.use_heap = False


def save_index(index: faiss.Index, path: Path) -> None:
    """Write to a temp file beside ``path``, fsync, rename: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 would hide the index from a container's other uid
    os.close(fd)
    try:
        (faiss.write_index_binary if is_binary(index) else faiss.write_index)(index, tmp)
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
    with open(path, "rb") as handle:
        binary = handle.read(len(BINARY_MAGIC)) == BINARY_MAGIC
    with c_stdout_to_stderr():
        if binary:
            index = faiss.read_index_binary(str(path))
        else:
            index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR)
    set_nprobe(index, nprobe)
    return index
