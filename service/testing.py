"""Fakes of the encoder and the live index for fast, offline tests of the service (and of its users)."""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distilembed.errors import BusyError, UserError
from index.filters import join_path, matches, split_path
from index.filters import parse as parse_filter
from index.hits import Hit
from index.shards import hybrid_by_sides
from index.store import Document
from index.vectors import plan_index

if TYPE_CHECKING:
    from index.searcher import IndexLike


@lru_cache(maxsize=4096)
def _token_vector(token: int, dim: int) -> np.ndarray:
    return np.random.default_rng(token).standard_normal(dim).astype(np.float32)


class FakeEncoder:
    """Deterministic bag-of-words vectors; records every call's batch size. Every ``encode_ids`` call
    sets ``entered``, then waits for ``gate`` if one is given (tests hold the worker busy with it)."""

    def __init__(self, dim: int = 8, max_seq_len: int = 16, gate: threading.Event | None = None) -> None:
        self.dim, self.max_seq_len, self.gate = dim, max_seq_len, gate
        self.variant = "fake"
        self.bundle = Path("fake-bundle")
        self.manifest: dict[str, Any] = {"kind": "bundle", "dim": dim, "max_seq_len": max_seq_len}
        self.calls: list[int] = []
        self.run_batches: list[int | None] = []  # the batch_size each call asked for
        self.entered = threading.Event()
        self.fail_with: Exception | None = None

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        words = [[zlib.crc32(w.lower().encode()) % 30_000 + 1000 for w in t.split()] for t in texts]
        return [[101, *row[: self.max_seq_len - 2], 102] for row in words]

    def encode_ids(self, ids: list[list[int]], batch_size: int | None = None) -> np.ndarray:
        self.calls.append(len(ids))
        self.run_batches.append(batch_size)
        self.entered.set()
        if self.gate is not None and not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        if self.fail_with is not None:
            raise self.fail_with
        out = np.stack([sum((_token_vector(t, self.dim) for t in row), np.zeros(self.dim)) for row in ids])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode_ids(self.tokenize(texts))


class FakeIndex:
    """In-memory exact index: an ``index.searcher.IndexLike`` that behaves as ``LiveIndex`` does."""

    kind, nlist = "flat", 0
    lexical = True  # False: lexical and hybrid searches are refused, as by an index without the table

    def __init__(self, dim: int = 8, nprobe: int = 1) -> None:
        self.dim, self.nprobe = dim, nprobe
        self.manifest: dict[str, Any] = {"kind": "index", "dim": dim}
        self.docs: dict[str, tuple[Document, np.ndarray]] = {}
        self.searches: list[dict[str, Any]] = []
        self.closed = False
        self.busy = False  # True: retrain answers as if another one were running
        self.indexed_fields: tuple[str, ...] = ()
        self.int_ids: dict[str, int] = {}  # as the store's: kept by a replaced document, new ones larger
        self._lock = threading.Lock()

    @property
    def ntotal(self) -> int:
        return len(self.docs)

    def _check(self, vectors: np.ndarray) -> None:
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise UserError(f"vectors have shape {vectors.shape}, the index holds {self.dim}-d vectors")

    def search(
        self,
        queries: np.ndarray,
        k: int,
        nprobe: int | None = None,
        where: dict[str, Any] | None = None,
        rescore_k: int | None = None,
    ) -> list[list[Hit]]:
        self._check(queries)
        self.searches.append({"k": k, "nprobe": nprobe, "where": where, "rescore_k": rescore_k})
        node = parse_filter(where)
        with self._lock:
            docs = [(d, v) for d, v in self.docs.values() if matches(node, d.metadata)]
        ranked = (sorted(((float(v @ q), d) for d, v in docs), key=lambda p: -p[0])[:k] for q in queries)
        return [[Hit(d.id, s, d.text, d.metadata) for s, d in hits] for hits in ranked]

    def search_lexical(self, text: str, k: int = 10, where: dict[str, Any] | None = None) -> list[Hit]:
        """The score: how many of the query's words a document holds (BM25 stand-in)."""
        if not self.lexical:
            raise UserError("fake has no lexical index: add it with 'distilembed index lexical fake'")
        self.searches.append({"text": text, "k": k, "where": where})
        words, node = set(text.lower().split()), parse_filter(where)
        with self._lock:
            docs = [d for d, _ in self.docs.values() if matches(node, d.metadata)]
        scored = [(float(len(words & set(d.text.lower().split()))), d) for d in docs]
        ranked = sorted((p for p in scored if p[0] > 0), key=lambda p: (-p[0], p[1].id))[:k]
        return [Hit(d.id, s, d.text, d.metadata) for s, d in ranked]

    search_hybrid = hybrid_by_sides

    def vectors(self, ext_ids: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            return {i: self.docs[i][1] for i in ext_ids if i in self.docs}

    def list_documents(self, after: int = 0, limit: int = 10) -> list[tuple[int, Document]]:
        with self._lock:
            rows = sorted((n, self.docs[i][0]) for i, n in self.int_ids.items() if n > after)
        return rows[:limit]

    def get(self, ext_id: str) -> Document | None:
        with self._lock:
            entry = self.docs.get(ext_id)
        return entry[0] if entry else None

    def count(self, where: dict[str, Any] | None = None) -> int:
        node = parse_filter(where)
        with self._lock:
            return sum(matches(node, d.metadata) for d, _ in self.docs.values())

    def add_field_index(self, field: str) -> bool:
        """Only the names: every filter is exact here, indexed or not."""
        field = join_path(split_path(field))
        created = field not in self.indexed_fields
        self.indexed_fields = tuple(sorted({*self.indexed_fields, field}))
        return created

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray) -> tuple[int, int]:
        self._check(vectors)
        with self._lock:
            replaced = len({d.id for d in docs} & set(self.docs))
            for doc, vector in zip(docs, vectors, strict=True):
                self.docs[doc.id] = (doc, vector)
                self.int_ids.setdefault(doc.id, max(self.int_ids.values(), default=0) + 1)
            return len({d.id for d in docs}) - replaced, replaced

    def delete(self, ext_ids: Sequence[str]) -> list[str]:
        with self._lock:
            gone = [i for i in ext_ids if self.docs.pop(i, None) is not None]
            for ext_id in gone:
                del self.int_ids[ext_id]
            return gone

    def checkpoint(self) -> None:
        return

    def retrain(
        self, nlist: int = 1024, storage: str | None = None, flat_below: int = 10_000, seed: int = 0
    ) -> dict[str, Any]:
        """Exact search stays exact here; only the labels follow the plan ``LiveIndex`` would make."""
        del seed  # LiveIndex's signature
        if self.busy:
            raise BusyError("a retrain is already running")
        before = {"index_type": self.kind, "nlist": self.nlist}
        plan = plan_index(self.ntotal, nlist, flat_below, storage or "float32")
        self.kind, self.nlist = plan.index_type, plan.nlist
        self.manifest |= {"index_type": self.kind, "nlist": self.nlist, "retrained": {"from": before}}
        return self.manifest

    def snapshot(self, out: str | Path) -> dict[str, Any]:
        """The documents as JSON in ``out`` (a new directory), with a manifest like LiveIndex's."""
        if self.busy:
            raise BusyError("a retrain is running")
        out = Path(out)
        out.mkdir(parents=True)
        with self._lock:
            ids = sorted(self.docs)
        size = (out / "ids.json").write_text(json.dumps(ids))  # ASCII: a byte per character
        files = {"ids.json": {"bytes": size}}
        return {"kind": "index_snapshot", "created": "now", "ntotal": len(ids), "files": files}

    def close(self) -> None:
        self.closed = True


if TYPE_CHECKING:  # mypy keeps the fake in step with the interface the service uses
    _fake: type[IndexLike] = FakeIndex
