"""Reading documents back: pages of them in int id order (keyset pagination, the cursor being the last
int id of a page) and the vectors an index holds for them; ``Browsing`` is a mixin of ``LiveIndex``
(index/live.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import faiss
import numpy as np

from distilembed.errors import UserError
from index.live_state import LiveState
from index.vectors import has_binary_lists

if TYPE_CHECKING:
    from index.rescore import Rescorer
    from index.store import Document

INT64_MAX = (1 << 63) - 1


class Browsing(LiveState):
    def list_documents(self, after: int = 0, limit: int = 10) -> list[tuple[int, Document]]:
        """Up to ``limit`` (int id, document) with an int id above ``after``, in int id order. Pages
        walked by their last int id visit every document present throughout exactly once, whatever
        is written meanwhile: a replaced document keeps its int id, a new one gets a larger one."""
        with self._lock:
            return self.store.page(after, limit)

    def vectors(self, ext_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The vectors the index holds for these documents (sq8 lists: decoded, so approximate);
        unknown ids are left out."""
        with self._lock:
            known = self.store.int_ids(ext_ids)
            rows = stored_vectors(
                self.index, self.rescorer, np.fromiter(known.values(), np.int64, len(known))
            )
        return dict(zip(known, rows, strict=True))


def stored_vectors(index: faiss.Index, rescorer: Rescorer | None, ids: np.ndarray) -> np.ndarray:
    """float32 rows for int ``ids``: from the rescoring file (pq, binary), else decoded from the index.
    An IVF finds ids through Faiss's hash table direct map, built by the first call (a pass over its
    ids; about 40 bytes a vector) and kept: Faiss updates it with every add and remove, and
    ``save_index`` leaves it out of the file."""
    if rescorer is not None:
        return rescorer.vectors(ids)
    if has_binary_lists(index):
        raise UserError("these binary lists hold sign bits and no rescoring file: no vectors to return")
    if not len(ids):
        return np.zeros((0, index.d), np.float32)
    if isinstance(index, faiss.IndexIVF):
        if index.direct_map.type == faiss.DirectMap.NoMap:
            index.set_direct_map_type(faiss.DirectMap.Hashtable)
        return index.reconstruct_batch(ids)
    return faiss.downcast_index(index).reconstruct_batch(ids)  # IDMap2: by its reverse map


def after_cursor(cursor: str | None) -> int:
    """The int id a page's cursor stands for (None or "": before the first); UserError for anything
    but a cursor a page gave (decimal digits)."""
    if not cursor:
        return 0
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 20):
        raise UserError(f"cursor {cursor[:40]!r} is not one a page gave: pass its next_cursor unchanged")
    return min(int(cursor), INT64_MAX)


Lister = Callable[[int, int], list[tuple[int, "Document"]]]  # an index's ``list_documents``


def documents_page(lister: Lister, cursor: str | None, limit: int) -> tuple[list[Document], str | None]:
    """Up to ``limit`` documents after ``cursor``, and the cursor of the next page (None: the last)."""
    rows = lister(after_cursor(cursor), limit + 1)
    more = len(rows) > limit
    return [doc for _, doc in rows[:limit]], str(rows[limit - 1][0]) if more else None
