"""The state ``LiveIndex.__init__`` (index/live.py) sets, declared once for the type checker: its
mixins (``Replaying`` in index/replay.py, ``Retraining`` in index/retrain.py) read and write it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    import faiss

    from index import integrity
    from index.rescore import Rescorer
    from index.store import DocumentStore

Change = tuple[int, int, bytes | None]  # a change-log row: seq, int id, float32 vector (None: delete)
Snapshot = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size of the snapshot file


class LiveState:
    """Attributes only; ``LiveIndex`` sets every one in ``__init__``."""

    dir: Path
    dim: int
    nprobe: int
    rescore_k: int
    manifest: dict[str, Any]
    kind: str
    nlist: int
    store: DocumentStore
    index: faiss.Index
    rescorer: Rescorer | None
    _lock: threading.RLock
    _retraining: threading.Lock
    _refreshing: threading.Lock
    _checked: integrity.Checked | None
    _snapshot: Snapshot
    _applied: int
    _pending: int
