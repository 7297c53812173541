"""An index directory opened for search and durable incremental writes: documents and their vector
changes are committed to SQLite in one transaction before the in-memory Faiss index changes. The
Faiss file is a snapshot: an open replays the logged changes on it (idempotently), a checkpoint
writes a new one and then drops the log rows it holds. One process writes a directory at a time.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import faiss
import numpy as np

from distilembed.errors import BusyError, UserError
from index import integrity
from index.browse import Browsing
from index.filtered_search import filtered_search, vector_search
from index.filters import MATCH_ALL, Node
from index.filters import parse as parse_filter
from index.fusion import fuse
from index.hits import HYBRID_CANDIDATES, Hit, HybridHit, check_fusion, hybrid_hits
from index.integrity import INDEX_FILE, RESCORE_FILE, STAGED_FILE, STAGED_RESCORE, STORE_FILE, writer_lock
from index.live_state import Change
from index.rescore import DEFAULT_RESCORE_K
from index.retrain import Retraining
from index.store import Document
from index.vectors import add, bytes_per_vector, centroid_bytes, on_disk, remove, save_index

LEXICAL_POOL = ThreadPoolExecutor(2, thread_name_prefix="distilembed-lexical")
log = logging.getLogger(__name__)
__all__ = ["INDEX_FILE", "STORE_FILE", "Hit", "HybridHit", "LiveIndex", "open_for_bundle"]


class LiveIndex(Retraining, Browsing):
    """Search, get, upsert and delete on a built index directory; thread-safe."""

    def __init__(
        self,
        directory: str | Path,
        nprobe: int | None = None,
        checkpoint_every: int = 10_000,
        writable: bool = True,
        rescore_k: int | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.manifest = integrity.read_index_manifest(self.dir)
        self.dim = int(self.manifest["dim"])
        self.kind = str(self.manifest.get("index_type", "ivf"))
        self.nlist = int(self.manifest.get("nlist", 0))
        self.nprobe = nprobe or int(self.manifest["nprobe"])
        self.rescore_k = rescore_k or int(self.manifest.get("rescore_k", DEFAULT_RESCORE_K))
        self.checkpoint_every = checkpoint_every
        self._lock = threading.RLock()
        self._bounded = 0  # try_search calls inside the lock (changed only under it)
        self._retraining = threading.Lock()
        self._refreshing = threading.Lock()
        self._writer: IO[str] | None = writer_lock(self.dir) if writable else None
        try:
            changes = self._open_checked()
        except BaseException:
            self._release_writer()
            raise
        self._applied = changes[-1][0] if changes else 0  # the last log seq this index holds
        self._pending = len(changes)
        if self._pending:
            log.info("%s: replayed %d logged vector changes", self.dir, self._pending)

    def _open_checked(self) -> list[Change]:
        """Check the files (sizes, the Faiss file's hash, SQLite), open the store, load the index."""
        sealed = integrity.has_records(self.manifest)
        if not sealed:
            later = "; they are recorded at its next checkpoint" if self.writable else ""
            log.warning(
                "%s carries no checksums (written before they were kept): opened unchecked%s", self.dir, later
            )
        if self.writable:
            integrity.remove_stale_temps(self.dir)
        self.store = integrity.open_store(f"index {self.dir}", self.dir, self.manifest, not self.writable)
        self._checked: integrity.Checked | None = None
        try:
            self.index, self.rescorer, self._snapshot, changes = self._load_consistent(verify=sealed)
        except BaseException:
            self.store.close()
            raise
        if self.writable and self._checked is not None:
            self.manifest = integrity.settle(self.dir, self.manifest, self._checked)
        return changes

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def check_vectors(self, vectors: np.ndarray, rows: int | None = None) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim or (rows is not None and len(vectors) != rows):
            raise UserError(f"vectors have shape {vectors.shape}, the index holds {self.dim}-d vectors")
        return vectors

    def search(
        self,
        queries: np.ndarray,
        k: int = 10,
        nprobe: int | None = None,
        where: dict[str, Any] | None = None,
        rescore_k: int | None = None,
    ) -> list[list[Hit]]:
        """Top-k hits per query row; ``where``: a metadata filter; ``rescore_k``: candidates rescored."""
        queries = self.check_vectors(queries)
        node = parse_filter(where)
        with self._lock:
            scores, ids = self._dense(queries, k, nprobe or self.nprobe, node, rescore_k)
            docs = self.store.get_many([int(i) for i in ids.ravel() if i >= 0])
        return [
            [
                Hit(d.id, s, d.text, d.metadata)
                for s, i in zip(row_s, row_i, strict=True)
                if (d := docs.get(i)) is not None
            ]
            for row_s, row_i in zip(scores.tolist(), ids.tolist(), strict=True)
        ]

    def try_search(
        self, queries: np.ndarray, k: int, max_scanned: int, peer_wait: float = 0.0
    ) -> list[list[Hit]] | None:
        """Unfiltered queries' top-k at the default nprobe, or None if another thread holds the index, a
        query would scan over ``max_scanned`` vectors, or its vectors are read from files (lists on disk,
        a rescoring file): bounded in-memory work that an event loop or an encoder thread may run itself
        instead of handing it to a thread. It does not wait for a writer; ``peer_wait``: seconds it may
        wait while another such bounded search holds the index (0: an event loop, which never waits)."""
        scanned = self.ntotal * min(1.0, self.nprobe / self.nlist) if self.nlist else self.ntotal
        if scanned > max_scanned or self.rescorer is not None or on_disk(self.index):
            return None
        # _bounded is read unlocked: at worst this waits peer_wait for a writer that has just taken over
        peer = peer_wait > 0 and self._bounded > 0
        if not self._lock.acquire(blocking=False) and not (peer and self._lock.acquire(timeout=peer_wait)):
            return None
        try:
            self._bounded += 1
            return self.search(queries, k)
        finally:
            self._bounded -= 1
            self._lock.release()

    def _dense(
        self, queries: np.ndarray, k: int, nprobe: int, node: Node, rescore_k: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if node == MATCH_ALL:
            return vector_search(self, queries, k, nprobe, rescore_k=rescore_k)
        return filtered_search(self, queries, k, nprobe, node, rescore_k=rescore_k)

    @property
    def lexical(self) -> bool:
        """Whether the index has its lexical (BM25) index (index/lexical.py)."""
        with self._lock:
            return self.store.lexical

    def enable_lexical(self) -> bool:
        """Add the lexical index over every document in one transaction (or rebuild it), and record it
        in the manifest; True if it was added. Writers only; its IVF lists may be on disk."""
        if self._writer is None:
            raise UserError(f"{self.dir} was opened read-only")
        with self._lock:
            added = self.store.enable_lexical()
            self.manifest = self.manifest | {"lexical": True}
            integrity.write_manifest(self.dir, self.manifest)
        return added

    def search_lexical(self, text: str, k: int = 10, where: dict[str, Any] | None = None) -> list[Hit]:
        """The top-k documents for ``text`` by BM25 (the score; higher is better); ``where``: a filter."""
        node = parse_filter(where)
        with self._lock:
            found = self.store.lexical_search(text, k, node)
            docs = self.store.get_many([i for i, _ in found])
        return [Hit(docs[i].id, s, docs[i].text, docs[i].metadata) for i, s in found if i in docs]

    def search_hybrid(
        self,
        query_vector: np.ndarray,
        text: str,
        k: int = 10,
        where: dict[str, Any] | None = None,
        *,
        fusion: str = "weighted",
        weights: Sequence[float] = (1.0, 1.0),
        candidates: int | None = None,
        nprobe: int | None = None,
        lexical: list[tuple[int, float]] | None = None,
    ) -> list[HybridHit]:
        """The top-k of the dense and the lexical top ``candidates`` (default: k, at least 50), both
        filtered by ``where``, fused (index/fusion.py: ``rrf``, or ``weighted`` min-max scores);
        ``weights``: (dense, lexical); ``lexical``: that side already found (``lexical_side``)."""
        check_fusion(k, fusion, weights)
        queries = self.check_vectors(np.reshape(np.asarray(query_vector, dtype=np.float32), (1, -1)))
        node, window = parse_filter(where), max(k, candidates or HYBRID_CANDIDATES)
        with self._lock:
            # Unfiltered, the dense side never touches the store: the lexical one runs beside it (Faiss
            # and SQLite let go of the GIL). Not with a filter: one SQLite connection used from two
            # threads deadlocks on the filter's Python SQL functions.
            lexical_side = functools.partial(self.store.lexical_search, text, window, node)
            beside = lexical is None and node == MATCH_ALL
            pending = LEXICAL_POOL.submit(lexical_side) if beside else None
            scores, ids = self._dense(queries, window, nprobe or self.nprobe, node, None)
            if lexical is None:
                lexical = pending.result() if pending else lexical_side()
            dense = [(int(i), float(s)) for s, i in zip(scores[0], ids[0], strict=True) if i >= 0]
            fused = fuse(dense, lexical, fusion, weights)[:k]
            return hybrid_hits(fused, self.store.get_many([i for i, _ in fused]), dense, lexical)

    def lexical_side(
        self, text: str, k: int = 10, where: dict[str, Any] | None = None, candidates: int | None = None
    ) -> list[tuple[int, float]]:
        """A hybrid search's lexical candidates, (id, BM25) best first, for a caller that finds them
        while the query is still being encoded and passes them to ``search_hybrid(lexical=...)``. The
        two sides then see the index a moment apart, as two searches would: a document deleted in
        between is left out of the hits."""
        node, window = parse_filter(where), max(k, candidates or HYBRID_CANDIDATES)
        with self._lock:
            return self.store.lexical_search(text, window, node)

    def count(self, where: dict[str, Any] | None = None) -> int:
        """How many documents pass the filter (all of them without one)."""
        node = parse_filter(where)
        with self._lock:
            return self.store.count() if node == MATCH_ALL else self.store.count_matching(node)

    def add_field_index(self, field: str) -> bool:
        """Index a metadata field for filters (index/store.py); False if it was already."""
        self._require_writable()
        with self._lock:
            return self.store.add_field_index(field)

    @property
    def indexed_fields(self) -> tuple[str, ...]:
        with self._lock:
            return self.store.indexed_fields()

    def get(self, ext_id: str) -> Document | None:
        with self._lock:
            return self.store.get(ext_id)

    def footprint(self) -> dict[str, Any]:
        """Bytes per document in memory and (compressed lists) on disk, and the centroids' bytes."""
        per_doc: dict[str, Any] = {"memory_bytes_per_doc": bytes_per_vector(self.index)}
        if centroids := centroid_bytes(self.index):
            per_doc["centroid_bytes"] = centroids
        if self.rescorer is not None:
            per_doc["rescore_bytes_per_doc_on_disk"] = 4 * self.dim
        return per_doc

    @property
    def writable(self) -> bool:
        return self._writer is not None

    def _require_writable(self) -> None:
        if self._writer is None:
            raise UserError(f"{self.dir} was opened read-only")
        if on_disk(self.index):  # adding to mapped lists would write the snapshot in place
            raise BusyError(
                f"{self.dir} keeps its IVF lists on disk (built with --on-disk) and is read-only: "
                "rebuild it to change it"
            )

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray) -> tuple[int, int]:
        """Insert or replace documents with their vectors; durable on return. Returns (added, replaced)."""
        self._require_writable()
        vectors = self.check_vectors(vectors, rows=len(docs))
        with self._lock:
            ids, replaced = self.store.upsert(docs, vectors)
            last = {int_id: row for row, int_id in enumerate(ids)}  # last occurrence wins
            int_ids = np.fromiter(last, dtype=np.int64, count=len(last))
            remove(self.index, replaced)
            add(self.index, vectors[list(last.values())], int_ids)
            if self.rescorer is not None:
                self.rescorer.put(int_ids, vectors[list(last.values())])
            self._note_changes(len(last))
        return len(last) - len(replaced), len(replaced)

    def delete(self, ext_ids: Sequence[str]) -> list[str]:
        """Delete documents; durable on return. Returns the ids that existed."""
        self._require_writable()
        with self._lock:
            gone = self.store.delete_logged(ext_ids)
            remove(self.index, list(gone.values()))
            if self.rescorer is not None:
                self.rescorer.drop(gone.values())
            self._note_changes(len(gone))
        return list(gone)

    def _note_changes(self, n: int) -> None:
        self._pending += n
        if self._pending >= self.checkpoint_every:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Write the in-memory index as the new snapshot, then drop the change log it covers."""
        with self._lock:
            # A retrain replays the whole log since it began (checked under the lock its start takes).
            if not self._retraining.locked():
                self._write_snapshot()

    def _write_snapshot(self) -> None:
        with self._lock:
            # Only the newest seq, not the whole log (docs/decisions.md, 30: it grew the heap).
            last = self.store.last_change() if self.writable else None
            if last is None:
                return
            rescorer = self.rescorer
            staged = rescorer.write(self.dir / STAGED_RESCORE) if rescorer and rescorer.fresh else None
            manifest = self._install(self.index, staged)
            if rescorer and staged:
                rescorer.reload()  # the file now holds every change: map it, forget them
            self.store.drop_changes(last)
            self._pending = 0
            self.manifest = manifest
            integrity.write_manifest(self.dir, manifest)

    def _install(self, index: faiss.Index, rescore_file: Path | None = None) -> dict[str, Any]:
        """Make ``index`` (and ``rescore_file``) the snapshot files; returns the manifest to write."""
        staged = {RESCORE_FILE: rescore_file} if rescore_file is not None else {}
        save_index(index, self.dir / STAGED_FILE)
        return integrity.replace_files(self.dir, staged | {INDEX_FILE: self.dir / STAGED_FILE}, self.manifest)

    def snapshot(self, out: str | Path, overwrite: bool = False, link: bool = True) -> dict[str, Any]:
        """A consistent copy in the new directory ``out``, holding every write acknowledged before the
        call (index/snapshot.py); BusyError while a retrain runs."""
        from index.snapshot import take_snapshot

        pin = self._pinned if self.writable else None
        return take_snapshot(self.dir, Path(out), overwrite=overwrite, pin=pin, link=link)

    @contextmanager
    def _pinned(self) -> Iterator[dict[str, Any]]:
        """Hold off checkpoints and writes while a snapshot pins the files; yields their manifest."""
        with self._lock:
            if self._retraining.locked():  # its file is swapped in outside the lock
                raise BusyError(f"{self.dir}: a retrain is running; take the snapshot once it has finished")
            yield dict(self.manifest)

    def close(self, checkpoint: bool = True) -> None:
        with self._lock:
            if checkpoint:
                self.checkpoint()
            self.store.close()
            self._release_writer()

    def _release_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()  # closing the file releases the flock
            self._writer = None


def open_for_bundle(
    directory: str | Path,
    dim: int,
    bundle_sha256: str | None = None,
    nprobe: int | None = None,
    writable: bool = True,
    *,
    rescore_k: int | None = None,
) -> LiveIndex:
    """Open an index for a bundle's encoder (``bundle_sha256``: its manifest's); another bundle's
    vectors live in an unrelated space, so it is an error."""
    index = LiveIndex(directory, nprobe, writable=writable, rescore_k=rescore_k)
    built_with = index.manifest.get("bundle", {}).get("manifest_sha256")
    if dim != index.dim:
        index.close(checkpoint=False)
        raise UserError(f"the bundle gives {dim}-d vectors but {directory} holds {index.dim}-d vectors")
    if bundle_sha256 and built_with and bundle_sha256 != built_with:
        index.close(checkpoint=False)
        raise UserError(f"{directory} was built with another bundle (manifest sha256 {built_with[:12]}...)")
    return index
