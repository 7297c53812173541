"""SQLite document store: external string id -> stable int64 id, text and JSON metadata."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    int_id   INTEGER PRIMARY KEY,
    ext_id   TEXT    NOT NULL UNIQUE,
    text     TEXT    NOT NULL,
    metadata TEXT    NOT NULL DEFAULT '{}'
);
"""


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


class DocumentStore:
    """One SQLite file; every write is one transaction, committed before it is acknowledged."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def upsert(self, docs: Sequence[Document]) -> tuple[list[int], list[int]]:
        """Insert or replace by external id; return (int ids in input order, int ids that were replaced).

        A replaced document keeps its int id, so the vector index replaces it in place. Within one
        batch the last occurrence of an id wins.
        """
        last = {doc.id: doc for doc in docs}
        existing = self.int_ids(last)
        replaced = sorted(existing.values())
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for doc in last.values():
                meta = json.dumps(doc.metadata, ensure_ascii=False, sort_keys=True)
                if doc.id in existing:
                    self.db.execute(
                        "UPDATE docs SET text = ?, metadata = ? WHERE ext_id = ?", (doc.text, meta, doc.id)
                    )
                else:
                    cur = self.db.execute(
                        "INSERT INTO docs (ext_id, text, metadata) VALUES (?, ?, ?)", (doc.id, doc.text, meta)
                    )
                    existing[doc.id] = int(cur.lastrowid)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return [existing[doc.id] for doc in docs], replaced

    def _select_in(self, columns: str, key: str, values: Sequence[object]) -> list[tuple]:
        """``SELECT columns FROM docs WHERE key IN values``, in chunks under SQLite's variable limit."""
        rows: list[tuple] = []
        for lo in range(0, len(values), 500):
            chunk = list(values[lo : lo + 500])
            marks = ",".join("?" * len(chunk))
            rows += self.db.execute(f"SELECT {columns} FROM docs WHERE {key} IN ({marks})", chunk).fetchall()
        return rows

    def int_ids(self, ext_ids: Iterable[str]) -> dict[str, int]:
        return {ext: int(i) for ext, i in self._select_in("ext_id, int_id", "ext_id", list(ext_ids))}

    def get(self, ext_id: str) -> Document | None:
        row = self.db.execute(
            "SELECT ext_id, text, metadata FROM docs WHERE ext_id = ?", (ext_id,)
        ).fetchone()
        return Document(row[0], row[1], json.loads(row[2])) if row else None

    def get_many(self, int_ids: Sequence[int]) -> dict[int, Document]:
        rows = self._select_in("int_id, ext_id, text, metadata", "int_id", [int(i) for i in int_ids])
        return {int(r[0]): Document(r[1], r[2], json.loads(r[3])) for r in rows}

    def delete(self, ext_id: str) -> int | None:
        """Remove a document; return its int id (to remove its vector) or None if unknown."""
        row = self.db.execute("DELETE FROM docs WHERE ext_id = ? RETURNING int_id", (ext_id,)).fetchone()
        return int(row[0]) if row else None

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM docs").fetchone()[0])
