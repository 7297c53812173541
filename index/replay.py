"""Loading the snapshot file with the change log replayed on it, consistently while a writer
checkpoints, and a reader's ``refresh``: a mixin of ``LiveIndex`` (index/live.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from distilembed.artifacts import read_manifest
from distilembed.errors import UserError, first_line
from index import integrity
from index.integrity import INDEX_FILE, RESCORE_FILE
from index.live_state import Change, LiveState, Snapshot
from index.rescore import Rescorer
from index.vectors import RESCORED, add, describe, load_index, remove, storage_of


class Replaying(LiveState):
    """The consistent load and ``refresh`` for ``LiveIndex``."""

    if TYPE_CHECKING:  # defined by LiveIndex

        @property
        def writable(self) -> bool: ...

    def _replay(self, index: faiss.Index, rescorer: Rescorer | None) -> list[Change]:
        """Apply the logged changes to ``index`` and ``rescorer``; returns them."""
        changes = self.store.changes()
        _apply(index, rescorer, changes)
        return changes

    def _changes_after(self, seq: int) -> list[Change]:
        with self._lock:  # the store's connection is shared with searches
            return self.store.changes(seq)

    def _load_consistent(
        self, verify: bool = False
    ) -> tuple[faiss.Index, Rescorer | None, Snapshot, list[Change]]:
        """The snapshot file with the whole log applied, its rescorer and identity (``verify``: files the
        manifest's sha256 accepts); the log counts only if the file is still in place after it is read."""
        while True:
            checked = None
            if verify:
                names = integrity.recorded_replaced_files(read_manifest(self.dir))
                checked = self._checked = integrity.verified_files(f"index {self.dir}", self.dir, names)
            index, snapshot = _read_snapshot(self.dir / INDEX_FILE, self.nprobe)
            if checked is not None and snapshot != checked[INDEX_FILE][0]:
                continue  # replaced since it was hashed: check the new one
            changes = self._changes_after(0)
            if _snapshot_of(self.dir / INDEX_FILE) != snapshot:
                continue
            rescorer = self._open_rescorer(index)
            if rescorer is not None and checked is not None and rescorer.identity != checked[RESCORE_FILE][0]:
                continue  # not the file that was hashed
            _apply(index, rescorer, changes)
            return index, rescorer, snapshot, changes

    def _open_rescorer(self, index: faiss.Index) -> Rescorer | None:
        if storage_of(index) not in RESCORED:
            return None
        if not (self.dir / RESCORE_FILE).is_file():
            raise UserError(
                f"index {self.dir}: {RESCORE_FILE} is missing (compressed lists are rescored from it)"
            )
        return Rescorer(self.dir / RESCORE_FILE, self.dim, self.rescore_k)

    def refresh(self) -> int:
        """Bring a reader up to its writer's commits (new log rows, or a new snapshot file and the log);
        returns the changes applied."""
        if self.writable:
            return 0
        with self._refreshing:
            if _snapshot_of(self.dir / INDEX_FILE) == self._snapshot:
                changes = self._changes_after(self._applied)
                # Rows after the last applied are only dropped after a new file is renamed in.
                if _snapshot_of(self.dir / INDEX_FILE) == self._snapshot:
                    with self._lock:
                        _apply(self.index, self.rescorer, changes)
                        self._applied = changes[-1][0] if changes else self._applied
                    return len(changes)
            index, rescorer, snapshot, changes = self._load_consistent()
            with contextlib.suppress(OSError, ValueError):
                self.manifest = read_manifest(self.dir)
            with self._lock:
                self.index, self.rescorer, self._snapshot = index, rescorer, snapshot
                self.kind, self.nlist = describe(index)
                # Sequence numbers only grow (AUTOINCREMENT), so an empty log keeps the last seen.
                self._applied = max(self._applied, changes[-1][0]) if changes else self._applied
            return len(changes)


def _apply(index: faiss.Index, rescorer: Rescorer | None, changes: Sequence[Change]) -> None:
    for _, int_id, blob in changes:
        remove(index, [int_id])
        if blob is not None:
            add(index, np.frombuffer(blob, dtype="<f4").reshape(1, -1), np.array([int_id]))
    if rescorer is not None:
        rescorer.apply(changes)


_snapshot_of = integrity.file_identity  # a checkpoint renames a new file into place (a new inode)


def _read_snapshot(path: Path, nprobe: int) -> tuple[faiss.Index, Snapshot]:
    """Load the file and its identity, retrying if it was replaced while it was read."""
    while True:
        before = _snapshot_of(path)
        try:
            index = load_index(path, nprobe)
        except RuntimeError as exc:  # an index without checksums, or damaged after its check
            raise UserError(f"index {path.parent}: {path.name} cannot be read: {first_line(exc)}") from None
        if _snapshot_of(path) == before:
            return index, before
