"""Retraining a live index in place (``LiveIndex.retrain``): a new IVF trained on the vectors it
holds, swapped in under the same ids while searches and writes go on."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from distilembed.artifacts import atomic_write_json, now_iso
from distilembed.errors import BusyError
from index import integrity
from index.integrity import INDEX_FILE, RESCORE_FILE, STAGED_RESCORE
from index.replay import Replaying
from index.rescore import exact_vectors, write_rows
from index.vectors import (
    FLAT_BELOW,
    RESCORED,
    add,
    build_index,
    check_storage,
    load_index,
    plan_index,
    pq_shape,
    set_nprobe,
    storage_of,
)

if TYPE_CHECKING:
    from pathlib import Path

    import faiss

log = logging.getLogger("index.live")


class Retraining(Replaying):
    """``retrain`` for ``LiveIndex`` (index/live.py), whose lock, change log and files it uses."""

    if TYPE_CHECKING:  # defined by LiveIndex

        @property
        def ntotal(self) -> int: ...
        def _require_writable(self) -> None: ...
        def _write_snapshot(self) -> None: ...
        def _install(self, index: faiss.Index, rescore_file: Path | None = None) -> dict[str, Any]: ...

    def retrain(
        self,
        nlist: int = 1024,
        storage: str | None = None,
        flat_below: int = FLAT_BELOW,
        seed: int = 0,
        pq: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """Train a new index on the vectors held and swap it in under the same ids while searches and
        writes go on (replayed from the log); returns the new manifest. ``storage``, ``pq`` None: keep."""
        self._require_writable()
        storage = storage or storage_of(self.index)
        pq = pq or pq_shape(self.index)
        check_storage(storage, self.dim, *pq)
        if not self._retraining.acquire(blocking=False):
            raise BusyError(f"{self.dir}: a retrain is already running")
        try:
            start, locked = time.perf_counter(), 0.0
            with self._lock:
                t = time.perf_counter()
                self._write_snapshot()  # from here the log holds the changes made during training
                locked += time.perf_counter() - t
            # Checkpoints wait for this retrain: until the swap, the files hold this snapshot.
            snapshot = load_index(self.dir / INDEX_FILE, self.nprobe)
            ids, vectors = exact_vectors(snapshot, self.rescorer, fresh=False)
            plan = plan_index(len(ids), nlist, flat_below, storage, pq)
            log.info("retrain %s: %d vectors, %s -> %s", self.dir, len(ids), self.kind, plan)
            fresh = build_index(vectors, plan, seed=seed)
            add(fresh, vectors, ids)
            set_nprobe(fresh, self.nprobe)
            rescored = storage_of(fresh) in RESCORED
            staged = None
            if rescored and self.rescorer is None:  # the vectors' first rescoring file
                staged = write_rows(self.dir / STAGED_RESCORE, ids, vectors, self.dim)
            with self._lock:
                t = time.perf_counter()
                saved = self._replay(fresh, None)  # the writes made while it trained
                locked += time.perf_counter() - t
            installed = self._install(fresh, staged)  # a crash from here on replays the log onto it
            rescorer = (self.rescorer or self._open_rescorer(fresh)) if rescored else None
            with self._lock:
                t = time.perf_counter()
                self._replay(fresh, rescorer)  # and those made while it was saved (idempotent)
                if saved:
                    self.store.drop_changes(saved[-1][0])  # only what the saved file holds
                retrained = {"at": now_iso(), "from": {"index_type": self.kind, "nlist": self.nlist}}
                self.index, self.rescorer = fresh, rescorer
                self.kind, self.nlist = plan.index_type, plan.nlist
                self._pending = self.store.count_changes()
                self.manifest = installed | {
                    "index_type": plan.index_type,
                    "nlist": plan.nlist,
                    "plan": plan.reason,
                    "ntotal": self.ntotal,
                    "retrained": retrained
                    | {
                        "seconds": round(time.perf_counter() - start, 2),
                        "blocking_seconds": round(locked + time.perf_counter() - t, 3),
                    },
                }
                # A crash before this leaves the old type/nlist labels: searches work, a retrain fixes them.
                atomic_write_json(self.dir / "manifest.json", self.manifest)
                integrity.fsync_path(self.dir)
                if not rescored and RESCORE_FILE in self.manifest.get("files", {}):
                    self.manifest = integrity.drop_file(self.dir, RESCORE_FILE, self.manifest)
            return self.manifest
        finally:
            self._retraining.release()
