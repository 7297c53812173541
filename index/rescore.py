"""Rescoring for compressed IVF lists (pq, binary; docs/decisions.md, 32): their ``rescore_k``
candidates are scored exactly against ``rescore.f32``, int id ``i``'s float32 vector at row ``i``,
memory-mapped. Like the Faiss file it is a snapshot a checkpoint renames in (before the Faiss file);
the changes since, replayed from the log, are kept in memory (``fresh``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import faiss
import numpy as np

from distilembed.artifacts import FILE_MODE
from distilembed.errors import UserError
from index.integrity import Identity, fsync_path
from index.vectors import held_vectors, ids_of, search

DEFAULT_RESCORE_K = 20  # bench/rescore_k.py: 50 buys 0.3-0.4 MRR@10 for ~25% more time (decision 44)
CHUNK_ROWS = 1 << 16  # rows copied per step when a new file is written


def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (score, id) of each row, best first; missing entries are (-inf, -1)."""
    scores = np.where(ids >= 0, scores, -np.inf).astype(np.float32)
    if scores.shape[1] > k:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        scores, ids = np.take_along_axis(scores, part, 1), np.take_along_axis(ids, part, 1)
    order = np.argsort(-scores, axis=1, kind="stable")
    scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    return scores, np.where(np.isfinite(scores), ids, -1)


class Rescorer:
    """The exact vectors of a compressed index: the memory-mapped file plus the changes since."""

    def __init__(self, path: Path, dim: int, rescore_k: int = DEFAULT_RESCORE_K) -> None:
        self.path, self.dim, self.rescore_k = path, dim, rescore_k
        self.reload()

    def reload(self) -> None:
        """Map the file now at ``path`` (a checkpoint wrote it with every change): none are fresh."""
        with open(self.path, "rb") as handle:  # the identity of the file mapped, not of the path
            st = os.fstat(handle.fileno())
            self.identity: Identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            rows, extra = divmod(st.st_size, 4 * self.dim)
            if extra:
                raise UserError(
                    f"index {self.path.parent}: {self.path.name} is {st.st_size:,} bytes, not whole "
                    f"{self.dim}-d float32 rows (truncated?)"
                )
            self.base: np.ndarray = (
                np.memmap(handle, dtype="<f4", mode="r", shape=(rows, self.dim))
                if rows
                else np.zeros((0, self.dim), "<f4")
            )
        self.fresh: dict[int, np.ndarray | None] = {}  # None: deleted since the file was written

    def put(self, ids: Iterable[int], vectors: np.ndarray) -> None:
        for int_id, vector in zip(ids, vectors, strict=True):
            self.fresh[int(int_id)] = np.array(vector, dtype="<f4")

    def drop(self, ids: Iterable[int]) -> None:
        self.fresh.update(dict.fromkeys(map(int, ids)))

    def apply(self, changes: Sequence[tuple[int, int, bytes | None]]) -> None:
        """Logged changes (seq, int id, float32 bytes or None for a delete), oldest first."""
        for _, int_id, blob in changes:
            self.fresh[int(int_id)] = None if blob is None else np.frombuffer(blob, dtype="<f4")

    def vectors(self, ids: np.ndarray, fresh: bool = True) -> np.ndarray:
        """float32 rows for ``ids`` (zeros for -1 and unknown ids); ``fresh`` False: the file's alone."""
        flat = np.asarray(ids, dtype=np.int64).ravel()
        out = np.zeros((len(flat), self.dim), dtype=np.float32)
        held = (flat >= 0) & (flat < len(self.base))
        if held.any():
            wanted = flat[held]
            order = np.argsort(wanted, kind="stable")  # ascending offsets: sequential-ish reads
            rows = np.empty((len(wanted), self.dim), dtype=np.float32)
            rows[order] = self.base[wanted[order]]
            out[held] = rows
        if fresh:
            for (row,), vector in self._changed(flat):
                out[row] = 0.0 if vector is None else vector
        return out

    def _changed(self, ids: np.ndarray) -> Iterator[tuple[tuple[int, ...], np.ndarray | None]]:
        """(position in ``ids``, vector or None if deleted) of each id changed since the file."""
        if not self.fresh:
            return
        changed = np.isin(ids, np.fromiter(self.fresh, np.int64, len(self.fresh)))
        for position in zip(*np.nonzero(changed), strict=True):
            yield tuple(int(p) for p in position), self.fresh[int(ids[position])]

    def search(
        self,
        index: faiss.Index,
        queries: np.ndarray,
        k: int,
        nprobe: int | None,
        *,
        allowed: Sequence[int] | np.ndarray | None = None,
        rescore_k: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids): the lists' candidates rescored, or with ``allowed``, every allowed id scored."""
        if allowed is not None:
            ids = np.asarray(allowed, dtype=np.int64)
            scores = queries @ self.vectors(ids).T
            return top_k(scores, np.broadcast_to(ids, scores.shape), k)
        _, ids = search(index, queries, max(k, rescore_k or self.rescore_k), nprobe)
        return top_k(self.scores(queries, ids), ids, k)

    def scores(self, queries: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Each query's inner product with each of its candidates (-1: -inf), by Faiss from the file's
        rows in place; candidates changed since the file are scored here."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        in_file = np.where(ids < len(self.base), ids, -1)  # Faiss would read past the file's end
        out = np.full(ids.shape, -np.inf, dtype=np.float32)
        if len(self.base) and ids.size:
            faiss.fvec_inner_products_by_idx(
                faiss.swig_ptr(out),
                faiss.swig_ptr(queries),
                faiss.swig_ptr(self.base),
                faiss.swig_ptr(in_file),
                self.dim,
                len(queries),
                ids.shape[1],
            )
        for (row, col), vector in self._changed(ids):
            out[row, col] = -np.inf if vector is None else float(queries[row] @ vector)
        return out

    def write(self, out: Path) -> Path:
        """A new file at ``out``: this file's rows with the changes applied (then fsynced)."""
        changed = np.fromiter(self.fresh, np.int64, len(self.fresh))
        rows = int(max([len(self.base), *(changed + 1)]))
        batches = [(np.arange(len(self.base)), self.base), (changed, self.vectors(changed))]
        return write_batches(out, batches, rows, self.dim)


def write_rows(out: Path, ids: np.ndarray, vectors: np.ndarray, dim: int) -> Path:
    """A new file at ``out`` holding ``vectors`` at the rows ``ids`` (zeros elsewhere)."""
    rows = int(ids.max()) + 1 if len(ids) else 0
    return write_batches(out, [(ids, vectors)], rows, dim)


def write_batches(out: Path, batches: Iterable[tuple[np.ndarray, np.ndarray]], rows: int, dim: int) -> Path:
    """A new file at ``out`` of ``rows`` rows holding each batch's vectors at its ids."""
    with _mapped_for_writing(out, rows, dim) as target:
        for ids, vectors in batches:
            for lo in range(0, len(ids), CHUNK_ROWS):
                target[ids[lo : lo + CHUNK_ROWS]] = vectors[lo : lo + CHUNK_ROWS]
    return out


@contextmanager
def _mapped_for_writing(path: Path, rows: int, dim: int) -> Iterator[np.ndarray]:
    """A zero-filled float32 file mapped for writing: fsynced on a clean exit, removed on an error."""
    with open(path, "wb") as handle:
        os.fchmod(handle.fileno(), FILE_MODE)
        handle.truncate(rows * dim * 4)
    try:
        if rows:
            target = np.memmap(path, dtype="<f4", mode="r+", shape=(rows, dim))
            yield target
            target.flush()
            del target
        else:
            yield np.zeros((0, dim), "<f4")
        fsync_path(path)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def exact_vectors(
    index: faiss.Index, rescorer: Rescorer | None, fresh: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of ``index``: from its lists, or ``rescorer`` (``fresh`` False: its file)."""
    if rescorer is None:
        return held_vectors(index)
    ids = ids_of(index)
    return ids, rescorer.vectors(ids, fresh=fresh)
