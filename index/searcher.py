"""The interface of an index the service searches and writes: ``LiveIndex``, ``ShardedIndex``, and in
``service/`` ``ReplicaIndex``, ``ShardHandle`` and ``FakeIndex``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

    from index.hits import Hit, HybridHit
    from index.store import Document


class Searcher(Protocol):
    """What a search asks of an index, or of each of its shards."""

    def search(
        self,
        queries: np.ndarray,
        k: int,
        nprobe: int | None = None,
        where: dict[str, Any] | None = None,
        rescore_k: int | None = None,
    ) -> list[list[Hit]]:
        """Top-k hits per query row; ``where``: a metadata filter (index/filters.py)."""
        ...

    def search_lexical(self, text: str, k: int = 10, where: dict[str, Any] | None = None) -> list[Hit]:
        """Top-k by BM25 (the score); UserError where the index has no lexical table."""
        ...

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
    ) -> list[HybridHit]:
        """Top-k of the dense and the lexical candidates fused (``weighted`` or ``rrf``)."""
        ...

    def get(self, ext_id: str) -> Document | None: ...
    def count(self, where: dict[str, Any] | None = None) -> int: ...
    def vectors(self, ext_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The vectors held for these documents (unknown ids left out)."""
        ...

    def list_documents(self, after: int = 0, limit: int = 10) -> list[tuple[int, Document]]:
        """Up to ``limit`` (int id, document) with an int id above ``after``, in int id order."""
        ...


# The methods a Searcher answers, by name (a shard deployment answers these and no others).
SEARCHES = frozenset(
    {"search", "search_lexical", "search_hybrid", "get", "count", "vectors", "list_documents"}
)


class IndexLike(Searcher, Protocol):
    """All the service uses of an index: searches, what /info reports, and the writes."""

    # Read-only here: the service never sets them (a replica's or a sharded index's are properties).
    @property
    def dim(self) -> int: ...
    @property
    def nprobe(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def nlist(self) -> int: ...
    @property
    def manifest(self) -> dict[str, Any]: ...
    @property
    def ntotal(self) -> int: ...
    @property
    def indexed_fields(self) -> tuple[str, ...]: ...
    @property
    def lexical(self) -> bool:
        """Whether it has the lexical (BM25) table that lexical and hybrid searches need."""
        ...

    def add_field_index(self, field: str) -> bool: ...
    def upsert(self, docs: Sequence[Document], vectors: np.ndarray) -> tuple[int, int]: ...
    def delete(self, ext_ids: Sequence[str]) -> list[str]: ...
    def checkpoint(self) -> None: ...
    def retrain(
        self, nlist: int = 1024, storage: str | None = None, flat_below: int = 10_000, seed: int = 0
    ) -> dict[str, Any]: ...
    def snapshot(self, out: Path) -> dict[str, Any]: ...
    def close(self) -> None: ...


# The methods of an IndexLike that write, by name (what an index writer answers for its replicas).
WRITES = frozenset({"upsert", "delete", "retrain", "checkpoint", "snapshot", "add_field_index"})
